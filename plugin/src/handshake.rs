//! go-plugin's handshake line: `CORE|APP|NETWORK|ADDR|PROTOCOL[|CERT[|MUX]]`.

use crate::{APP_PROTOCOL_VERSION, CORE_PROTOCOL_VERSION};

/// Where a plugin (or a broker endpoint) listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Addr {
    /// A Unix socket path.
    Unix(String),
    /// `host:port`.
    Tcp(String),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Unix(p) => write!(f, "unix:{p}"),
            Addr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

impl Addr {
    /// From go-plugin's `network` + `address` pair.
    pub(crate) fn parse(network: &str, address: &str) -> Result<Addr, String> {
        if address.is_empty() {
            return Err("empty address".into());
        }
        match network {
            "unix" => Ok(Addr::Unix(address.to_string())),
            "tcp" => Ok(Addr::Tcp(address.to_string())),
            other => Err(format!("network {other:?} (expected unix or tcp)")),
        }
    }
}

/// A validated handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handshake {
    pub(crate) addr: Addr,
    /// The server certificate (base64 DER) for AutoMTLS, if the plugin sent
    /// one (a 6th field of more than 50 characters, as go-plugin reads it).
    pub(crate) cert: Option<String>,
}

/// Parses and checks one handshake line.
pub(crate) fn parse(line: &str) -> Result<Handshake, String> {
    let line = line.trim_end_matches(['\r', '\n']);
    let parts: Vec<&str> = line.split('|').collect();
    if parts.len() < 4 {
        return Err(format!(
            "{} field(s), expected at least 4 (CORE|APP|NETWORK|ADDR|PROTOCOL)",
            parts.len()
        ));
    }
    let core: u32 = parts[0]
        .parse()
        .map_err(|_| format!("core protocol {:?} is not a number", parts[0]))?;
    if core != CORE_PROTOCOL_VERSION {
        return Err(format!(
            "core protocol {core}, this host speaks {CORE_PROTOCOL_VERSION}"
        ));
    }
    let app: u32 = parts[1]
        .parse()
        .map_err(|_| format!("app protocol {:?} is not a number", parts[1]))?;
    if app != APP_PROTOCOL_VERSION {
        return Err(format!(
            "app protocol {app}, this host speaks {APP_PROTOCOL_VERSION}"
        ));
    }
    let addr = Addr::parse(parts[2], parts[3])?;
    // go-plugin: a missing protocol field means net/rpc (older plugins).
    let protocol = parts.get(4).copied().unwrap_or("netrpc");
    if protocol != "grpc" {
        return Err(format!(
            "protocol {protocol:?}, this host speaks only grpc (no net/rpc)"
        ));
    }
    // go-plugin reads the 6th field as a certificate only when it is longer
    // than 50 characters ("rules out catching the unused extra data
    // returned from some older implementations").
    let cert = parts.get(5).filter(|c| c.len() > 50).map(|c| c.to_string());
    Ok(Handshake { addr, cert })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_lines() {
        let h = parse("1|1|unix|/tmp/p.sock|grpc|\n").expect("parses");
        assert_eq!(h.addr, Addr::Unix("/tmp/p.sock".into()));
        assert_eq!(h.cert, None);
        let h = parse("1|1|tcp|127.0.0.1:1234|grpc").expect("parses");
        assert_eq!(h.addr, Addr::Tcp("127.0.0.1:1234".into()));
        let long = "Q".repeat(51);
        let h = parse(&format!("1|1|tcp|127.0.0.1:1234|grpc|{long}|true")).expect("parses");
        assert_eq!(h.cert.as_deref(), Some(long.as_str()));
        // Up to 50 characters: extra data of older plugins, not a certificate.
        let h = parse("1|1|tcp|127.0.0.1:1234|grpc|QUJD|true").expect("parses");
        assert_eq!(h.cert, None);
    }

    #[test]
    fn bad_lines() {
        for (line, want) in [
            ("hello", "1 field"),
            ("2|1|unix|/x|grpc", "core protocol 2"),
            ("1|5|unix|/x|grpc", "app protocol 5"),
            ("1|1|udp|/x|grpc", "network \"udp\""),
            ("1|1|unix||grpc", "empty address"),
            ("1|1|unix|/x", "netrpc"),
            ("x|1|unix|/x|grpc", "not a number"),
        ] {
            let e = parse(line).expect_err(line);
            assert!(e.contains(want), "{line}: {e}");
        }
    }
}
