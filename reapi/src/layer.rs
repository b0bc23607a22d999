//! A box layer as one REAPI action (see `docs/remote-layers.md`).
//!
//! A layer is a one-stage Containerfile on its parent image (`ARG PARENT`,
//! `FROM ${PARENT}`, candy layer stages, then `USER`, `ENV`, `COPY`, `RUN`,
//! `EXPOSE`, `LABEL`). Sent to an engine:
//!
//! * **input root**: the parent's root filesystem, applied from its layer
//!   blobs ([`LayeredRoot`]: no image runtime needed), the `COPY` and bind
//!   sources under [`crate::stage::CTX_DIR`], and under [`META_DIR`] one
//!   file per permission mode listing the parent's paths with that mode
//!   (REAPI trees carry only the executable bit, and engines stage
//!   directories and files with their own modes);
//! * **command**: `/bin/sh -c` of a script that first gives the parent's
//!   paths their modes (and, under fakeroot, owners) back, then performs
//!   the steps as a builder stage's script does
//!   ([`crate::stage::steps_script`], recording owners instead of the
//!   stage's shims), then writes what charly cannot see in a tree under
//!   [`crate::stage::OUT_DIR`]: the final value of every `ENV` the layer
//!   sets, its working directory, the owners it recorded, and the mode and
//!   owner of every path (`find -xdev` and `stat`, so busybox images work
//!   too);
//! * **output**: the whole root (the output directory `.`), captured by
//!   the engine as one Tree. charly compares it with the input it sent
//!   ([`diff`]) and downloads only what changed.
//!
//! The layer is then written by charly ([`write_layer`]) in one canonical
//! form: entries sorted by path, every changed path's parent directories
//! before it, times zero, numeric owners (below), whiteouts (`.wh.<name>`) for what the steps
//! deleted, gzip. The configuration after the layer is the parent's with
//! the layer's `ENV`, `USER`, `WORKDIR`, `EXPOSE`, `LABEL`, `CMD` and
//! `ENTRYPOINT` applied
//! ([`config_after`]).
//!
//! Owners: the action runs as root in a sandbox that maps one id
//! (buildbox-run with bubblewrap), so no file can be given to another user
//! there (`chown(2)` fails with `EINVAL`). In an image with a glibc loader,
//! every step runs under fakeroot ([`Fakeroot`], this machine's `faked`
//! and `libfakeroot` sent in the input root): the owners a package
//! manager, `useradd` or a `chown` gives are kept by its daemon and
//! reported by `stat` at the end, and the parent's owners are told to it
//! first. Besides, the owners a layer's own instructions give are recorded
//! and applied when charly writes the layer: `COPY --chown` (the script
//! lists what it copied with the resolved ids) and `ADD` of a builder
//! artifact (charly reads the archive's owners); a `RUN` as another user
//! runs as the sandbox's user with that user's `HOME` and environment, and
//! every path it creates is recorded as that user's (the image's paths
//! listed before and after it). Otherwise paths the parent had keep the
//! parent's owner and new ones are root's. Without fakeroot (a static or
//! musl image, or none on this machine) a `chown` to another user in a
//! `RUN` fails the step, except where the program ignores the failure:
//! such an owner is lost (docs/remote-layers.md). Image settings a remote
//! layer cannot carry yet (`VOLUME`, `STOPSIGNAL`, `HEALTHCHECK`) are
//! refused before anything is sent, naming them ([`check`]). Paths the
//! sandbox mounts itself ([`SANDBOX_PATHS`]: `/dev`, `/proc`, `/sys`,
//! `/tmp`) are not part of a remote layer: what a step leaves there is
//! lost.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;

use crate::client::{Client, RemoteError};
use crate::stage::{OUT_DIR, Stage, Step};
use crate::tree::{InputRoot, LayeredRoot, PathKind, TreeEntry, WHITEOUT};

/// Where the parent's modes travel in the input root.
pub const META_DIR: &str = "charly-meta";

/// Paths the sandbox provides itself (mounted over the input root): never
/// restored, compared or part of a layer.
pub const SANDBOX_PATHS: &[&str] = &["dev", "proc", "sys", "tmp"];

