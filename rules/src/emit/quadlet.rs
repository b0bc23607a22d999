//! The pod target: a box as a podman quadlet `.container` unit.
//!
//! A pod deploy runs the box's built image; nothing is installed at deploy
//! time, so the unit only says *how to run* the image. That description is
//! target-neutral and lives here as [`RuntimeSpec`] (the kustomize emitter
//! renders the same spec), built from three sources:
//!
//! * the **box** (`port:` `host:container` mappings, `env:`, `security:`,
//!   `network:`, the resolved user);
//! * the **candies in the image** — the box's own plus those its base boxes
//!   installed — for `port:` (published on the same host port unless a box
//!   mapping already targets that container port, or the caller disables
//!   candy ports), `volume:` (`~`/`$HOME` expanded to the box user's home,
//!   de-duplicated by name, own candies first) and `security:` (merged, see
//!   below);
//! * the **merged InstallPlan** compiled for the pod (or k8s) target: its
//!   `service-custom` steps name the init system whose `entrypoint` the
//!   vocabulary gives (`supervisord -n -c /etc/supervisord.conf`), and its
//!   deploy id becomes a label. A box whose image carries exec services only
//!   through a base box gets the same init. Without services the image's
//!   own entrypoint and command run unchanged.
//!
//! **Security merge.** Candies contribute in image order (bases' candies,
//! then the box's own), then the box: lists (`cap_add`, `cap_drop`,
//! `device`/`devices`, `security_opt`, `group_add`, `mount`) are unions;
//! `privileged` is true when anyone asks for it; sizes (`shm_size`,
//! `memory_*`) take the largest; `cgroupns` the first one given. A value the
//! box sets itself replaces the candies' value. Keys charly does not know are
//! carried into [`Security::unmapped`] and written as comments, never dropped
//! silently.
//!
//! **Mapping to quadlet** (keys available since podman 4.7, the oldest
//! quadlet with `ShmSize=`; newer keys are spelled as `PodmanArgs=`):
//!
//! | charly | quadlet |
//! | --- | --- |
//! | image | `Image=` |
//! | box name | `ContainerName=charly-<box>` |
//! | box user uid / gid | `User=` / `Group=` |
//! | box `port:` `H:C[/proto]`, candy `port:` `[proto:]P` | `PublishPort=H:C[/udp]` |
//! | candy `volume:` `{name, path}` | `Volume=charly-<box>-<name>:<path>` |
//! | box `env:` (and caller overrides) | `Environment=K=V`, sorted |
//! | box, version, deploy id, caller labels | `Label=` |
//! | `network:` | `Network=` (with `host` or `none`, ports become comments: podman ignores them) |
//! | `privileged: true` | `PodmanArgs=--privileged` |
//! | `cap_add` / `cap_drop` | `AddCapability=` / `DropCapability=` (`CAP_` prefix dropped) |
//! | `device` | `AddDevice=` |
//! | `security_opt` `unmask=P` / `mask=P` | `Unmask=` / `Mask=` |
//! | `security_opt` `label=disable` / `label=type:T` / `label=level:L` | `SecurityLabelDisable=true` / `SecurityLabelType=` / `SecurityLabelLevel=` |
//! | `security_opt` `seccomp=P` / `no-new-privileges` | `SeccompProfile=` / `NoNewPrivileges=true` |
//! | any other `security_opt` | `PodmanArgs=--security-opt=…` |
//! | `shm_size` | `ShmSize=` |
//! | `cgroupns` | `PodmanArgs=--cgroupns=…` |
//! | `group_add` | `PodmanArgs=--group-add=…` (`GroupAdd=` needs podman 5.1) |
//! | `mount` | `Mount=` |
//! | `memory_max` / `memory_high` / `memory_swap_max` | `PodmanArgs=--memory=` / `--memory-reservation=` / `--memory-swap=` (memory + swap) |
//! | init entrypoint `[a, b…]` | `PodmanArgs=--entrypoint=a` and `Exec=b…` |
//!
//! The entrypoint is split so that it replaces the image's ENTRYPOINT *and*
//! CMD, as a Kubernetes `command:` does (podman resets the image CMD when
//! `--entrypoint` is given); `Entrypoint=` would need podman 5.0.
//!
//! **Escaping.** Quadlet copies values into the service's `ExecStart=`,
//! where systemd expands `%` specifiers and `$VAR`: every value has `%`
//! doubled and `$` doubled, so a value reaches the container literally.
//! Keys that quadlet splits into words (`Environment`, `Label`, `Exec`,
//! `PodmanArgs`, capabilities) get systemd double-quoting where needed;
//! keys taken whole reject control characters. Output is deterministic:
//! sorted keys, fixed section order, no timestamps.

