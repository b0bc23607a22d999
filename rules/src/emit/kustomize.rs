//! The k8s target: a box as a kustomize tree (a base and one overlay).
//!
//! The tree renders the same [`RuntimeSpec`] as the quadlet emitter — the
//! box's image, user, ports, volumes, environment, init entrypoint and
//! merged security — as Kubernetes objects:
//!
//! ```text
//! base/kustomization.yaml          resources below
//! base/deployment.yaml             one replica, one container, strategy Recreate
//! base/service.yaml                ClusterIP, when the box publishes ports
//! base/pvc-<volume>.yaml           one PersistentVolumeClaim per volume
//! overlays/<name>/kustomization.yaml   namespace, `images:` pin, labels
//! ```
//!
//! **Names.** Object names are DNS-1123 labels derived from the box name
//! (`cachyos.cachyos` → `charly-cachyos-cachyos`): lowercased, every other
//! character a `-`, runs collapsed, trimmed, and names over 63 characters
//! cut with an 8-hex hash of the original so they stay unique. Port names
//! are `<proto>-<port>` (IANA service names).
//!
//! **Mapping.**
//!
//! | charly | Kubernetes |
//! | --- | --- |
//! | image | `containers[0].image` (the overlay's `images:` entry can re-point it) |
//! | box user uid / gid | pod `securityContext.runAsUser` / `runAsGroup` / `fsGroup` (so volumes are writable) |
//! | init entrypoint | `command:` (full argv; replaces ENTRYPOINT and CMD) |
//! | box `port:` `H:C`, candy ports | `containerPort: C`; Service `port: H`, `targetPort: C` |
//! | candy `volume:` | a PVC `charly-<box>-<name>` (ReadWriteOnce) mounted at the path |
//! | box `env:` | `env:` (sorted; `$(` written `$$(` so kubelet does not expand it) |
//! | `network: host` | `hostNetwork: true` |
//! | `privileged` | container `securityContext.privileged` |
//! | `cap_add` / `cap_drop` | `securityContext.capabilities.add` / `drop` |
//! | `security_opt` `seccomp=unconfined` / `apparmor=unconfined` | `seccompProfile` / `appArmorProfile` `Unconfined` |
//! | `security_opt` `no-new-privileges` | `allowPrivilegeEscalation: false` |
//! | `group_add` (numeric) | pod `securityContext.supplementalGroups` |
//! | `shm_size` | an `emptyDir` (`medium: Memory`, `sizeLimit`) at `/dev/shm` |
//! | `memory_max` | `resources.limits.memory` |
//!
//! Not expressible in a plain Deployment, and listed as comments at the top
//! of `deployment.yaml`: host devices (need a device plugin), `cgroupns`,
//! `mount`, `memory_high`, `memory_swap_max`, other `security_opt` values,
//! named `group_add` groups, a non-host `network:`, host IPs of ports, and
//! unknown security keys.
//!
//! **YAML.** The workspace has no YAML serializer, so this module has a
//! small block-style writer for the subset it needs (maps, lists, strings,
//! integers, booleans, comments). A string is written plain only when it
//! cannot be read as anything but that string under YAML 1.1 *or* 1.2: it
//! starts with a letter, `/` or `_`, holds only letters, digits, `-`, `_`,
//! `.`, `/` and inner spaces, and is not a boolean or null word of either
//! version (`yes`, `No`, `on`, `~`, …). Everything else (numbers-looking
//! text such as `0755`, `1.10` or versions, anything with `:` or `#`, empty
//! strings) is double-quoted with escapes, so every value reads back as
//! exactly the string or number that was meant.

use super::EmitError;
use super::quadlet::{Protocol, RuntimeSpec, Security, container_name, parse_size, runtime_spec};
use crate::ir::InstallPlan;
use crate::project::Project;
use crate::resolve::ResolvedBox;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Options for the kustomize emitter.
#[derive(Clone, Debug, Default)]
pub struct KustomizeOptions {
    /// Image in the base; default `localhost/<box>:<version>`.
    pub image: Option<String>,
    /// Image the overlay pins through `images:`; default the base image.
    pub overlay_image: Option<String>,
    /// Overlay name (a DNS-1123 label); default `default`.
    pub overlay: Option<String>,
    /// Namespace of the overlay (a DNS-1123 label); default `charly`.
    pub namespace: Option<String>,
    /// Publish only the box's own `port:` mappings, not candy ports.
    pub skip_candy_ports: bool,
    /// Extra environment, overriding the box's `env:`.
    pub env: BTreeMap<String, String>,
    /// Extra labels the overlay adds to every object and pod template.
    pub labels: BTreeMap<String, String>,
    /// Requested size of each volume claim; default `10Gi`.
    pub volume_size: Option<String>,
    /// Storage class of the volume claims; default the cluster's.
    pub storage_class: Option<String>,
}

