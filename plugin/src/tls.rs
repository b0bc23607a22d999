//! TLS for go-plugin's AutoMTLS, and the certificate checks behind it.
//!
//! go-plugin (client.go, server.go, mtls.go): with AutoMTLS the host makes a
//! throwaway self-signed certificate and passes its PEM in
//! `PLUGIN_CLIENT_CERT`; a plugin that supports it makes its own and
//! answers with a 6th handshake field, that certificate's DER in base64
//! without padding (Go's `RawStdEncoding`). Then every connection is mutual
//! TLS with `ServerName` "localhost", each side trusting exactly the other's
//! certificate: the host's connection to the plugin, and the broker
//! connections both ways (the host serves `ExecutorService` with its own
//! certificate and asks the plugin for the plugin's).
//!
//! Both certificates are go-plugin's shape: CN and DNS name `localhost`, a
//! CA (`IsCA`), key usages digital signature, key encipherment, key
//! agreement and cert signing, extended key usages client and server auth.
//! Go makes them on ECDSA P-521, which rustls' ring provider cannot verify;
//! this host adds an ECDSA P-521/SHA-512 verifier (RustCrypto's `p521`) to
//! ring's algorithms, so the peer's certificate may be ECDSA P-256, P-384 or
//! P-521, Ed25519 or RSA. Anything else (another curve, Ed448, DSA) is
//! refused before connecting, naming the key. The host's own certificate
//! is ECDSA P-256 (ring signs it; Go verifies it).
//!
//! Trust is pinning: the peer must present exactly the certificate it
//! announced (the handshake line, or `PLUGIN_CLIENT_CERT`), byte for byte,
//! and prove it holds the key (the TLS signature, checked with the
//! algorithms above). Names and dates are not checked beyond that: the
//! certificate came over the plugin's own stdout or environment.

use std::sync::{Arc, OnceLock};

use base64::Engine;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{
    AlgorithmIdentifier, CertificateDer, InvalidSignature, PrivateKeyDer, PrivatePkcs8KeyDer,
    ServerName, SignatureVerificationAlgorithm, UnixTime, alg_id,
};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// The crypto provider of every TLS connection here (ring, as the rest of
/// the workspace).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// ECDSA on P-521 with SHA-512, verified with RustCrypto's `p521` (ring has
/// no P-521).
#[derive(Debug)]
struct EcdsaP521Sha512;

impl SignatureVerificationAlgorithm for EcdsaP521Sha512 {
    fn verify_signature(
        &self,
        public_key: &[u8],
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), InvalidSignature> {
        use p521::ecdsa::signature::Verifier;
        let key =
            p521::ecdsa::VerifyingKey::from_sec1_bytes(public_key).map_err(|_| InvalidSignature)?;
        let sig = p521::ecdsa::Signature::from_der(signature).map_err(|_| InvalidSignature)?;
        key.verify(message, &sig).map_err(|_| InvalidSignature)
    }

    fn public_key_alg_id(&self) -> AlgorithmIdentifier {
        alg_id::ECDSA_P521
    }

    fn signature_alg_id(&self) -> AlgorithmIdentifier {
        alg_id::ECDSA_SHA512
    }
}

static P521_SHA512: EcdsaP521Sha512 = EcdsaP521Sha512;
static P521_ALGS: &[&dyn SignatureVerificationAlgorithm] = &[&P521_SHA512];

/// ring's signature algorithms plus ECDSA P-521/SHA-512.
pub(crate) fn algorithms() -> WebPkiSupportedAlgorithms {
    static A: OnceLock<WebPkiSupportedAlgorithms> = OnceLock::new();
    *A.get_or_init(|| {
        let base = provider().signature_verification_algorithms;
        let mut all = base.all.to_vec();
        all.push(&P521_SHA512);
        let mut mapping = base.mapping.to_vec();
        mapping.push((SignatureScheme::ECDSA_NISTP521_SHA512, P521_ALGS));
        // Built once per process and kept: rustls wants 'static tables.
        WebPkiSupportedAlgorithms {
            all: Vec::leak(all),
            mapping: Vec::leak(mapping),
        }
    })
}