use super::EmitError;
use crate::home::expand_home;
use crate::ir::{InstallPlan, StepData};
use crate::project::{BoxEntry, Project};
use crate::resolve::ResolvedBox;
use crate::source::Span;
use crate::yaml::{Node, Yaml};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Where rootless quadlet units live, relative to the user's home.
pub const USER_UNIT_DIR: &str = ".config/containers/systemd";

/// Transport protocol of a published port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP (the default; also any application protocol such as `http`).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// Lowercase name as podman writes it (`tcp`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// Uppercase name as Kubernetes writes it (`TCP`).
    pub fn k8s(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The transport for a candy port protocol: `udp`, `sctp`, else TCP.
    fn of_candy(proto: &str) -> Protocol {
        match proto {
            "udp" => Protocol::Udp,
            "sctp" => Protocol::Sctp,
            _ => Protocol::Tcp,
        }
    }
}

/// One published port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortMap {
    /// Container port.
    pub container: u16,
    /// Transport.
    pub protocol: Protocol,
    /// Host (pod) or service (k8s) port.
    pub host: u16,
    /// Host address to bind, when the box names one (`127.0.0.1:8080:80`).
    pub host_ip: Option<String>,
}

/// A named volume mounted into the box.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct VolumeMount {
    /// Volume name as the candy declares it.
    pub name: String,
    /// Absolute path inside the box.
    pub path: String,
    /// The candy that declared it.
    pub candy: String,
}

/// The process the container starts when the box runs services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entrypoint {
    /// The init system (`supervisord`).
    pub init: String,
    /// Its argv (`supervisord -n -c /etc/supervisord.conf`).
    pub argv: Vec<String>,
}

/// Runtime security of a box, merged over its candies and the box.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Security {
    /// `privileged: true`.
    pub privileged: bool,
    /// Capabilities added (uppercase, without `CAP_`).
    pub cap_add: BTreeSet<String>,
    /// Capabilities dropped (uppercase, without `CAP_`).
    pub cap_drop: BTreeSet<String>,
    /// Host devices (`/dev/fuse`, `/dev/a:/dev/b:rwm`).
    pub devices: BTreeSet<String>,
    /// `--security-opt` values (`unmask=/proc/*`).
    pub security_opt: BTreeSet<String>,
    /// Supplementary groups.
    pub group_add: BTreeSet<String>,
    /// `--mount` values.
    pub mounts: BTreeSet<String>,
    /// Size of `/dev/shm` as written (`1g`).
    pub shm_size: Option<String>,
    /// Cgroup namespace mode (`host`).
    pub cgroupns: Option<String>,
    /// Hard memory limit as written.
    pub memory_max: Option<String>,
    /// Memory throttling threshold as written.
    pub memory_high: Option<String>,
    /// Swap limit as written (swap only, not memory + swap).
    pub memory_swap_max: Option<String>,
    /// Keys charly does not map: `key` → `value (from)`, sorted.
    pub unmapped: BTreeMap<String, String>,
}

impl Security {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == Security::default()
    }
}

/// Everything needed to run a box's image, independent of the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeSpec {
    /// Qualified box name.
    pub box_name: String,
    /// Box version.
    pub version: String,
    /// The plan's deploy id.
    pub deploy_id: String,
    /// uid the box runs as.
    pub uid: u32,
    /// gid the box runs as.
    pub gid: u32,
    /// Published ports, sorted.
    pub ports: Vec<PortMap>,
    /// Volumes, sorted by name.
    pub volumes: Vec<VolumeMount>,
    /// Box environment, sorted.
    pub env: BTreeMap<String, String>,
    /// Init entrypoint, when the image runs services.
    pub entrypoint: Option<Entrypoint>,
    /// Merged security.
    pub security: Security,
    /// `network:` of the box (`host`).
    pub network: Option<String>,
}