/// A rendered kustomize tree: relative path → file text, sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KustomizeTree {
    /// Files by path relative to the tree's root (`base/deployment.yaml`).
    pub files: BTreeMap<String, String>,
}

/// Renders the kustomize tree that runs a box on Kubernetes. `plan` is the
/// box's merged plan for target `k8s`.
pub fn render_kustomize(
    p: &Project,
    b: &ResolvedBox,
    plan: &InstallPlan,
    opts: &KustomizeOptions,
) -> Result<KustomizeTree, EmitError> {
    let err = |message: String| EmitError {
        box_name: b.name.clone(),
        message,
    };
    let spec = runtime_spec(p, b, plan, !opts.skip_candy_ports)?;
    let image = opts
        .image
        .clone()
        .unwrap_or_else(|| crate::naming::image_ref(&b.name, &b.version));
    let overlay = opts.overlay.clone().unwrap_or_else(|| "default".into());
    let namespace = opts.namespace.clone().unwrap_or_else(|| "charly".into());
    for (what, v) in [("overlay", &overlay), ("namespace", &namespace)] {
        if !is_dns1123_label(v) {
            return Err(err(format!(
                "{what} `{v}` is not a DNS-1123 label (lowercase letters, digits and `-`, at most 63)"
            )));
        }
    }
    let name = dns1123_label(&container_name(&b.name));
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    labels.insert("app.kubernetes.io/name".into(), name.clone());
    labels.insert("app.kubernetes.io/managed-by".into(), "charly".into());
    labels.insert("ai.opencharly.box".into(), label_value(&spec.box_name));
    labels.insert("ai.opencharly.version".into(), label_value(&spec.version));
    let base = Base {
        spec: &spec,
        opts,
        selector: Y::map([("app.kubernetes.io/name", Y::str(&name))]),
        name,
        labels,
    };

    let mut files = BTreeMap::new();
    let mut resources = vec!["deployment.yaml".to_string()];
    let claims = base.volume_claims().map_err(err)?;
    for c in &claims {
        let file = format!("pvc-{}.yaml", c.volume);
        files.insert(format!("base/{file}"), doc(&[header(&file)], &c.object));
        resources.push(file);
    }
    // Notes about what a Deployment cannot say.
    let mut notes: Vec<String> = Vec::new();
    let deployment = base.deployment(&image, &claims, &mut notes).map_err(err)?;
    let mut head = vec![header("deployment.yaml")];
    head.extend(notes);
    files.insert("base/deployment.yaml".into(), doc(&head, &deployment));
    if let Some(service) = base.service() {
        files.insert(
            "base/service.yaml".into(),
            doc(&[header("service.yaml")], &service),
        );
        resources.insert(1, "service.yaml".into());
    }
    let base_k = Y::map([
        ("apiVersion", Y::str("kustomize.config.k8s.io/v1beta1")),
        ("kind", Y::str("Kustomization")),
        (
            "resources",
            Y::Seq(resources.iter().map(|r| Y::str(r)).collect()),
        ),
    ]);
    files.insert(
        "base/kustomization.yaml".into(),
        doc(&[header("base/kustomization.yaml")], &base_k),
    );
    let ov_path = format!("overlays/{overlay}/kustomization.yaml");
    let overlay_k = overlay_kustomization(&image, opts, &overlay, &namespace);
    files.insert(ov_path.clone(), doc(&[header(&ov_path)], &overlay_k));
    Ok(KustomizeTree { files })
}

/// What the base's objects are made from.
struct Base<'a> {
    spec: &'a RuntimeSpec,
    opts: &'a KustomizeOptions,
    /// The objects' name (a DNS-1123 label).
    name: String,
    /// Every object's labels.
    labels: BTreeMap<String, String>,
    /// The Deployment's and the Service's selector.
    selector: Y,
}

/// A volume's claim.
struct Claim {
    /// The pod volume's name.
    volume: String,
    /// The claim's name.
    claim: String,
    /// Where it is mounted.
    path: String,
    /// The PersistentVolumeClaim.
    object: Y,
}