/// This side's certificate and key.
#[derive(Clone)]
pub(crate) struct Identity {
    pub(crate) cert: CertificateDer<'static>,
    key: Arc<PrivatePkcs8KeyDer<'static>>,
    /// The certificate as PEM (what `PLUGIN_CLIENT_CERT` carries).
    pub(crate) pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

/// The curves this crate makes certificates on (ring signs them). The
/// host uses P-256; the plugin kit (`serve`) offers both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "serve"), allow(dead_code))]
pub enum Curve {
    /// ECDSA P-256 with SHA-256 (the default).
    P256,
    /// ECDSA P-384 with SHA-384.
    P384,
}

impl Identity {
    /// A fresh self-signed certificate of go-plugin's shape on `curve`.
    pub(crate) fn generate(curve: Curve) -> Result<Identity, String> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let alg = match curve {
            Curve::P256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Curve::P384 => &rcgen::PKCS_ECDSA_P384_SHA384,
        };
        let key = KeyPair::generate_for(alg).map_err(|e| format!("key: {e}"))?;
        let mut params = CertificateParams::new(vec!["localhost".to_string()])
            .map_err(|e| format!("certificate: {e}"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "charly");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyAgreement,
            KeyUsagePurpose::KeyCertSign,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ClientAuth,
            ExtendedKeyUsagePurpose::ServerAuth,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("certificate: {e}"))?;
        Ok(Identity {
            pem: cert.pem(),
            cert: cert.der().clone(),
            key: Arc::new(PrivatePkcs8KeyDer::from(key.serialize_der())),
        })
    }

    /// The handshake's 6th field for this certificate: DER, base64 without
    /// padding.
    #[cfg(test)]
    pub(crate) fn handshake_field(&self) -> String {
        handshake_field(self.cert.as_ref())
    }

    /// The certificate with its key, for rustls.
    pub(crate) fn certified_key(&self) -> Result<CertifiedKey, String> {
        CertifiedKey::from_der(
            vec![self.cert.clone()],
            PrivateKeyDer::Pkcs8(self.key.as_ref().clone_key()),
            &provider(),
        )
        .map_err(|e| e.to_string())
    }
}

/// The handshake's 6th field for a certificate: its DER in base64 without
/// padding (Go's `RawStdEncoding`). The plugin side's.
#[cfg_attr(not(feature = "serve"), allow(dead_code))]
pub(crate) fn handshake_field(cert: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(cert)
}

/// The key of a certificate, named for messages, and whether this host can
/// verify its signatures.
fn key_kind(cert: &[u8]) -> Result<(String, bool), String> {
    let spki_alg = der::spki_algorithm(cert).ok_or("not an X.509 certificate (DER)")?;
    let algs = algorithms();
    let supported = algs
        .all
        .iter()
        .any(|a| a.public_key_alg_id().as_ref() == spki_alg);
    Ok((der::describe_key(spki_alg), supported))
}

/// Reads the 6th handshake field: a certificate in base64 (go-plugin sends
/// it without padding; padding is accepted too) whose key this host can
/// verify.
pub(crate) fn parse_handshake_cert(field: &str) -> Result<CertificateDer<'static>, String> {
    let b64 = base64::engine::general_purpose::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let bytes = b64
        .decode(field.trim())
        .map_err(|e| format!("not base64: {e}"))?;
    check_cert(&bytes)?;
    Ok(CertificateDer::from(bytes))
}

/// Reads `PLUGIN_CLIENT_CERT`: one PEM certificate whose key this side can
/// verify. The plugin side's.
#[cfg_attr(not(feature = "serve"), allow(dead_code))]
pub(crate) fn parse_pem_cert(pem: &str) -> Result<CertificateDer<'static>, String> {
    use rustls::pki_types::pem::PemObject;
    let cert = CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| format!("no PEM certificate: {e}"))?;
    check_cert(cert.as_ref())?;
    Ok(cert)
}

fn check_cert(der: &[u8]) -> Result<(), String> {
    let (kind, supported) = key_kind(der)?;
    if !supported {
        return Err(format!(
            "its key is {kind}, which this host cannot verify (it verifies ECDSA P-256, P-384 and P-521, Ed25519 and RSA)"
        ));
    }
    Ok(())
}