/// Builds the runtime description of a box from the project, the resolved
/// box and its merged plan for the pod or k8s target. `candy_ports` says
/// whether candy ports are published besides the box's own mappings.
pub fn runtime_spec(
    p: &Project,
    b: &ResolvedBox,
    plan: &InstallPlan,
    candy_ports: bool,
) -> Result<RuntimeSpec, EmitError> {
    let err = |message: String| EmitError {
        box_name: b.name.clone(),
        message,
    };
    if plan.box_name != b.name {
        return Err(err(format!(
            "the plan is for box `{}`, not this box",
            plan.box_name
        )));
    }
    if let Some(t) = plan.meta.get("target")
        && !matches!(t.as_str(), "pod" | "k8s" | "oci")
    {
        return Err(err(format!(
            "the plan was compiled for target `{t}`; a container deploy needs a `pod` or `k8s` plan"
        )));
    }
    let entry = box_entry(p, b).ok_or_else(|| err("box definition not found".into()))?;
    let image_candies = image_candies(b);

    // Ports: the box's mappings win for their container port.
    let mut ports: BTreeSet<PortMap> = BTreeSet::new();
    for s in &entry.def.port {
        let pm = parse_box_port(&s.value)
            .map_err(|m| err(format!("{}: port `{}`: {m}", at(p, s.span), s.value)))?;
        ports.insert(pm);
    }
    if candy_ports {
        let mapped: BTreeSet<(u16, Protocol)> =
            ports.iter().map(|m| (m.container, m.protocol)).collect();
        for k in &image_candies {
            for s in &p.candies[*k].def.port {
                let (proto, n) = crate::names::parse_port(&s.value).ok_or_else(|| {
                    err(format!(
                        "{}: candy `{k}` port `{}` is not `N` or `proto:N`",
                        at(p, s.span),
                        s.value
                    ))
                })?;
                let protocol = Protocol::of_candy(&proto);
                if !mapped.contains(&(n, protocol)) {
                    ports.insert(PortMap {
                        container: n,
                        protocol,
                        host: n,
                        host_ip: None,
                    });
                }
            }
        }
    }
    let mut seen_host: BTreeMap<(Option<&str>, u16, Protocol), u16> = BTreeMap::new();
    for m in &ports {
        if let Some(other) =
            seen_host.insert((m.host_ip.as_deref(), m.host, m.protocol), m.container)
        {
            return Err(err(format!(
                "host port {}/{} is published twice (to container ports {other} and {})",
                m.host,
                m.protocol.as_str(),
                m.container
            )));
        }
    }

    // Volumes: first declaration of a name wins, own candies first.
    let mut volumes: BTreeMap<String, VolumeMount> = BTreeMap::new();
    for k in b.candies.iter().chain(b.provided.iter()) {
        for v in &p.candies[k].def.volume {
            if volumes.contains_key(&v.name.value) {
                continue;
            }
            let path = expand_home(&v.path.value, &b.user.home);
            if !path.starts_with('/') {
                return Err(err(format!(
                    "{}: candy `{k}` volume `{}` has path `{}`, which is not absolute",
                    at(p, v.path.span),
                    v.name.value,
                    v.path.value
                )));
            }
            volumes.insert(
                v.name.value.clone(),
                VolumeMount {
                    name: v.name.value.clone(),
                    path,
                    candy: k.clone(),
                },
            );
        }
    }

    let env = match &entry.def.env {
        Some(y) => box_env(&y.0).map_err(|m| err(format!("{}: env: {m}", at(p, y.0.span))))?,
        None => BTreeMap::new(),
    };

    let mut sec = SecurityAcc::default();
    for k in &image_candies {
        if let Some(y) = &p.candies[*k].def.security {
            sec.add(&y.0, &format!("candy {k}"), false)
                .map_err(|m| err(format!("{}: security: {m}", at(p, y.0.span))))?;
        }
    }
    if let Some(y) = &entry.def.security {
        sec.add(&y.0, "box", true)
            .map_err(|m| err(format!("{}: security: {m}", at(p, y.0.span))))?;
    }

    let network = match &entry.def.network {
        Some(Yaml(n)) if n.is_null() => None,
        Some(Yaml(n)) => Some(
            n.as_str()
                .map(str::to_string)
                .ok_or_else(|| err(format!("{}: network must be a string", at(p, n.span))))?,
        ),
        None => None,
    };

    Ok(RuntimeSpec {
        box_name: b.name.clone(),
        version: b.version.clone(),
        deploy_id: plan.deploy_id.clone(),
        uid: b.user.uid,
        gid: b.user.gid,
        ports: ports.into_iter().collect(),
        volumes: volumes.into_values().collect(),
        env,
        entrypoint: entrypoint(p, b, plan),
        security: sec.finish(),
        network,
    })
}

/// The box's registered definition.
fn box_entry<'p>(p: &'p Project, b: &ResolvedBox) -> Option<&'p BoxEntry> {
    let ns = p.namespaces.get(b.ns.0)?;
    ns.boxes.values().find(|e| ns.qualify(&e.name) == b.name)
}