impl Base<'_> {
    fn metadata(&self, obj_name: &str) -> Y {
        Y::map([
            ("name", Y::str(obj_name)),
            ("labels", Y::str_map(&self.labels)),
        ])
    }

    /// One claim per volume, with the volume's name, path and candy as
    /// annotations.
    fn volume_claims(&self) -> Result<Vec<Claim>, String> {
        let volume_size = self.opts.volume_size.as_deref().unwrap_or("10Gi");
        let mut claims = Vec::new();
        let mut used_names: BTreeSet<String> = BTreeSet::new();
        for v in &self.spec.volumes {
            let vol = dns1123_label(&v.name);
            if !used_names.insert(vol.clone()) {
                return Err(format!(
                    "volume names `{}` and another one map to the same Kubernetes name `{vol}`",
                    v.name
                ));
            }
            let claim = dns1123_label(&format!("{}-{}", self.name, v.name));
            let mut spec_entries = vec![
                ("accessModes", Y::Seq(vec![Y::str("ReadWriteOnce")])),
                (
                    "resources",
                    Y::map([("requests", Y::map([("storage", Y::str(volume_size))]))]),
                ),
            ];
            if let Some(sc) = &self.opts.storage_class {
                spec_entries.push(("storageClassName", Y::str(sc)));
            }
            let mut md = self.metadata(&claim);
            md.push(
                "annotations",
                Y::map([
                    ("ai.opencharly.volume", Y::str(&v.name)),
                    ("ai.opencharly.volume.path", Y::str(&v.path)),
                    ("ai.opencharly.volume.candy", Y::str(&v.candy)),
                ]),
            );
            let object = Y::map([
                ("apiVersion", Y::str("v1")),
                ("kind", Y::str("PersistentVolumeClaim")),
                ("metadata", md),
                ("spec", Y::map(spec_entries)),
            ]);
            claims.push(Claim {
                volume: vol,
                claim,
                path: v.path.clone(),
                object,
            });
        }
        Ok(claims)
    }

    /// The Deployment: one replica of the box's container, its claims and
    /// shared memory mounted; what it cannot say goes to `notes`.
    fn deployment(
        &self,
        image: &str,
        claims: &[Claim],
        notes: &mut Vec<String>,
    ) -> Result<Y, String> {
        let spec = self.spec;
        let mut c = self.container(image, notes)?;
        let (mounts, pod_volumes) = self.storage(claims)?;
        if !mounts.is_empty() {
            c.push("volumeMounts", Y::Seq(mounts));
        }
        let pod = self.pod(c, pod_volumes, notes);
        if let Some(ep) = &spec.entrypoint {
            notes.insert(0, format!("init: {}", ep.init));
        }
        let mut tmpl_labels = self.labels.clone();
        if !spec.deploy_id.is_empty() {
            tmpl_labels.insert("ai.opencharly.deploy_id".into(), spec.deploy_id.clone());
        }
        Ok(Y::map([
            ("apiVersion", Y::str("apps/v1")),
            ("kind", Y::str("Deployment")),
            ("metadata", self.metadata(&self.name)),
            (
                "spec",
                Y::map([
                    ("replicas", Y::Int(1)),
                    ("strategy", Y::map([("type", Y::str("Recreate"))])),
                    ("selector", Y::map([("matchLabels", self.selector.clone())])),
                    (
                        "template",
                        Y::map([
                            ("metadata", Y::map([("labels", Y::str_map(&tmpl_labels))])),
                            ("spec", pod),
                        ]),
                    ),
                ]),
            ),
        ]))
    }

    /// The container: image, entrypoint, environment, ports, memory limit
    /// and security context.
    fn container(&self, image: &str, notes: &mut Vec<String>) -> Result<Y, String> {
        let spec = self.spec;
        let cname = dns1123_label(&spec.box_name);
        let mut c = Y::map([("name", Y::str(&cname)), ("image", Y::str(image))]);
        if let Some(ep) = &spec.entrypoint {
            c.push(
                "command",
                Y::Seq(ep.argv.iter().map(|a| Y::str(&kube_literal(a))).collect()),
            );
        }
        let mut env = spec.env.clone();
        env.extend(self.opts.env.clone());
        if !env.is_empty() {
            c.push(
                "env",
                Y::Seq(
                    env.iter()
                        .map(|(k, v)| {
                            Y::map([("name", Y::str(k)), ("value", Y::str(&kube_literal(v)))])
                        })
                        .collect(),
                ),
            );
        }
        let mut cports: BTreeSet<(u16, Protocol)> = BTreeSet::new();
        for m in &spec.ports {
            cports.insert((m.container, m.protocol));
            if let Some(ip) = &m.host_ip {
                notes.push(format!(
                    "port {}:{}:{} binds host address {ip}, which a Service cannot express",
                    ip, m.host, m.container
                ));
            }
        }
        if !cports.is_empty() {
            c.push(
                "ports",
                Y::Seq(
                    cports
                        .iter()
                        .map(|(n, proto)| {
                            Y::map([
                                ("name", Y::str(&port_name(*proto, *n))),
                                ("containerPort", Y::Int(i64::from(*n))),
                                ("protocol", Y::str(proto.k8s())),
                            ])
                        })
                        .collect(),
                ),
            );
        }
        if let Some(m) = &spec.security.memory_max {
            let q = quantity(m).ok_or_else(|| format!("memory_max `{m}` is not a size"))?;
            c.push(
                "resources",
                Y::map([("limits", Y::map([("memory", Y::str(&q))]))]),
            );
        }
        let csec = container_security(&spec.security, notes);
        if !csec.is_empty() {
            c.push("securityContext", csec);
        }
        Ok(c)
    }

    /// The container's mounts and the pod's volumes: the claims, and
    /// `/dev/shm` when the box sizes it.
    fn storage(&self, claims: &[Claim]) -> Result<(Vec<Y>, Vec<Y>), String> {
        let mut mounts: Vec<Y> = Vec::new();
        let mut pod_volumes: Vec<Y> = Vec::new();
        for Claim {
            volume,
            claim,
            path,
            ..
        } in claims
        {
            mounts.push(Y::map([
                ("name", Y::str(volume)),
                ("mountPath", Y::str(path)),
            ]));
            pod_volumes.push(Y::map([
                ("name", Y::str(volume)),
                (
                    "persistentVolumeClaim",
                    Y::map([("claimName", Y::str(claim))]),
                ),
            ]));
        }
        if let Some(shm) = &self.spec.security.shm_size {
            let q = quantity(shm).ok_or_else(|| format!("shm_size `{shm}` is not a size"))?;
            let shm_name = ["dshm", "charly-dshm"]
                .into_iter()
                .find(|n| !claims.iter().any(|c| c.volume == *n))
                .unwrap_or("charly-shm-memory");
            mounts.push(Y::map([
                ("name", Y::str(shm_name)),
                ("mountPath", Y::str("/dev/shm")),
            ]));
            pod_volumes.push(Y::map([
                ("name", Y::str(shm_name)),
                (
                    "emptyDir",
                    Y::map([("medium", Y::str("Memory")), ("sizeLimit", Y::str(&q))]),
                ),
            ]));
        }
        Ok((mounts, pod_volumes))
    }

    /// The pod spec around container `c`: its account, groups, network and
    /// volumes; what it cannot say goes to `notes`.
    fn pod(&self, c: Y, pod_volumes: Vec<Y>, notes: &mut Vec<String>) -> Y {
        let (spec, sec) = (self.spec, &self.spec.security);
        let mut psec = Y::map([
            ("runAsUser", Y::Int(i64::from(spec.uid))),
            ("runAsGroup", Y::Int(i64::from(spec.gid))),
            ("fsGroup", Y::Int(i64::from(spec.gid))),
        ]);
        let numeric: Vec<i64> = sec
            .group_add
            .iter()
            .filter_map(|g| g.parse::<i64>().ok())
            .collect();
        if !numeric.is_empty() {
            psec.push(
                "supplementalGroups",
                Y::Seq(numeric.into_iter().map(Y::Int).collect()),
            );
        }
        for g in sec.group_add.iter().filter(|g| g.parse::<i64>().is_err()) {
            notes.push(format!(
                "group_add `{g}` is a group name; supplementalGroups takes numeric ids"
            ));
        }
        let mut pod = Y::Map(Vec::new());
        match spec.network.as_deref() {
            Some("host") => pod.push("hostNetwork", Y::Bool(true)),
            Some(other) => notes.push(format!("network `{other}` is not mapped")),
            None => {}
        }
        pod.push("securityContext", psec);
        pod.push("containers", Y::Seq(vec![c]));
        if !pod_volumes.is_empty() {
            pod.push("volumes", Y::Seq(pod_volumes));
        }
        unmapped_security(sec, notes);
        pod
    }

    /// A ClusterIP Service for the published ports (none without ports).
    fn service(&self) -> Option<Y> {
        if self.spec.ports.is_empty() {
            return None;
        }
        let mut seen: BTreeSet<(u16, Protocol)> = BTreeSet::new();
        let mut sports = Vec::new();
        for m in &self.spec.ports {
            if !seen.insert((m.host, m.protocol)) {
                continue;
            }
            sports.push(Y::map([
                ("name", Y::str(&port_name(m.protocol, m.host))),
                ("port", Y::Int(i64::from(m.host))),
                ("targetPort", Y::Int(i64::from(m.container))),
                ("protocol", Y::str(m.protocol.k8s())),
            ]));
        }
        Some(Y::map([
            ("apiVersion", Y::str("v1")),
            ("kind", Y::str("Service")),
            ("metadata", self.metadata(&self.name)),
            (
                "spec",
                Y::map([
                    ("type", Y::str("ClusterIP")),
                    ("selector", self.selector.clone()),
                    ("ports", Y::Seq(sports)),
                ]),
            ),
        ]))
    }
}