/// apt's settings for a sandbox that maps one id, without fakeroot
/// (`APT_CONFIG` points at them): apt runs its downloads as root instead
/// of switching to `_apt`, which such a sandbox cannot (`setgroups` and
/// `seteuid` fail). The file is charly's, never part of the layer.
const APT_CONF: &str = "charly-meta/apt.conf";
const APT_SETTINGS: &str = "APT::Sandbox::User \"root\";\n";

/// Directories of the input root that are charly's, not the image's.
const OWN_DIRS: &[&str] = &[crate::stage::CTX_DIR, META_DIR, OUT_DIR, "charly-shims"];

/// Whether `path` (relative) is outside what a layer holds.
fn ignored(path: &str) -> bool {
    let top = path.split('/').next().unwrap_or(path);
    SANDBOX_PATHS.contains(&top) || OWN_DIRS.contains(&top)
}

/// Refuses what a layer built remotely cannot carry yet (module docs).
pub fn check(stage: &Stage) -> Result<(), String> {
    if let Some((word, _)) = stage
        .config
        .iter()
        .find(|(w, _)| !CONFIG_WORDS.contains(&w.as_str()))
    {
        return Err(format!(
            "{word} is not carried into a layer built remotely yet"
        ));
    }
    Ok(())
}

/// The image settings a layer built remotely carries into its
/// configuration ([`config_after`]).
const CONFIG_WORDS: &[&str] = &["EXPOSE", "LABEL", "CMD", "ENTRYPOINT"];

/// The action's script and input root (module docs). `context` is the
/// layer's build context.
pub fn action(
    stage: &Stage,
    parent: &LayeredRoot,
    context: &Path,
    fakeroot: Option<&Fakeroot>,
) -> Result<(String, InputRoot), RemoteError> {
    let mut input = parent.input.clone();
    crate::stage::add_sources(stage, context, &mut input)?;
    // The parent's modes, one file per mode.
    let modes = paths_by(&parent.listing, |m| {
        (!matches!(m.kind, PathKind::Symlink | PathKind::Other)).then_some(m.mode)
    });
    for (mode, list) in modes {
        input.add_bytes(&format!("{META_DIR}/mode/{mode:04o}"), list, false)?;
    }
    if fakeroot.is_none() {
        input.add_bytes(APT_CONF, APT_SETTINGS.as_bytes().to_vec(), false)?;
    }
    let mut s = String::from("set -eu\n");
    if let Some(fk) = fakeroot {
        fk.add_to(&mut input)?;
        // The parent's owners, told to faked (one file per owner).
        let owners = paths_by(&parent.listing, |m| {
            (m.kind != PathKind::Other && (m.uid, m.gid) != (0, 0)).then_some((m.uid, m.gid))
        });
        for ((uid, gid), list) in owners {
            input.add_bytes(&format!("{META_DIR}/owner/{uid}:{gid}"), list, false)?;
        }
        s.push_str(FAKEROOT_START);
    }
    s.push_str(&apply_each("mode", "chmod"));
    if fakeroot.is_some() {
        s.push_str(&apply_each("owner", "chown -h"));
    }
    s.push_str(&crate::stage::steps_script(
        stage,
        crate::stage::Owners::Record,
    ));
    s.push_str(&format!("mkdir -p /{OUT_DIR}\n: > /{OUT_DIR}/env\n"));
    for name in env_names(stage) {
        s.push_str(&format!(
            "printf '%s=%s\\0' {name} \"${{{name}-}}\" >> /{OUT_DIR}/env\n"
        ));
    }
    s.push_str(&format!(
        "printf '%s' \"$charly_wd\" > /{OUT_DIR}/workdir\n: >> /{OUT_DIR}/owners\n"
    ));
    s.push_str(&format!(
        "charly_paths -print0 | xargs -0 stat -c '%f %u %g %n' > /{OUT_DIR}/modes\n"
    ));
    if fakeroot.is_some() {
        s.push_str("kill \"${charly_faked##*:}\" 2>/dev/null || :\n");
    }
    Ok((s, input))
}

/// The paths of `listing` (those a layer holds) grouped by what `key`
/// gives, each group NUL-separated absolute paths (`xargs -0` input).
fn paths_by<K: Ord>(
    listing: &crate::tree::Listing,
    key: impl Fn(&crate::tree::PathMeta) -> Option<K>,
) -> BTreeMap<K, Vec<u8>> {
    let mut groups: BTreeMap<K, Vec<u8>> = BTreeMap::new();
    for (path, meta) in listing {
        let Some(k) = key(meta).filter(|_| !ignored(path)) else {
            continue;
        };
        let list = groups.entry(k).or_default();
        list.push(b'/');
        list.extend_from_slice(path.as_bytes());
        list.push(0);
    }
    groups
}