/// The handshake-signature half of a certificate verifier, alike for every
/// verifier here: checked with the provider's algorithms (`self.algs`).
macro_rules! handshake_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algs.supported_schemes()
        }
    };
}

/// Trusts exactly one certificate, as server (host → plugin) or as client
/// (a broker connection's peer).
#[derive(Debug)]
pub(crate) struct Pinned {
    cert: CertificateDer<'static>,
    algs: WebPkiSupportedAlgorithms,
}

impl Pinned {
    pub(crate) fn new(cert: CertificateDer<'static>) -> Arc<Pinned> {
        Arc::new(Pinned {
            cert,
            algs: algorithms(),
        })
    }

    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<(), rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() && intermediates.is_empty() {
            Ok(())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity, intermediates)
            .map(|()| ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

impl ClientCertVerifier for Pinned {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity, intermediates)
            .map(|()| ClientCertVerified::assertion())
    }

    handshake_signatures!();
}

/// Accepts any server certificate (still checking the handshake signature):
/// `HTTPDo` with `allow_insecure`.
#[derive(Debug)]
pub(crate) struct AnyServerCert {
    algs: WebPkiSupportedAlgorithms,
}

impl AnyServerCert {
    pub(crate) fn new() -> Arc<AnyServerCert> {
        Arc::new(AnyServerCert { algs: algorithms() })
    }
}

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

/// gRPC over TLS needs ALPN `h2` (grpc-go enforces it).
const ALPN_H2: &[u8] = b"h2";

/// The dialing side of a mutual-TLS connection: presents `me`, trusts
/// exactly `peer`.
pub(crate) fn client_config(
    me: &CertifiedKey,
    peer: &CertificateDer<'static>,
) -> Result<rustls::ClientConfig, String> {
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Pinned::new(peer.clone()))
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(me.clone())));
    c.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(c)
}

/// The accepting side: presents `me`, requires exactly `peer`.
pub(crate) fn server_config(
    me: &CertifiedKey,
    peer: &CertificateDer<'static>,
) -> Result<rustls::ServerConfig, String> {
    let mut s = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(Pinned::new(peer.clone()))
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(me.clone())));
    s.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(s)
}

/// The name both sides use (go-plugin's `ServerName: "localhost"`).
pub(crate) fn server_name() -> ServerName<'static> {
    ServerName::DnsName(
        rustls::pki_types::DnsName::try_from("localhost")
            .unwrap_or_else(|_| unreachable!("a valid DNS name")),
    )
}