/// The container's security context: privileges, capabilities, seccomp,
/// AppArmor and privilege escalation; other options go to `notes`.
fn container_security(sec: &Security, notes: &mut Vec<String>) -> Y {
    let mut csec = Y::Map(Vec::new());
    if sec.privileged {
        csec.push("privileged", Y::Bool(true));
    }
    if !sec.cap_add.is_empty() || !sec.cap_drop.is_empty() {
        let mut caps = Y::Map(Vec::new());
        if !sec.cap_add.is_empty() {
            caps.push(
                "add",
                Y::Seq(sec.cap_add.iter().map(|s| Y::str(s)).collect()),
            );
        }
        if !sec.cap_drop.is_empty() {
            caps.push(
                "drop",
                Y::Seq(sec.cap_drop.iter().map(|s| Y::str(s)).collect()),
            );
        }
        csec.push("capabilities", caps);
    }
    for o in &sec.security_opt {
        match o.as_str() {
            "seccomp=unconfined" => {
                csec.push("seccompProfile", Y::map([("type", Y::str("Unconfined"))]));
            }
            "apparmor=unconfined" => {
                csec.push("appArmorProfile", Y::map([("type", Y::str("Unconfined"))]));
            }
            "no-new-privileges" | "no-new-privileges=true" | "no-new-privileges:true"
                if !sec.privileged =>
            {
                csec.push("allowPrivilegeEscalation", Y::Bool(false));
            }
            other => notes.push(format!("security_opt `{other}` is not mapped")),
        }
    }
    csec
}