/// The script lines that run `cmd <file name> <paths>` for every file of
/// `META_DIR/<dir>` (a group of [`paths_by`], named by its value).
fn apply_each(dir: &str, cmd: &str) -> String {
    format!(
        "for charly_f in /{META_DIR}/{dir}/*; do [ -e \"$charly_f\" ] || continue; \
         xargs -0 {cmd} \"${{charly_f##*/}}\" < \"$charly_f\"; done\n"
    )
}

/// fakeroot, for a parent image with a glibc loader: its daemon and
/// library travel in the input root, every step (and the final listing)
/// runs with the library preloaded, so the owners a package manager or
/// `useradd` gives (`chown(2)`, which a one-id sandbox refuses) are kept
/// by the daemon and reported by `stat`. The parent's owners are told to
/// it before the first step.
#[derive(Debug, Clone)]
pub struct Fakeroot {
    /// `faked-sysv`.
    pub faked: std::path::PathBuf,
    /// `libfakeroot-sysv.so`.
    pub lib: std::path::PathBuf,
}

/// How the script starts faked and preloads its library.
const FAKEROOT_START: &str = r#"charly_faked=$(FAKED_MODE=unknown-is-root /charly-meta/fakeroot/faked)
FAKEROOTKEY=${charly_faked%%:*}; FAKED_MODE=unknown-is-root; FAKEROOTDONTTRYCHOWN=1; LD_PRELOAD=/charly-meta/fakeroot/libfakeroot.so
export FAKEROOTKEY FAKED_MODE FAKEROOTDONTTRYCHOWN LD_PRELOAD
"#;

impl Fakeroot {
    /// This machine's fakeroot (Debian's paths), if installed.
    pub fn from_host() -> Option<Self> {
        let arch = std::env::consts::ARCH;
        let fk = Fakeroot {
            faked: "/usr/bin/faked-sysv".into(),
            lib: format!("/usr/lib/{arch}-linux-gnu/libfakeroot/libfakeroot-sysv.so").into(),
        };
        (fk.faked.is_file() && fk.lib.is_file()).then_some(fk)
    }

    /// Whether it can run in `parent`: the image has a glibc loader (a
    /// static or musl image cannot load the library).
    pub fn runs_in(&self, parent: &LayeredRoot) -> bool {
        parent.listing.keys().any(|p| {
            p.rsplit('/')
                .next()
                .is_some_and(|n| n.starts_with("ld-linux"))
        })
    }

    fn add_to(&self, input: &mut InputRoot) -> Result<(), RemoteError> {
        for (from, to, exec) in [
            (&self.faked, "faked", true),
            (&self.lib, "libfakeroot.so", false),
        ] {
            let data = std::fs::read(from)
                .map_err(|e| RemoteError::new(format!("fakeroot {}: {e}", from.display())))?;
            input.add_bytes(&format!("{META_DIR}/fakeroot/{to}"), data, exec)?;
        }
        Ok(())
    }
}

/// Every name the layer's `ENV` steps set, in order, once.
fn env_names(stage: &Stage) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for step in &stage.steps {
        if let Step::Env(pairs) = step {
            for (k, _) in pairs {
                if seen.insert(k.clone()) {
                    out.push(k.clone());
                }
            }
        }
    }
    out
}

/// One entry of the layer charly writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A directory (new, or its mode changed, or a parent of a change).
    Dir {
        /// Mode.
        mode: u32,
        /// Owner.
        uid: u64,
        /// Group.
        gid: u64,
    },
    /// A file with this content.
    File {
        /// Content digest.
        digest: re::Digest,
        /// Mode.
        mode: u32,
        /// Owner.
        uid: u64,
        /// Group.
        gid: u64,
    },
    /// A symlink.
    Symlink {
        /// Target.
        target: String,
        /// Owner.
        uid: u64,
        /// Group.
        gid: u64,
    },
    /// Deleted: a whiteout.
    Deleted,
}

/// A numeric owner: uid, gid.
type Ids = (u64, u64);