/// Candies whose content is in the image: the bases' first, then the box's own.
fn image_candies(b: &ResolvedBox) -> Vec<&String> {
    let mut out: Vec<&String> = b.provided.iter().collect();
    for k in &b.candies {
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// `file:line:col` of a span.
fn at(p: &Project, s: Span) -> String {
    format!("{}:{}:{}", p.sources.rel(s.file), s.line, s.col)
}

/// Parses a box port: `N`, `H:C`, `IP:H:C` or `[IPv6]:H:C`, each with an
/// optional `/tcp`, `/udp` or `/sctp`.
pub fn parse_box_port(s: &str) -> Result<PortMap, String> {
    let s = s.trim();
    let (rest, protocol) = match s.rsplit_once('/') {
        Some((r, p)) => (
            r,
            match p.to_ascii_lowercase().as_str() {
                "tcp" => Protocol::Tcp,
                "udp" => Protocol::Udp,
                "sctp" => Protocol::Sctp,
                _ => return Err(format!("unknown protocol `{p}` (tcp, udp or sctp)")),
            },
        ),
        None => (s, Protocol::Tcp),
    };
    let (host_ip, rest) = if let Some(r) = rest.strip_prefix('[') {
        let (ip, r) = r
            .split_once("]:")
            .ok_or("an IPv6 host address is written `[addr]:host:container`")?;
        (Some(format!("[{ip}]")), r)
    } else {
        (None, rest)
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let num = |x: &str| -> Result<u16, String> {
        match x.parse::<u16>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("`{x}` is not a port number 1-65535")),
        }
    };
    let (ip, host, container) = match (host_ip, parts.as_slice()) {
        (None, [n]) => (None, num(n)?, num(n)?),
        (ip, [h, c]) => (ip, num(h)?, num(c)?),
        (None, [ip, h, c]) if !ip.is_empty() => (Some(ip.to_string()), num(h)?, num(c)?),
        _ => return Err("expected `host:container`".into()),
    };
    Ok(PortMap {
        container,
        protocol,
        host,
        host_ip: ip,
    })
}

/// Box `env:` as a `K=V` list or a mapping.
fn box_env(n: &Node) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let check = |k: &str| -> Result<(), String> {
        if k.is_empty() || k.contains('=') || k.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            Err(format!("`{k}` is not a variable name"))
        } else {
            Ok(())
        }
    };
    if n.is_null() {
        return Ok(out);
    }
    if let Some(items) = n.as_seq() {
        for it in items {
            let s = it
                .as_str()
                .ok_or_else(|| format!("entries are `K=V` strings, found {}", it.kind_name()))?;
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| format!("`{s}` is not `K=V`"))?;
            check(k)?;
            out.insert(k.to_string(), v.to_string());
        }
    } else if let Some(entries) = n.as_map() {
        for (k, v) in entries {
            let k = k.as_str().ok_or("keys must be strings")?;
            check(k)?;
            let v = if v.is_null() {
                ""
            } else {
                v.as_str()
                    .ok_or_else(|| format!("`{k}` must be a string, found {}", v.kind_name()))?
            };
            out.insert(k.to_string(), v.to_string());
        }
    } else {
        return Err(format!(
            "expected a `K=V` list or a mapping, found {}",
            n.kind_name()
        ));
    }
    Ok(out)
}

/// Parses a podman-style size (`512`, `64k`, `1g`, `1.5GiB`) into bytes.
pub fn parse_size(s: &str) -> Option<u128> {
    let t = s.trim().to_ascii_lowercase();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let mult: u128 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "ki" | "kib" => 1 << 10,
        "m" | "mb" | "mi" | "mib" => 1 << 20,
        "g" | "gb" | "gi" | "gib" => 1 << 30,
        "t" | "tb" | "ti" | "tib" => 1 << 40,
        _ => return None,
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() || frac.contains('.') || frac.len() > 9 {
        return None;
    }
    let int: u128 = int.parse().ok()?;
    let mut bytes = int.checked_mul(mult)?;
    if !frac.is_empty() {
        let f: u128 = frac.parse().ok()?;
        bytes += f * mult / 10u128.pow(frac.len() as u32);
    }
    Some(bytes)
}