/// Notes for the security settings a Deployment has no field for.
fn unmapped_security(sec: &Security, notes: &mut Vec<String>) {
    for d in &sec.devices {
        notes.push(format!(
            "device `{d}` is not mapped: Kubernetes passes host devices through device plugins"
        ));
    }
    if let Some(cg) = &sec.cgroupns {
        notes.push(format!("cgroupns `{cg}` is not mapped"));
    }
    for m in &sec.mounts {
        notes.push(format!("mount `{m}` is not mapped"));
    }
    if let Some(m) = &sec.memory_high {
        notes.push(format!("memory_high `{m}` is not mapped"));
    }
    if let Some(m) = &sec.memory_swap_max {
        notes.push(format!("memory_swap_max `{m}` is not mapped"));
    }
    for (k, v) in &sec.unmapped {
        notes.push(format!("security.{k} is not mapped: {v}"));
    }
}

/// The overlay's kustomization: the namespace, the image pinned through
/// `images:`, the overlay's labels on every object and pod template.
fn overlay_kustomization(
    image: &str,
    opts: &KustomizeOptions,
    overlay: &str,
    namespace: &str,
) -> Y {
    let (base_name, _, _) = split_image(image);
    let target = opts.overlay_image.as_deref().unwrap_or(image);
    let (new_name, tag, digest) = split_image(target);
    let mut img = Y::map([("name", Y::str(base_name))]);
    if new_name != base_name {
        img.push("newName", Y::str(new_name));
    }
    match (digest, tag) {
        (Some(d), _) => img.push("digest", Y::str(d)),
        (None, Some(t)) => img.push("newTag", Y::str(t)),
        (None, None) => {}
    }
    let mut ov_labels: BTreeMap<String, String> = BTreeMap::new();
    ov_labels.insert("ai.opencharly.overlay".into(), overlay.to_string());
    ov_labels.extend(opts.labels.iter().map(|(k, v)| (k.clone(), label_value(v))));
    Y::map([
        ("apiVersion", Y::str("kustomize.config.k8s.io/v1beta1")),
        ("kind", Y::str("Kustomization")),
        ("namespace", Y::str(namespace)),
        ("resources", Y::Seq(vec![Y::str("../../base")])),
        ("images", Y::Seq(vec![img])),
        (
            "labels",
            Y::Seq(vec![Y::map([
                ("pairs", Y::str_map(&ov_labels)),
                ("includeTemplates", Y::Bool(true)),
            ])]),
        ),
    ])
}