/// The files the action writes under [`OUT_DIR`] for charly.
#[derive(Debug, Clone, Default)]
pub struct Reported {
    /// `stat -c '%f %u %g %n'` of every path.
    pub modes: String,
    /// Whether the owners in `modes` are the steps' (fakeroot ran), not
    /// the sandbox's own.
    pub owners_reported: bool,
    /// `NAME=value\0` of every `ENV` the layer sets.
    pub env: Vec<u8>,
    /// The final working directory.
    pub workdir: String,
    /// `uid gid /path` lines: owners `COPY --chown` asked for.
    pub owners: String,
}

impl Reported {
    /// Downloads the four reports from the output tree
    /// ([`Client::download`] verifies them).
    pub fn fetch(client: &Client, out: &BTreeMap<String, TreeEntry>) -> Result<Self, RemoteError> {
        let digest = |name: &str| match out.get(&format!("{OUT_DIR}/{name}")) {
            Some(TreeEntry::File(d, _)) => Ok(d.clone()),
            _ => Err(RemoteError::new(format!(
                "the layer action's output lacks {OUT_DIR}/{name}"
            ))),
        };
        let ds = [
            digest("modes")?,
            digest("env")?,
            digest("workdir")?,
            digest("owners")?,
        ];
        let got = client.download(&ds)?;
        let bytes = |d: &re::Digest| got.get(&d.hash).cloned().unwrap_or_default();
        let text = |d: &re::Digest| String::from_utf8_lossy(&bytes(d)).into_owned();
        let [modes, env, workdir, owners] = &ds;
        Ok(Reported {
            modes: text(modes),
            env: bytes(env),
            workdir: text(workdir),
            owners: text(owners),
            owners_reported: false,
        })
    }

    /// Path (relative) → owner, from `owners`.
    fn owner_map(&self) -> Result<BTreeMap<String, Ids>, RemoteError> {
        let mut out = BTreeMap::new();
        for line in self.owners.lines() {
            let bad =
                || RemoteError::new(format!("the layer action reported `{line}` as an owner"));
            let mut parts = line.splitn(3, ' ');
            let (Some(u), Some(g), Some(p)) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad());
            };
            let ids = (u.parse().map_err(|_| bad())?, g.parse().map_err(|_| bad())?);
            out.insert(p.trim_start_matches('/').to_string(), ids);
        }
        Ok(out)
    }

    /// Path (relative) → mode (`& 0o7777`) and owner, from `modes`.
    fn mode_map(&self) -> Result<BTreeMap<String, (u32, Ids)>, RemoteError> {
        let mut out = BTreeMap::new();
        for line in self.modes.lines() {
            let bad = || RemoteError::new(format!("the layer action reported `{line}` as a mode"));
            let mut parts = line.splitn(4, ' ');
            let (Some(hex), Some(u), Some(g), Some(path)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(bad());
            };
            let raw = u32::from_str_radix(hex, 16).map_err(|_| bad())?;
            let ids = (u.parse().map_err(|_| bad())?, g.parse().map_err(|_| bad())?);
            let rel = path.trim_start_matches('/');
            if !rel.is_empty() {
                out.insert(rel.to_string(), (raw & 0o7777, ids));
            }
        }
        Ok(out)
    }
}