/// Bytes in the largest podman unit that divides them exactly (`8g`).
pub fn format_size(bytes: u128) -> String {
    for (suffix, shift) in [("t", 40), ("g", 30), ("m", 20), ("k", 10)] {
        let unit = 1u128 << shift;
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// Accumulates `security:` blocks: candies first, the box last (its
/// scalars replace what the candies merged).
#[derive(Default)]
struct SecurityAcc {
    s: Security,
}

impl SecurityAcc {
    fn add(&mut self, n: &Node, from: &str, is_box: bool) -> Result<(), String> {
        if n.is_null() {
            return Ok(());
        }
        let entries = n
            .as_map()
            .ok_or_else(|| format!("expected a mapping, found {}", n.kind_name()))?;
        for (k, v) in entries {
            let key = k.as_str().unwrap_or_default();
            let list = |v: &Node| -> Result<Vec<String>, String> {
                if v.is_null() {
                    return Ok(Vec::new());
                }
                if let Some(s) = v.as_str() {
                    return Ok(vec![s.to_string()]);
                }
                v.as_seq()
                    .ok_or_else(|| format!("`{key}` must be a list of strings"))?
                    .iter()
                    .map(|i| {
                        i.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| format!("`{key}` must be a list of strings"))
                    })
                    .collect()
            };
            let scalar = |v: &Node| -> Result<String, String> {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("`{key}` must be a scalar"))
            };
            let s = &mut self.s;
            match key {
                "privileged" => {
                    let on = match scalar(v)?.as_str() {
                        "true" | "True" | "TRUE" => true,
                        "false" | "False" | "FALSE" => false,
                        other => {
                            return Err(format!(
                                "`privileged` must be true or false, not `{other}`"
                            ));
                        }
                    };
                    if is_box {
                        s.privileged = on;
                    } else {
                        s.privileged |= on;
                    }
                }
                "cap_add" => s.cap_add.extend(list(v)?.iter().map(|c| cap_name(c))),
                "cap_drop" => s.cap_drop.extend(list(v)?.iter().map(|c| cap_name(c))),
                "device" | "devices" => s.devices.extend(list(v)?),
                "security_opt" => s.security_opt.extend(list(v)?),
                "group_add" => s.group_add.extend(list(v)?),
                "mount" => s.mounts.extend(list(v)?),
                "cgroupns" => {
                    let val = scalar(v)?;
                    if is_box || s.cgroupns.is_none() {
                        s.cgroupns = Some(val);
                    }
                }
                "shm_size" | "memory_max" | "memory_high" | "memory_swap_max" => {
                    let val = scalar(v)?;
                    let bytes = parse_size(&val)
                        .ok_or_else(|| format!("`{key}: {val}` is not a size like 512m or 1g"))?;
                    let slot = match key {
                        "shm_size" => &mut s.shm_size,
                        "memory_max" => &mut s.memory_max,
                        "memory_high" => &mut s.memory_high,
                        _ => &mut s.memory_swap_max,
                    };
                    let larger = slot
                        .as_deref()
                        .and_then(parse_size)
                        .is_none_or(|old| bytes > old);
                    if is_box || larger {
                        *slot = Some(val);
                    }
                }
                other => {
                    let text = v.to_json().to_string();
                    s.unmapped
                        .entry(other.to_string())
                        .and_modify(|e| {
                            let _ = write!(e, "; {text} ({from})");
                        })
                        .or_insert_with(|| format!("{text} ({from})"));
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Security {
        self.s
    }
}

/// `cap_sys_admin` → `SYS_ADMIN`.
fn cap_name(c: &str) -> String {
    let up = c.trim().to_ascii_uppercase();
    up.strip_prefix("CAP_").map(str::to_string).unwrap_or(up)
}

/// The init entrypoint: the init of the plan's generated services, else the
/// fragment-assembly init when a base box's candies carry exec services.
fn entrypoint(p: &Project, b: &ResolvedBox, plan: &InstallPlan) -> Option<Entrypoint> {
    let vocab = &p.ns(b.ns).vocab;
    let from_plan = plan.steps.iter().find_map(|s| match &s.data {
        StepData::ServiceCustom(sc) => vocab
            .init
            .get(&sc.init)
            .filter(|i| !i.entrypoint.is_empty())
            .map(|i| (sc.init.clone(), i.entrypoint.clone())),
        _ => None,
    });
    if let Some((init, argv)) = from_plan {
        return Some(Entrypoint { init, argv });
    }
    let base_exec = b.provided.iter().any(|k| {
        p.candies[k]
            .def
            .service
            .iter()
            .any(|s| s.exec.is_some() && s.applies_to(&b.tags))
    });
    if !base_exec {
        return None;
    }
    vocab
        .init
        .iter()
        .find(|(_, i)| {
            i.model.as_deref() == Some("fragment_assembly")
                && i.requires_capability.is_empty()
                && !i.entrypoint.is_empty()
        })
        .map(|(n, i)| Entrypoint {
            init: n.clone(),
            argv: i.entrypoint.clone(),
        })
}

/// Options for the quadlet emitter.
#[derive(Clone, Debug, Default)]
pub struct QuadletOptions {
    /// Image to run; default `localhost/<box>:<version>`.
    pub image: Option<String>,
    /// Publish only the box's own `port:` mappings, not candy ports.
    pub skip_candy_ports: bool,
    /// Extra environment, overriding the box's `env:`.
    pub env: BTreeMap<String, String>,
    /// Extra labels (e.g. the node key).
    pub labels: BTreeMap<String, String>,
}

/// A rendered quadlet unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuadletUnit {
    /// `charly-<box>.container`.
    pub file_name: String,
    /// The systemd service quadlet generates from it (`charly-<box>.service`).
    pub service: String,
    /// The container's name.
    pub container_name: String,
    /// The unit text.
    pub text: String,
}

/// The container (and unit) name of a box: `charly-<box>`.
pub fn container_name(box_name: &str) -> String {
    format!("charly-{box_name}")
}

/// Renders the quadlet `.container` unit that runs a box as a pod deploy.
/// `plan` is the box's merged plan for target `pod`.
pub fn render_quadlet(
    p: &Project,
    b: &ResolvedBox,
    plan: &InstallPlan,
    opts: &QuadletOptions,
) -> Result<QuadletUnit, EmitError> {
    let spec = runtime_spec(p, b, plan, !opts.skip_candy_ports)?;
    let image = opts
        .image
        .clone()
        .unwrap_or_else(|| crate::naming::image_ref(&b.name, &b.version));
    let name = container_name(&b.name);
    let file_name = format!("{name}.container");
    let err = |m: String| EmitError {
        box_name: b.name.clone(),
        message: m,
    };
    let mut u = Unit::default();
    u.comment(&format!("{file_name} (generated by charly -- do not edit)"));
    u.comment(&format!(
        "box {} {}, deploy {}; install as ~/{USER_UNIT_DIR}/{file_name}",
        spec.box_name, spec.version, spec.deploy_id
    ));
    u.blank();

    u.section("Unit");
    let version = if spec.version.is_empty() {
        String::new()
    } else {
        format!(" {}", spec.version)
    };
    u.raw(
        "Description",
        &format!("charly box {}{version}", spec.box_name).replace('%', "%%"),
    )
    .map_err(&err)?;
    u.blank();

    u.section("Container");
    u.whole("Image", &image).map_err(&err)?;
    u.whole("ContainerName", &name).map_err(&err)?;
    u.whole("User", &spec.uid.to_string()).map_err(&err)?;
    u.whole("Group", &spec.gid.to_string()).map_err(&err)?;
    if let Some(n) = &spec.network {
        u.whole("Network", n).map_err(&err)?;
    }
    for m in &spec.ports {
        let ip = m
            .host_ip
            .as_deref()
            .map(|i| format!("{i}:"))
            .unwrap_or_default();
        let proto = match m.protocol {
            Protocol::Tcp => String::new(),
            other => format!("/{}", other.as_str()),
        };
        let value = format!("{ip}{}:{}{proto}", m.host, m.container);
        match spec.network.as_deref() {
            // Podman discards port mappings in these modes (with a warning).
            Some(mode @ ("host" | "none")) => u.comment(&format!(
                "PublishPort={value} omitted: network {mode} publishes no ports"
            )),
            _ => u.whole("PublishPort", &value).map_err(&err)?,
        }
    }
    for v in &spec.volumes {
        u.whole("Volume", &format!("{name}-{}:{}", v.name, v.path))
            .map_err(&err)?;
    }
    let mut env = spec.env.clone();
    env.extend(opts.env.clone());
    for (k, v) in &env {
        u.words("Environment", &[format!("{k}={v}")]);
    }
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    labels.insert("ai.opencharly.box".into(), spec.box_name.clone());
    labels.insert("ai.opencharly.version".into(), spec.version.clone());
    if !spec.deploy_id.is_empty() {
        labels.insert("ai.opencharly.deploy_id".into(), spec.deploy_id.clone());
    }
    labels.extend(opts.labels.clone());
    for (k, v) in &labels {
        u.words("Label", &[format!("{k}={v}")]);
    }
    security_lines(&mut u, &spec.security).map_err(&err)?;
    if let Some(ep) = &spec.entrypoint {
        u.comment(&format!("init: {}", ep.init));
        if let Some((first, rest)) = ep.argv.split_first() {
            u.words("PodmanArgs", &[format!("--entrypoint={first}")]);
            if !rest.is_empty() {
                u.words("Exec", rest);
            }
        }
    }
    u.blank();

    u.section("Service");
    u.raw("Restart", "always").map_err(&err)?;
    u.blank();

    u.section("Install");
    u.raw("WantedBy", "default.target").map_err(&err)?;

    Ok(QuadletUnit {
        service: format!("{name}.service"),
        file_name,
        container_name: name,
        text: u.out,
    })
}

/// Writes the security keys of the `[Container]` section.
fn security_lines(u: &mut Unit, s: &Security) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    if s.privileged {
        u.words("PodmanArgs", &["--privileged".to_string()]);
    }
    for c in &s.cap_add {
        u.words("AddCapability", std::slice::from_ref(c));
    }
    for c in &s.cap_drop {
        u.words("DropCapability", std::slice::from_ref(c));
    }
    for d in &s.devices {
        u.whole("AddDevice", d)?;
    }
    for o in &s.security_opt {
        let (k, v) = o.split_once('=').unwrap_or((o.as_str(), ""));
        match (k, v) {
            ("unmask", p) if !p.is_empty() => u.words("Unmask", &[p.to_string()]),
            ("mask", p) if !p.is_empty() => u.words("Mask", &[p.to_string()]),
            ("label", "disable") => u.raw("SecurityLabelDisable", "true")?,
            ("label", l) if l.starts_with("type:") => {
                u.whole("SecurityLabelType", &l["type:".len()..])?;
            }
            ("label", l) if l.starts_with("level:") => {
                u.whole("SecurityLabelLevel", &l["level:".len()..])?;
            }
            ("seccomp", p) if !p.is_empty() => u.whole("SeccompProfile", p)?,
            ("no-new-privileges", "" | "true") => u.raw("NoNewPrivileges", "true")?,
            _ => u.words("PodmanArgs", &[format!("--security-opt={o}")]),
        }
    }
    if let Some(shm) = &s.shm_size {
        u.whole("ShmSize", shm)?;
    }
    if let Some(c) = &s.cgroupns {
        u.words("PodmanArgs", &[format!("--cgroupns={c}")]);
    }
    for g in &s.group_add {
        u.words("PodmanArgs", &[format!("--group-add={g}")]);
    }
    for m in &s.mounts {
        u.whole("Mount", m)?;
    }
    if let Some(m) = &s.memory_max {
        u.words("PodmanArgs", &[format!("--memory={m}")]);
    }
    if let Some(m) = &s.memory_high {
        u.words("PodmanArgs", &[format!("--memory-reservation={m}")]);
    }
    if let Some(sw) = &s.memory_swap_max {
        match s.memory_max.as_deref().and_then(parse_size).zip(parse_size(sw)) {
            Some((mem, swap)) => {
                u.words(
                    "PodmanArgs",
                    &[format!("--memory-swap={}", format_size(mem + swap))],
                );
            }
            None => u.comment(&format!(
                "security.memory_swap_max {sw} not applied: podman limits swap only together with memory_max"
            )),
        }
    }
    for (k, v) in &s.unmapped {
        u.comment(&format!("security.{k} is not mapped to quadlet: {v}"));
    }
    Ok(())
}

/// A unit file under construction.
#[derive(Default)]
struct Unit {
    out: String,
}

impl Unit {
    fn section(&mut self, name: &str) {
        let _ = writeln!(self.out, "[{name}]");
    }

    fn blank(&mut self) {
        self.out.push('\n');
    }

    /// A comment line (control characters become spaces).
    fn comment(&mut self, text: &str) {
        let clean: String = text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let _ = writeln!(self.out, "# {clean}");
    }

    /// A value written as is (already escaped).
    fn raw(&mut self, key: &str, value: &str) -> Result<(), String> {
        if value.chars().any(char::is_control) {
            return Err(format!(
                "{key}: control characters cannot be written to a unit: {value:?}"
            ));
        }
        let _ = writeln!(self.out, "{key}={value}");
        Ok(())
    }

    /// A value quadlet takes whole: specifiers and `$` escaped.
    fn whole(&mut self, key: &str, value: &str) -> Result<(), String> {
        self.raw(key, &systemd_escape(value))
    }

    /// A value quadlet splits into words: each word quoted as needed.
    fn words(&mut self, key: &str, words: &[String]) {
        let joined: Vec<String> = words.iter().map(|w| quote_word(w)).collect();
        let _ = writeln!(self.out, "{key}={}", joined.join(" "));
    }
}

/// Doubles `%` (systemd specifiers) and `$` (systemd variable expansion).
fn systemd_escape(s: &str) -> String {
    s.replace('%', "%%").replace('$', "$$")
}

/// One word for a quadlet key that splits its value: systemd double-quoting
/// when the word has whitespace, quotes, backslashes or control characters;
/// `%` and `$` doubled in any case.
pub fn quote_word(w: &str) -> String {
    let plain = !w.is_empty()
        && !w
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '\\'));
    if plain {
        return systemd_escape(w);
    }
    let mut s = String::from("\"");
    for c in w.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            '\r' => s.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(s, "\\x{:02x}", c as u32 & 0xff);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    systemd_escape(&s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_ports_parse() {
        let p = |s: &str| parse_box_port(s).map(|m| (m.host_ip, m.host, m.container, m.protocol));
        assert_eq!(p("8085:8080"), Ok((None, 8085, 8080, Protocol::Tcp)));
        assert_eq!(p("53:53/udp"), Ok((None, 53, 53, Protocol::Udp)));
        assert_eq!(p("8080"), Ok((None, 8080, 8080, Protocol::Tcp)));
        assert_eq!(
            p("127.0.0.1:80:8080/TCP"),
            Ok((Some("127.0.0.1".into()), 80, 8080, Protocol::Tcp))
        );
        assert_eq!(
            p("[::1]:80:8080"),
            Ok((Some("[::1]".into()), 80, 8080, Protocol::Tcp))
        );
        for bad in [
            "0:80",
            "80:70000",
            "a:b",
            "80:80/icmp",
            "",
            "8000-8010:8000-8010",
            "1:2:3:4",
        ] {
            assert!(parse_box_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Some(3 << 29));
        assert_eq!(parse_size("64k"), Some(65536));
        assert_eq!(parse_size("100"), Some(100));
        for bad in ["", "g", "1x", "1.2.3g", "-1g"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        assert_eq!(format_size(8 << 30), "8g");
        assert_eq!(format_size(1536 << 20), "1536m");
        assert_eq!(format_size(1000), "1000");
    }

    #[test]
    fn words_are_quoted_and_escaped_for_systemd() {
        assert_eq!(quote_word("-n"), "-n");
        assert_eq!(quote_word("A=x y"), "\"A=x y\"");
        assert_eq!(quote_word("Q=say \"hi\""), "\"Q=say \\\"hi\\\"\"");
        assert_eq!(quote_word("B=$HOME"), "B=$$HOME");
        assert_eq!(quote_word("C=50%"), "C=50%%");
        assert_eq!(quote_word(""), "\"\"");
        assert_eq!(quote_word("a\\b"), "\"a\\\\b\"");
        assert_eq!(quote_word("l1\nl2"), "\"l1\\nl2\"");
    }

    #[test]
    fn security_merges_candies_then_box() {
        let node = |t: &str| {
            crate::yaml::parse_stream(crate::source::FileId(0), t)
                .expect("yaml")
                .remove(0)
        };
        let mut acc = SecurityAcc::default();
        let a = node(
            "privileged: true\nshm_size: 1g\ncap_add: [cap_sys_admin]\ncgroupns: host\nipc: host\n",
        );
        let b = node(
            "shm_size: 512m\ncap_add: NET_RAW\ndevice: [/dev/fuse]\ncgroupns: private\nipc: shareable\n",
        );
        acc.add(&a, "candy a", false).expect("a");
        acc.add(&b, "candy b", false).expect("b");
        let merged = acc.s.clone();
        assert!(merged.privileged);
        assert_eq!(merged.shm_size.as_deref(), Some("1g"), "largest wins");
        assert_eq!(merged.cgroupns.as_deref(), Some("host"), "first wins");
        assert_eq!(
            merged
                .cap_add
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["NET_RAW", "SYS_ADMIN"]
        );
        assert_eq!(
            merged.unmapped.get("ipc").map(String::as_str),
            Some("\"host\" (candy a); \"shareable\" (candy b)")
        );
        acc.add(&node("privileged: false\nshm_size: 64m\n"), "box", true)
            .expect("box");
        let s = acc.finish();
        assert!(!s.privileged, "the box's own value replaces");
        assert_eq!(s.shm_size.as_deref(), Some("64m"));
        let mut bad = SecurityAcc::default();
        assert!(bad.add(&node("shm_size: lots\n"), "x", false).is_err());
        assert!(bad.add(&node("privileged: maybe\n"), "x", false).is_err());
        assert!(bad.add(&node("cap_add: {a: 1}\n"), "x", false).is_err());
        assert!(bad.add(&node("- a\n"), "x", false).is_err());
    }

    #[test]
    fn env_accepts_list_and_map() {
        let parse = |t: &str| {
            let docs = crate::yaml::parse_stream(crate::source::FileId(0), t).expect("yaml");
            box_env(&docs[0])
        };
        let l = parse("- A=1\n- B=x=y\n- C=\n").expect("list");
        assert_eq!(l.get("B").map(String::as_str), Some("x=y"));
        assert_eq!(l.get("C").map(String::as_str), Some(""));
        let m = parse("A: yes\nB: 0755\nC:\n").expect("map");
        assert_eq!(
            m.get("A").map(String::as_str),
            Some("yes"),
            "text as written"
        );
        assert_eq!(m.get("B").map(String::as_str), Some("0755"));
        assert_eq!(m.get("C").map(String::as_str), Some(""));
        assert!(parse("- NOEQUALS\n").is_err());
        assert!(parse("A: [1]\n").is_err());
        assert!(parse("- \"A B=1\"\n").is_err());
    }
}