fn header(file: &str) -> String {
    format!("{file} (generated by charly -- do not edit)")
}

/// `<proto>-<port>`: an IANA service name (at most 15 characters).
fn port_name(proto: Protocol, n: u16) -> String {
    format!("{}-{n}", proto.as_str())
}

/// Text kubelet passes through unchanged: `$(` becomes `$$(`.
fn kube_literal(s: &str) -> String {
    s.replace("$(", "$$(")
}

/// A podman size (`1g`) as a Kubernetes quantity (`1Gi`).
fn quantity(s: &str) -> Option<String> {
    let bytes = parse_size(s)?;
    for (suffix, shift) in [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        let unit = 1u128 << shift;
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return Some(format!("{}{suffix}", bytes / unit));
        }
    }
    Some(bytes.to_string())
}

/// Splits an image reference into (name, tag, digest).
pub fn split_image(r: &str) -> (&str, Option<&str>, Option<&str>) {
    let (rest, digest) = match r.split_once('@') {
        Some((a, d)) => (a, Some(d)),
        None => (r, None),
    };
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[slash..].rfind(':') {
        Some(i) => (&rest[..slash + i], Some(&rest[slash + i + 1..]), digest),
        None => (rest, None, digest),
    }
}

/// Whether `s` is a DNS-1123 label.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Makes a DNS-1123 label of any text (see the module docs).
pub fn dns1123_label(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let trimmed = out.trim_matches('-');
    let mut out = if trimmed.is_empty() {
        "x".to_string()
    } else {
        trimmed.to_string()
    };
    if out.len() > 63 {
        let hash = crate::hex(&Sha256::digest(s.as_bytes()));
        out.truncate(54);
        let keep = out.trim_end_matches('-').len();
        out.truncate(keep);
        out.push('-');
        out.push_str(&hash[..8]);
    }
    out
}

/// A label value: at most 63 characters of `[A-Za-z0-9._-]`, starting and
/// ending alphanumeric (others become `-`).
fn label_value(s: &str) -> String {
    let mut v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if v.len() > 63 {
        let hash = crate::hex(&Sha256::digest(s.as_bytes()));
        v.truncate(54);
        v.push('-');
        v.push_str(&hash[..8]);
    }
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The YAML subset the emitter writes.
#[derive(Clone, Debug, PartialEq)]
enum Y {
    Str(String),
    Int(i64),
    Bool(bool),
    Seq(Vec<Y>),
    Map(Vec<(String, Y)>),
}

impl Y {
    fn str(s: &str) -> Y {
        Y::Str(s.to_string())
    }

    fn map<'k>(entries: impl IntoIterator<Item = (&'k str, Y)>) -> Y {
        Y::Map(
            entries
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    }

    fn str_map(m: &BTreeMap<String, String>) -> Y {
        Y::Map(m.iter().map(|(k, v)| (k.clone(), Y::str(v))).collect())
    }

    fn push(&mut self, k: &str, v: Y) {
        if let Y::Map(m) = self {
            m.push((k.to_string(), v));
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Y::Map(m) => m.is_empty(),
            Y::Seq(s) => s.is_empty(),
            _ => false,
        }
    }
}

/// One YAML document: comment lines, then the value.
fn doc(comments: &[String], y: &Y) -> String {
    let mut out = String::new();
    for c in comments {
        for line in c.lines() {
            let clean: String = line
                .chars()
                .map(|ch| if ch.is_control() { ' ' } else { ch })
                .collect();
            let _ = writeln!(out, "# {clean}");
        }
    }
    write_value(&mut out, y, 0);
    out
}