/// What the steps changed: every path of the output tree that is new,
/// of another kind, content or mode than in the parent, with the
/// directories above it; and every path of the parent that is gone (the
/// topmost only: a whiteout hides what is below it).
pub fn diff(
    parent: &LayeredRoot,
    out: &BTreeMap<String, TreeEntry>,
    reported: &Reported,
    given: &BTreeMap<String, Ids>,
) -> Result<BTreeMap<String, Change>, RemoteError> {
    let stats = reported.mode_map()?;
    let modes: BTreeMap<String, u32> = stats.iter().map(|(p, (m, _))| (p.clone(), *m)).collect();
    let reported_owners = reported.owners_reported;
    let mut given = given.clone();
    given.extend(reported.owner_map()?);
    let before = parent.input.entries();
    // The owner a step gave (ADD, COPY --chown, a RUN as another user),
    // else what fakeroot reports, else the parent's, else root (who runs
    // every step).
    let owner = |p: &str, kind: PathKind| {
        given.get(p).copied().unwrap_or_else(|| {
            let reported = stats.get(p).map(|(_, ids)| *ids);
            match reported {
                Some(ids) if reported_owners => ids,
                _ => parent
                    .listing
                    .get(p)
                    .filter(|m| m.kind == kind)
                    .map_or((0, 0), |m| (m.uid, m.gid)),
            }
        })
    };
    let mut changes = BTreeMap::new();
    for (path, now) in out {
        if ignored(path) {
            continue;
        }
        let (kind, default_mode) = match now {
            TreeEntry::Dir => (PathKind::Dir, 0o755),
            TreeEntry::File(_, exec) => (PathKind::File, if *exec { 0o755 } else { 0o644 }),
            TreeEntry::Symlink(_) => (PathKind::Symlink, 0o777),
        };
        let mode = modes.get(path).copied().unwrap_or(default_mode);
        let (uid, gid) = owner(path, kind);
        let same = before.get(path) == Some(now)
            && parent.listing.get(path).is_some_and(|m| {
                m.kind == kind
                    && (kind == PathKind::Symlink || m.mode == mode)
                    && (uid, gid) == (m.uid, m.gid)
            });
        if same {
            continue;
        }
        let change = match now {
            TreeEntry::Dir => Change::Dir { mode, uid, gid },
            TreeEntry::File(digest, _) => Change::File {
                digest: digest.clone(),
                mode,
                uid,
                gid,
            },
            TreeEntry::Symlink(target) => Change::Symlink {
                target: target.clone(),
                uid,
                gid,
            },
        };
        changes.insert(path.clone(), change);
    }
    // Deletions: the topmost path of each gone subtree.
    for (path, meta) in &parent.listing {
        if ignored(path) || meta.kind == PathKind::Other || out.contains_key(path) {
            continue;
        }
        let above_gone = path
            .rmatch_indices('/')
            .any(|(i, _)| !out.contains_key(&path[..i]));
        if !above_gone {
            changes.insert(path.clone(), Change::Deleted);
        }
    }
    // The directories above every change, as they are now.
    let mut above = Vec::new();
    for path in changes.keys() {
        for (i, _) in path.match_indices('/') {
            let dir = &path[..i];
            if !changes.contains_key(dir) {
                above.push(dir.to_string());
            }
        }
    }
    for dir in above {
        let mode = modes.get(&dir).copied().unwrap_or(0o755);
        let (uid, gid) = owner(&dir, PathKind::Dir);
        changes.entry(dir).or_insert(Change::Dir { mode, uid, gid });
    }
    Ok(changes)
}

/// A written layer blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerBlob {
    /// `sha256:…` of the gzip bytes.
    pub digest: String,
    /// `sha256:…` of the tar (the config's `diff_id`).
    pub diff_id: String,
    /// Size of the gzip bytes.
    pub size: u64,
}

/// Writes `changes` as a canonical gzip layer at `out` (module docs);
/// `content` gives each changed file's bytes by digest hash.
pub fn write_layer(
    changes: &BTreeMap<String, Change>,
    content: &BTreeMap<String, Vec<u8>>,
    out: &Path,
) -> Result<LayerBlob, RemoteError> {
    let err = |e: std::io::Error| RemoteError::new(format!("writing layer {}: {e}", out.display()));
    let mut b = tar::Builder::new(Vec::new());
    for (path, change) in changes {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        let (name, data): (String, &[u8]) = match change {
            Change::Dir { mode, uid, gid } => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*mode);
                h.set_uid(*uid);
                h.set_gid(*gid);
                (format!("{path}/"), b"")
            }
            Change::File {
                digest,
                mode,
                uid,
                gid,
            } => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_uid(*uid);
                h.set_gid(*gid);
                let data = content.get(&digest.hash).ok_or_else(|| {
                    RemoteError::new(format!("the content of {path} was not downloaded"))
                })?;
                (path.clone(), data.as_slice())
            }
            Change::Symlink { target, uid, gid } => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_uid(*uid);
                h.set_gid(*gid);
                h.set_size(0);
                b.append_link(&mut h, path, target).map_err(err)?;
                continue;
            }
            Change::Deleted => {
                let (dir, base) = path.rsplit_once('/').unwrap_or(("", path));
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0);
                let name = if dir.is_empty() {
                    format!("{WHITEOUT}{base}")
                } else {
                    format!("{dir}/{WHITEOUT}{base}")
                };
                (name, b"")
            }
        };
        h.set_size(data.len() as u64);
        b.append_data(&mut h, &name, data).map_err(err)?;
    }
    let tar = b.into_inner().map_err(err)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar).map_err(err)?;
    let gz = gz.finish().map_err(err)?;
    std::fs::write(out, &gz).map_err(err)?;
    let sha = |b: &[u8]| format!("sha256:{}", crate::client::DigestFn::Sha256.digest(b).hash);
    Ok(LayerBlob {
        digest: sha(&gz),
        diff_id: sha(&tar),
        size: gz.len() as u64,
    })
}