/// Just enough DER to find a certificate's key algorithm.
mod der {
    /// One TLV: (tag, contents, rest).
    fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        let (&first, mut rest) = rest.split_first()?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let mut len = 0usize;
            for &b in &rest[..n] {
                len = (len << 8) | usize::from(b);
            }
            rest = &rest[n..];
            len
        };
        if rest.len() < len {
            return None;
        }
        Some((tag, &rest[..len], &rest[len..]))
    }

    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;

    /// The contents of the certificate's SubjectPublicKeyInfo
    /// AlgorithmIdentifier (as `rustls::pki_types::alg_id` spells them).
    pub(super) fn spki_algorithm(cert: &[u8]) -> Option<&[u8]> {
        let (tag, certificate, _) = tlv(cert)?;
        if tag != SEQUENCE {
            return None;
        }
        let (tag, tbs, _) = tlv(certificate)?;
        if tag != SEQUENCE {
            return None;
        }
        let mut rest = tbs;
        // [0] version (optional), serial, signature, issuer, validity,
        // subject, then subjectPublicKeyInfo.
        let (tag, _, r) = tlv(rest)?;
        rest = if tag == 0xa0 { tlv(r)?.2 } else { r };
        for _ in 0..4 {
            rest = tlv(rest)?.2;
        }
        let (tag, spki, _) = tlv(rest)?;
        if tag != SEQUENCE {
            return None;
        }
        let (tag, alg, _) = tlv(spki)?;
        (tag == SEQUENCE).then_some(alg)
    }

    /// Dotted text of an OID's contents.
    fn oid_text(oid: &[u8]) -> String {
        let mut parts: Vec<u64> = Vec::new();
        let mut v: u64 = 0;
        for &b in oid {
            v = (v << 7) | u64::from(b & 0x7f);
            if b & 0x80 == 0 {
                if parts.is_empty() {
                    let first = (v / 40).min(2);
                    parts.push(first);
                    parts.push(v - first * 40);
                } else {
                    parts.push(v);
                }
                v = 0;
            }
        }
        parts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(".")
    }

    fn oid_name(dotted: &str) -> Option<&'static str> {
        Some(match dotted {
            "1.2.840.10045.2.1" => "ECDSA",
            "1.2.840.10045.3.1.7" => "P-256",
            "1.3.132.0.34" => "P-384",
            "1.3.132.0.35" => "P-521",
            "1.3.132.0.33" => "P-224",
            "1.2.840.10045.3.1.1" => "P-192",
            "1.3.132.0.10" => "secp256k1",
            "1.3.36.3.3.2.8.1.1.7" => "brainpoolP256r1",
            "1.3.36.3.3.2.8.1.1.11" => "brainpoolP384r1",
            "1.3.36.3.3.2.8.1.1.13" => "brainpoolP512r1",
            "1.3.101.112" => "Ed25519",
            "1.3.101.113" => "Ed448",
            "1.3.101.110" => "X25519",
            "1.3.101.111" => "X448",
            "1.2.840.113549.1.1.1" => "RSA",
            "1.2.840.113549.1.1.10" => "RSA-PSS",
            "1.2.840.10040.4.1" => "DSA",
            _ => return None,
        })
    }

    fn named(contents: &[u8]) -> String {
        let dotted = oid_text(contents);
        match oid_name(&dotted) {
            Some(n) => format!("{n} ({dotted})"),
            None => dotted,
        }
    }

    /// `ECDSA on secp256k1 (1.3.132.0.10)`, `Ed448 (1.3.101.113)`, …
    pub(super) fn describe_key(alg: &[u8]) -> String {
        let Some((OID, key_oid, params)) = tlv(alg) else {
            return "an unreadable key algorithm".into();
        };
        let key = named(key_oid);
        match tlv(params) {
            Some((OID, curve, _)) if oid_text(key_oid) == "1.2.840.10045.2.1" => {
                format!("ECDSA on curve {}", named(curve))
            }
            _ => key,
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn oids_read_as_text() {
            assert_eq!(
                oid_text(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07]),
                "1.2.840.10045.3.1.7"
            );
            assert_eq!(oid_text(&[0x2b, 0x81, 0x04, 0x00, 0x23]), "1.3.132.0.35");
            assert_eq!(
                describe_key(rustls::pki_types::alg_id::ECDSA_P521.as_ref()),
                "ECDSA on curve P-521 (1.3.132.0.35)"
            );
            assert_eq!(
                describe_key(rustls::pki_types::alg_id::ED25519.as_ref()),
                "Ed25519 (1.3.101.112)"
            );
            assert_eq!(describe_key(b"\x01"), "an unreadable key algorithm");
            assert_eq!(spki_algorithm(b"\x30\x00"), None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_identity_reads_back_and_is_verifiable() {
        for curve in [Curve::P256, Curve::P384] {
            let id = Identity::generate(curve).expect("generates");
            let back = parse_handshake_cert(&id.handshake_field()).expect("reads back");
            assert_eq!(back.as_ref(), id.cert.as_ref());
            assert!(!id.handshake_field().ends_with('='));
            let pem = parse_pem_cert(&id.pem).expect("PEM reads back");
            assert_eq!(pem.as_ref(), id.cert.as_ref());
            let (kind, ok) = key_kind(id.cert.as_ref()).expect("a certificate");
            assert!(ok, "{kind}");
            let want = match curve {
                Curve::P256 => "P-256",
                Curve::P384 => "P-384",
            };
            assert!(kind.contains(want), "{kind}");
        }
        let e = parse_handshake_cert("!!!").expect_err("not base64");
        assert!(e.contains("not base64"), "{e}");
        let e = parse_handshake_cert("QUJDREVG").expect_err("not a cert");
        assert!(e.contains("not an X.509 certificate"), "{e}");
    }
}