/// Writes a top-level (or nested block) value at `indent`.
fn write_value(out: &mut String, y: &Y, indent: usize) {
    match y {
        Y::Map(m) if !m.is_empty() => write_map(out, m, indent),
        Y::Seq(s) if !s.is_empty() => write_seq(out, s, indent),
        other => {
            let _ = writeln!(out, "{}{}", " ".repeat(indent), inline(other));
        }
    }
}

fn write_map(out: &mut String, m: &[(String, Y)], indent: usize) {
    let pad = " ".repeat(indent);
    for (k, v) in m {
        let key = scalar(k);
        match v {
            Y::Map(inner) if !inner.is_empty() => {
                let _ = writeln!(out, "{pad}{key}:");
                write_map(out, inner, indent + 2);
            }
            Y::Seq(items) if !items.is_empty() => {
                let _ = writeln!(out, "{pad}{key}:");
                write_seq(out, items, indent + 2);
            }
            other => {
                let _ = writeln!(out, "{pad}{key}: {}", inline(other));
            }
        }
    }
}

fn write_seq(out: &mut String, items: &[Y], indent: usize) {
    let pad = " ".repeat(indent);
    for it in items {
        match it {
            Y::Map(_) | Y::Seq(_) if !it.is_empty() => {
                // Render the item two deeper, then put the dash on its first line.
                let mut inner = String::new();
                write_value(&mut inner, it, indent + 2);
                let rest = &inner[indent + 2..];
                let _ = write!(out, "{pad}- {rest}");
            }
            other => {
                let _ = writeln!(out, "{pad}- {}", inline(other));
            }
        }
    }
}

/// A value on one line: scalars, `[]` and `{}`.
fn inline(y: &Y) -> String {
    match y {
        Y::Str(s) => scalar(s),
        Y::Int(i) => i.to_string(),
        Y::Bool(b) => b.to_string(),
        Y::Seq(_) => "[]".into(),
        Y::Map(_) => "{}".into(),
    }
}

/// Words that YAML 1.1 or 1.2 reads as booleans or null.
const KEYWORDS: [&str; 10] = [
    "y", "n", "yes", "no", "true", "false", "on", "off", "null", "~",
];

/// Whether a string may be written plain (see the module docs).
fn plain_ok(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if !(first.is_ascii_alphabetic() || first == '/' || first == '_') {
        return false;
    }
    if s.ends_with(' ') {
        return false;
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ' '))
    {
        return false;
    }
    !KEYWORDS.contains(&s.to_ascii_lowercase().as_str())
}