/// The `Env` entries (`KEY=VALUE`) of an image configuration (the OCI
/// config's `config` object).
pub fn config_env(config: &serde_json::Value) -> Vec<String> {
    config["Env"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The image configuration after the layer: `parent`'s (the OCI config's
/// `config` object) with the layer's `ENV` values as the action reported
/// them, its last `USER`, its `WORKDIR` (as the action resolved it),
/// `EXPOSE`, `LABEL`, `CMD` and `ENTRYPOINT`.
pub fn config_after(
    parent: &serde_json::Value,
    stage: &Stage,
    reported: &Reported,
) -> Result<serde_json::Value, RemoteError> {
    let mut cfg = match parent {
        serde_json::Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    let mut env = config_env(parent);
    for kv in reported.env.split(|b| *b == 0).filter(|kv| !kv.is_empty()) {
        let kv = String::from_utf8_lossy(kv).into_owned();
        let name = kv
            .split_once('=')
            .map_or(kv.as_str(), |(k, _)| k)
            .to_string();
        match env
            .iter_mut()
            .find(|e| e.split_once('=').is_some_and(|(k, _)| k == name))
        {
            Some(slot) => *slot = kv,
            None => env.push(kv),
        }
    }
    if !env.is_empty() {
        cfg.insert("Env".into(), env.into());
    }
    let mut workdir = false;
    for step in &stage.steps {
        match step {
            Step::User(u) => {
                cfg.insert("User".into(), u.clone().into());
            }
            Step::Workdir(_) => workdir = true,
            _ => {}
        }
    }
    if workdir {
        cfg.insert("WorkingDir".into(), reported.workdir.clone().into());
    }
    for (word, rest) in &stage.config {
        if word == "CMD" || word == "ENTRYPOINT" {
            // JSON form as it is; shell form through `/bin/sh -c`, as
            // Docker writes it. An ENTRYPOINT drops the CMD it inherits.
            let argv: Vec<String> = if rest.trim_start().starts_with('[') {
                serde_json::from_str(rest).map_err(|e| {
                    RemoteError::new(format!("{word} {rest}: not a JSON list of strings: {e}"))
                })?
            } else {
                vec!["/bin/sh".into(), "-c".into(), rest.to_string()]
            };
            let field = if word == "CMD" { "Cmd" } else { "Entrypoint" };
            if word == "ENTRYPOINT" && !stage.config.iter().any(|(w, _)| w == "CMD") {
                cfg.remove("Cmd");
            }
            cfg.insert(field.into(), argv.into());
            continue;
        }
        let words = crate::stage::words(rest).map_err(RemoteError::new)?;
        let (field, pairs): (&str, Vec<(String, serde_json::Value)>) = match word.as_str() {
            "EXPOSE" => (
                "ExposedPorts",
                words
                    .iter()
                    .map(|p| {
                        let p = if p.contains('/') {
                            p.clone()
                        } else {
                            format!("{p}/tcp")
                        };
                        (p, serde_json::json!({}))
                    })
                    .collect(),
            ),
            "LABEL" => (
                "Labels",
                words
                    .iter()
                    .map(|kv| {
                        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                        (k.to_string(), v.into())
                    })
                    .collect(),
            ),
            other => {
                return Err(RemoteError::new(format!(
                    "{other} is not carried into a layer built remotely yet"
                )));
            }
        };
        let slot = cfg
            .entry(field)
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if !slot.is_object() {
            *slot = serde_json::Value::Object(Default::default());
        }
        if let Some(m) = slot.as_object_mut() {
            m.extend(pairs);
        }
    }
    Ok(serde_json::Value::Object(cfg))
}

/// A layer built on an engine.
#[derive(Debug, Clone)]
pub struct Built {
    /// The layer (`None`: the steps changed no file, only configuration).
    pub blob: Option<LayerBlob>,
    /// The image configuration after it.
    pub config: serde_json::Value,
    /// How the action went.
    pub outcome: crate::action::ActionOutcome,
}

/// One layer to build on an engine.
#[derive(Clone, Copy)]
pub struct Job<'a> {
    /// Its instructions.
    pub stage: &'a Stage,
    /// Its parent's root filesystem.
    pub parent: &'a LayeredRoot,
    /// Its parent's configuration (the OCI config's `config` object).
    pub parent_config: &'a serde_json::Value,
    /// Its build context.
    pub context: &'a Path,
    /// fakeroot to send, where the parent can run it.
    pub fakeroot: Option<&'a Fakeroot>,
}

/// Builds a layer on the engine: `base` gives the action's environment,
/// platform and timeout; the layer blob is written at `out`.
pub fn build(
    client: &Client,
    base: crate::action::RemoteCommand,
    job: &Job<'_>,
    out: &Path,
) -> Result<Built, crate::action::ActionError> {
    use crate::action::{ActionError, RemoteCommand};
    let (stage, parent, parent_config, context) =
        (job.stage, job.parent, job.parent_config, job.context);
    let unsent = |e: RemoteError| ActionError {
        message: e.message,
        action_digest: String::new(),
        engine_error: true,
    };
    let fakeroot = job.fakeroot.filter(|f| f.runs_in(parent));
    let (script, input) = action(stage, parent, context, fakeroot).map_err(unsent)?;
    let mut cmd = RemoteCommand {
        args: vec!["/bin/sh".into(), "-c".into(), script],
        workdir: String::new(),
        outputs: vec![".".into()],
        ..base
    };
    // Under fakeroot apt switches to `_apt` as it would (faked), so its
    // directories get `_apt`'s owner; without, it keeps root.
    if fakeroot.is_none() {
        cmd.env
            .entry("APT_CONFIG".into())
            .or_insert_with(|| format!("/{APT_CONF}"));
    }
    let (mut outcome, tree) = cmd.run_root(client, input, false)?;
    let ad = outcome.action_digest.clone();
    let bad = |e: RemoteError| ActionError {
        message: format!("{} (action {ad})", e.message),
        action_digest: ad.clone(),
        engine_error: false,
    };
    let reported = Reported {
        owners_reported: fakeroot.is_some(),
        ..Reported::fetch(client, &tree).map_err(bad)?
    };
    let given = added_owners(stage, context).map_err(unsent)?;
    let changes = diff(parent, &tree, &reported, &given).map_err(bad)?;
    let wanted: Vec<re::Digest> = changes
        .values()
        .filter_map(|c| match c {
            Change::File { digest, .. } => Some(digest.clone()),
            _ => None,
        })
        .collect();
    // `download` verifies every blob against its digest.
    let content = client.download(&wanted).map_err(bad)?;
    outcome.downloaded_bytes += content.values().map(|b| b.len() as u64).sum::<u64>();
    let blob = if changes.is_empty() {
        None
    } else {
        Some(write_layer(&changes, &content, out).map_err(bad)?)
    };
    let config = config_after(parent_config, stage, &reported).map_err(bad)?;
    Ok(Built {
        blob,
        config,
        outcome,
    })
}

/// The owners the archives a layer `ADD`s give their entries (path under
/// the destination → uid, gid).
pub fn added_owners(stage: &Stage, context: &Path) -> Result<BTreeMap<String, Ids>, RemoteError> {
    let mut out = BTreeMap::new();
    for step in &stage.steps {
        let Step::AddTar { src, dst } = step else {
            continue;
        };
        let path = context.join(src);
        let err = |e: std::io::Error| RemoteError::new(format!("ADD {}: {e}", path.display()));
        let mut ar = tar::Archive::new(crate::tree::tar_reader(&path).map_err(err)?);
        for entry in ar.entries().map_err(err)? {
            let entry = entry.map_err(err)?;
            let rel = entry.path().map_err(err)?.to_string_lossy().into_owned();
            let rel = rel.trim_start_matches("./").trim_end_matches('/');
            let at = [dst.trim_matches('/'), rel]
                .iter()
                .filter(|p| !p.is_empty() && **p != ".")
                .copied()
                .collect::<Vec<_>>()
                .join("/");
            if at.is_empty() {
                continue;
            }
            let h = entry.header();
            out.insert(at, (h.uid().map_err(err)?, h.gid().map_err(err)?));
        }
    }
    Ok(out)
}