/// A string as a YAML scalar: plain when safe, else double-quoted.
fn scalar(s: &str) -> String {
    if plain_ok(s) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control()
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
                ) =>
            {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileId;
    use crate::yaml::{Node, Style, Value, parse_stream};
    use proptest::prelude::*;

    fn parse_one(text: &str) -> Node {
        let mut docs = parse_stream(FileId(0), text).unwrap_or_else(|d| panic!("{text}\n{d:?}"));
        assert_eq!(docs.len(), 1, "{text}");
        docs.remove(0)
    }

    /// The string a scalar reads back as, and whether it was quoted.
    fn read_back(s: &str) -> (String, Style) {
        let text = doc(&[], &Y::map([("k", Y::str(s))]));
        let n = parse_one(&text);
        match &n.get("k").unwrap_or_else(|| panic!("{text}")).value {
            Value::Scalar(v, style) => (v.clone(), *style),
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn ambiguous_scalars_are_quoted() {
        for s in [
            "yes",
            "No",
            "ON",
            "off",
            "y",
            "N",
            "true",
            "False",
            "null",
            "~",
            "",
            "0755",
            "1.10",
            "10",
            "-1",
            "+1",
            "1e3",
            ".5",
            ".inf",
            ".NaN",
            "0x1F",
            "0o17",
            "1_000",
            "12:30:00",
            "2001-12-14",
            "a: b",
            "a #b",
            "#c",
            ":x",
            "- x",
            "-n",
            "[a]",
            "{a}",
            "*a",
            "&a",
            "!a",
            "|",
            ">",
            "'q'",
            "\"q\"",
            "%x",
            "@x",
            "`x",
            " lead",
            "trail ",
            "a\nb",
            "tab\t",
            "=",
            "<<",
            "a,b",
            "a?",
            "ünï",
            "\u{2028}",
            "\u{85}",
            "x\u{0}y",
            "1:20",
        ] {
            let (back, style) = read_back(s);
            assert_eq!(back, s, "round trip of {s:?}");
            assert_eq!(style, Style::Quoted, "{s:?} must be quoted");
        }
    }

    #[test]
    fn plain_scalars_stay_plain() {
        for s in [
            "apps/v1",
            "Deployment",
            "supervisord",
            "/etc/supervisord.conf",
            "charly-jupyter",
            "app.kubernetes.io/name",
            "ReadWriteOnce",
            "hello world",
            "_x",
            "yesterday",
            "nope",
        ] {
            assert_eq!(read_back(s), (s.to_string(), Style::Plain), "{s:?}");
        }
    }

    #[test]
    fn nested_structures_render_as_block_yaml() {
        let y = Y::map([
            ("a", Y::Int(1)),
            ("b", Y::Seq(vec![Y::str("x"), Y::Int(2), Y::Bool(false)])),
            (
                "c",
                Y::Seq(vec![
                    Y::map([("id", Y::str("k")), ("v", Y::str("0755"))]),
                    Y::map([("n", Y::str("e")), ("v", Y::Map(vec![]))]),
                ]),
            ),
            ("d", Y::Seq(vec![])),
            ("e", Y::Map(vec![])),
            (
                "f",
                Y::Seq(vec![Y::Seq(vec![Y::Int(1), Y::Int(2)]), Y::str("z")]),
            ),
        ]);
        let text = doc(&["head".into()], &y);
        assert_eq!(
            text,
            "# head\na: 1\nb:\n  - x\n  - 2\n  - false\nc:\n  - id: k\n    v: \"0755\"\n  - \"n\": e\n    v: {}\nd: []\ne: {}\nf:\n  - - 1\n    - 2\n  - z\n"
        );
        let n = parse_one(&text);
        assert_eq!(
            n.to_json(),
            serde_json::json!({"a": 1, "b": ["x", 2, false],
                "c": [{"id": "k", "v": "0755"}, {"n": "e", "v": {}}], "d": [], "e": {},
                "f": [[1, 2], "z"]})
        );
    }

    #[test]
    fn dns_labels() {
        assert_eq!(dns1123_label("cachyos.cachyos"), "cachyos-cachyos");
        assert_eq!(dns1123_label("charly-Foo_Bar..x"), "charly-foo-bar-x");
        assert_eq!(dns1123_label("--"), "x");
        let long = "a".repeat(80);
        let l = dns1123_label(&long);
        assert_eq!(l.len(), 63);
        assert!(is_dns1123_label(&l));
        assert_ne!(
            l,
            dns1123_label(&"a".repeat(81)),
            "hash keeps long names apart"
        );
        assert!(!is_dns1123_label("a.b") && !is_dns1123_label("-a") && !is_dns1123_label(""));
    }

    #[test]
    fn images_split() {
        assert_eq!(
            split_image("localhost/jupyter:2026.1"),
            ("localhost/jupyter", Some("2026.1"), None)
        );
        assert_eq!(
            split_image("registry:5000/a/b"),
            ("registry:5000/a/b", None, None)
        );
        assert_eq!(
            split_image("r:5000/a@sha256:ab"),
            ("r:5000/a", None, Some("sha256:ab"))
        );
        assert_eq!(quantity("1g").as_deref(), Some("1Gi"));
        assert_eq!(quantity("1.5g").as_deref(), Some("1536Mi"));
        assert_eq!(quantity("100").as_deref(), Some("100"));
    }

    proptest! {
        #[test]
        fn any_string_round_trips(s in "\\PC{0,24}|[ -~]{0,24}|[0-9.:eE+-]{1,8}") {
            let (back, _) = read_back(&s);
            prop_assert_eq!(back, s);
        }

        #[test]
        fn plain_output_is_never_a_number_bool_or_null(s in "[A-Za-z0-9_./ -]{1,12}") {
            let (back, style) = read_back(&s);
            prop_assert_eq!(&back, &s);
            if style == Style::Plain {
                let j = crate::yaml::node::plain_scalar_json(&s);
                prop_assert!(j.is_string(), "{:?} reads as {:?}", s, j);
                prop_assert!(!KEYWORDS.contains(&s.to_ascii_lowercase().as_str()));
                prop_assert!(s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '/' || c == '_'));
            }
        }
    }
}
