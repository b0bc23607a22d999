//! The podman runner.
//!
//! * **Configuration.** Podman on some hosts needs settings to work at all
//!   (on Debian 12 with hybrid cgroups: the runc runtime and explicit
//!   ulimits). Unless `CONTAINERS_CONF` is already set, charly writes its own
//!   `containers.conf` next to the store and points podman at it. `--podman-root`
//!   isolates storage (tests, CI).
//! * **Builder stages** build the stage Containerfile with `--target` and
//!   export the `copy_artifact` paths with `podman cp`, then re-pack them as
//!   a reproducible tar (sorted entries, mtime 0, owner from the box user
//!   when the artifact is chowned), so the same stage gives the same bytes.
//! * **Images** build with `--layers`, the node key as a label, and are saved
//!   as an OCI archive for the store, so a machine that only has the store
//!   gets the image back with `podman load` instead of a rebuild.
//! * **Root filesystems** are bootstrapped on the host with debootstrap
//!   (from the configured mirror) when no builder image exists.
//! * **CA bundle.** Behind an intercepting proxy, builds that speak HTTPS
//!   need the proxy's CA: `--ca-bundle FILE` mounts it read-only at the
//!   usual system path in every RUN and points npm/node, pip and curl at it.

use super::{
    CA_ENV, CA_TARGET, ExportedImage, ImageConfig, LayerDesc, LayerFile, LayerRequest, LayerResult,
    LocalPkgRequest, LogSink, RootfsRequest, RunError, Runner, StageRequest,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Settings of the podman runner.
#[derive(Clone, Debug, Default)]
pub struct PodmanOptions {
    /// Isolated storage root (`podman --root`); run root goes next to it.
    pub root: Option<PathBuf>,
    /// Directory for charly's containers.conf (the store directory).
    pub conf_dir: PathBuf,
    /// A CA bundle to trust in builds.
    pub ca_bundle: Option<PathBuf>,
    /// Jobs per `podman build` (`--jobs`).
    pub jobs: usize,
    /// Never pull: an external base image missing from podman's storage is
    /// an error instead.
    pub offline: bool,
}

/// Runs nodes with podman.
pub struct PodmanRunner {
    opts: PodmanOptions,
    conf: Option<PathBuf>,
    /// What `podman info` says, asked once, when the first build needs it
    /// (constructing the runner starts no process: a no-op build calls no
    /// podman at all).
    info: std::sync::OnceLock<Info>,
    /// The ids and names of the images in podman's storage, listed by one
    /// `podman images` when the first presence check needs them (a no-op
    /// build asks about every image it would load: one process, not one
    /// per image). A reference not listed is asked about on its own, so an
    /// image made after the listing is still found.
    /// Each known reference (full id, short id, name) with the full id it
    /// names.
    images: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, String>>>,
}

/// What the runner learns from `podman info`.
struct Info {
    /// buildah before 1.29 deadlocks when a RUN holds two `sharing=locked`
    /// cache mounts and a later RUN mounts them again (seen with 1.28.2, the
    /// version Debian 12 ships). Package managers lock their own caches, so
    /// such builds use `sharing=shared` instead.
    shared_caches: bool,
    /// Where builds on shared caches take their cache slot (see [`CacheSlot`]).
    slot_dir: PathBuf,
}

/// The ids (full and the 12-digit short form) and names of the images in
/// `podman images --format json` output, each with the full id it names.
fn listed_images(json: &[u8]) -> std::collections::HashMap<String, String> {
    #[derive(serde::Deserialize)]
    struct Listed {
        #[serde(rename = "Id", default)]
        id: String,
        #[serde(rename = "Names", default)]
        names: Option<Vec<String>>,
    }
    let list: Vec<Listed> = serde_json::from_slice(json).unwrap_or_default();
    let mut out = std::collections::HashMap::new();
    for l in list {
        let id = l.id.trim_start_matches("sha256:").to_string();
        if id.is_empty() {
            continue;
        }
        if id.len() >= 12 {
            out.insert(id[..12].to_string(), id.clone());
        }
        for n in l.names.unwrap_or_default() {
            out.insert(n, id.clone());
        }
        out.insert(id.clone(), id);
    }
    out.remove("");
    out
}

/// Whether a Containerfile installs the `ca-certificates` package or runs
/// `update-ca-certificates` (a word of its own, not a path such as the
/// bundle's `/etc/ssl/certs/ca-certificates.crt`).
fn installs_ca_certificates(text: &str) -> bool {
    text.split(|c: char| c.is_whitespace() || matches!(c, ';' | '&' | '|' | '\'' | '"'))
        .any(|w| w == "ca-certificates" || w == "update-ca-certificates")
}

impl PodmanRunner {
    /// Checks podman is installed and prepares its configuration.
    pub fn new(opts: PodmanOptions) -> Result<Self, RunError> {
        if !which("podman") {
            return Err(RunError::new(
                "podman is not installed or not on PATH; install it (Debian/Ubuntu: `apt-get install podman buildah runc`, Fedora: `dnf install podman`) or use `--runner fake` to plan without building",
            ));
        }
        let conf = if std::env::var_os("CONTAINERS_CONF").is_some() {
            None
        } else {
            let runtime = if which("runc") { "runc" } else { "crun" };
            let text = format!(
                "# written by charly: podman settings this host needs\n[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n[engine]\nruntime = \"{runtime}\"\n"
            );
            let path = opts.conf_dir.join("podman").join("containers.conf");
            if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))
                    .map_err(|e| RunError::new(format!("{}: {e}", path.display())))?;
                std::fs::write(&path, text)
                    .map_err(|e| RunError::new(format!("{}: {e}", path.display())))?;
            }
            Some(path)
        };
        if let Some(ca) = &opts.ca_bundle
            && !ca.is_file()
        {
            return Err(RunError::new(format!(
                "--ca-bundle {}: no such file",
                ca.display()
            )));
        }
        Ok(PodmanRunner {
            opts,
            conf,
            info: std::sync::OnceLock::new(),
            images: std::sync::OnceLock::new(),
        })
    }

    fn info(&self) -> &Info {
        self.info.get_or_init(|| {
            let text = self
                .cmd()
                .args(["info", "--format", "{{.Host.BuildahVersion}}"])
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                .unwrap_or_default();
            let shared_caches = buildah_before(text.trim(), (1, 29));
            Info {
                shared_caches,
                slot_dir: slot_dir(
                    std::env::var_os("TMPDIR").as_deref(),
                    rustix::process::getuid().as_raw(),
                ),
            }
        })
    }

    /// A podman command with charly's configuration and storage.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        if let Some(conf) = &self.conf {
            c.env("CONTAINERS_CONF", conf);
        }
        if let Some(root) = &self.opts.root {
            c.arg("--root")
                .arg(root.join("storage"))
                .arg("--runroot")
                .arg(root.join("run"));
        }
        c
    }

    fn run(&self, what: &str, c: &mut Command) -> Result<Output, RunError> {
        let out = c
            .stdin(Stdio::null())
            .output()
            .map_err(|e| RunError::new(format!("{what}: cannot run podman: {e}")))?;
        if !out.status.success() {
            // The build log (stdout) says what failed; stderr says where.
            return Err(RunError::new(format!(
                "{what} failed ({}):\n{}\n{}",
                out.status,
                tail_lines(&out.stdout, 30),
                tail_lines(&out.stderr, 10)
            )));
        }
        Ok(out)
    }

    /// Runs a command whose output is a log (builds, package builds): each
    /// line goes to `log` as it comes, and a failure carries the failing
    /// build step and the command's own last lines ([`build_failure`]).
    fn run_logged(
        &self,
        what: &str,
        c: &mut Command,
        log: LogSink<'_>,
    ) -> Result<Output, RunError> {
        // One pipe for both streams: the log keeps the order the command
        // wrote its lines in (an error after the output that led to it).
        let program = c.get_program().to_string_lossy().into_owned();
        let cannot =
            |e: std::io::Error| RunError::new(format!("{what}: cannot run {program}: {e}"));
        let (reader, writer) = std::io::pipe().map_err(cannot)?;
        let writer2 = writer.try_clone().map_err(cannot)?;
        let spawned = c
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(writer2)
            .spawn();
        // The Command holds our copies of the write end: dropped now, so
        // the read ends when the command (and what it started) closes its.
        c.stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = spawned.map_err(cannot)?;
        let stdout = pump(Some(reader), log);
        let status = child
            .wait()
            .map_err(|e| RunError::new(format!("{what}: {e}")))?;
        let out = Output {
            status,
            stdout,
            stderr: Vec::new(),
        };
        if !out.status.success() {
            return Err(build_failure(what, &out));
        }
        Ok(out)
    }

    fn ca_args(&self, c: &mut Command) {
        if let Some(ca) = &self.opts.ca_bundle {
            c.arg("--volume")
                .arg(format!("{}:{CA_TARGET}:ro", ca.display()));
        }
    }

    /// The environment a build RUN needs to trust the CA bundle.
    fn ca_env(&self) -> Vec<(String, String)> {
        if self.opts.ca_bundle.is_none() {
            return Vec::new();
        }
        CA_ENV
            .iter()
            .map(|k| (k.to_string(), CA_TARGET.to_string()))
            .collect()
    }

    fn build(&self, b: &BuildCall<'_>) -> Result<String, RunError> {
        let tmp = tempfile::tempdir().map_err(|e| RunError::new(e.to_string()))?;
        let iid = tmp.path().join("iid");
        let mut file = b.file.to_path_buf();
        // Held until the build ends: no other build on this storage uses
        // the same cache ids meanwhile.
        let mut _slot = None;
        let info = self.info();
        let text = if info.shared_caches || self.opts.ca_bundle.is_some() {
            std::fs::read_to_string(b.file)
                .map_err(|e| RunError::new(format!("{}: {e}", b.file.display())))?
        } else {
            String::new()
        };
        if info.shared_caches && text.contains("--mount=type=cache") {
            let slot = CacheSlot::take(&info.slot_dir)
                .map_err(|e| RunError::new(format!("{}: {e}", info.slot_dir.display())))?;
            file = tmp.path().join("Containerfile");
            std::fs::write(&file, slot.rewrite(&text)).map_err(|e| RunError::new(e.to_string()))?;
            _slot = Some(slot);
        }
        let mut c = self.cmd();
        c.arg("build").arg("--pull=never");
        if b.squash {
            // Squashing excludes --layers; the epoch makes the same layer
            // built twice give the same bytes where the commands allow it.
            c.arg("--squash").arg("--timestamp=0");
        } else {
            c.arg("--layers=true");
        }
        if self.opts.jobs > 1 {
            c.arg(format!("--jobs={}", self.opts.jobs));
        }
        c.arg("-f")
            .arg(&file)
            .arg("-t")
            .arg(b.tag)
            .arg("--iidfile")
            .arg(&iid);
        if let Some(t) = b.target {
            c.arg("--target").arg(t);
        }
        for (k, v) in b.args {
            c.arg("--build-arg").arg(format!("{k}={v}"));
        }
        for (k, v) in b.labels {
            c.arg("--label").arg(format!("{k}={v}"));
        }
        // A build that installs the `ca-certificates` package (or runs
        // update-ca-certificates) writes the system bundle itself: with the
        // host's bundle bound over that file its rename onto it fails
        // (EBUSY) and dpkg with it. Such a build gets no bundle; its base
        // has none to replace anyway, and the builds after it get it again.
        if !installs_ca_certificates(&text) {
            self.ca_args(&mut c);
        }
        c.arg(b.context);
        self.run_logged(b.what, &mut c, b.log)?;
        std::fs::read_to_string(&iid)
            .map(|s| s.trim().to_string())
            .map_err(|e| RunError::new(format!("{}: no image id: {e}", b.what)))
    }
}

impl PodmanRunner {
    /// Pulls an external base image podman does not have (once: its layers
    /// are then in the store, keyed by the reference). Registries on the
    /// loopback interface are spoken to over plain HTTP, as the remote
    /// cache does.
    fn pull(&self, reference: &str) -> Result<(), RunError> {
        if self.opts.offline {
            return Err(RunError::new(format!(
                "the base image {reference} is not in podman's storage and --offline forbids pulling it; pull or load it yourself, or drop --offline"
            )));
        }
        let registry = reference.split('/').next().unwrap_or("");
        let mut c = self.cmd();
        c.args(["pull", "-q"]);
        if charly_cache::remote::is_loopback_registry(registry) {
            c.arg("--tls-verify=false");
        }
        let out = c
            .arg(reference)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| RunError::new(format!("podman pull {reference}: {e}")))?;
        if !out.status.success() {
            return Err(RunError {
                message: format!(
                    "cannot pull the base image {reference} ({}): is its registry reachable from here, and are you logged in (`podman login`) if it needs credentials? (--offline never pulls)",
                    out.status
                ),
                step: None,
                output: tail_lines(&out.stderr, 5)
                    .lines()
                    .map(str::to_string)
                    .collect(),
            });
        }
        Ok(())
    }

    /// Writes `image` into an OCI layout at `dir` (`podman push oci:`) and
    /// returns its layers and configuration. Layers listed in `skip` get an
    /// empty stand-in file first, named by both digests, so podman finds
    /// them "already present" and copies only the others: taking one new
    /// layer out costs that layer, not the image.
    fn push_layout(
        &self,
        image: &str,
        dir: &Path,
        skip: &[LayerDesc],
    ) -> Result<(Vec<LayerFile>, serde_json::Value), RunError> {
        let err = |e: std::io::Error| RunError::new(format!("{}: {e}", dir.display()));
        let blobs = dir.join("blobs").join("sha256");
        std::fs::create_dir_all(&blobs).map_err(err)?;
        std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).map_err(err)?;
        std::fs::write(
            dir.join("index.json"),
            r#"{"schemaVersion":2,"manifests":[]}"#,
        )
        .map_err(err)?;
        for l in skip {
            for d in [&l.digest, &l.diff_id] {
                if let Some(hex) = d.strip_prefix("sha256:") {
                    std::fs::write(blobs.join(hex), b"").map_err(err)?;
                }
            }
        }
        self.run(
            &format!("export {image}"),
            self.cmd()
                .args(["push", "-q", image])
                .arg(format!("oci:{}:charly", dir.display())),
        )?;
        crate::oci::read_layout(dir, "charly", skip.len())
            .map_err(|e| RunError::new(format!("export {image}: {e}")))
    }
}

/// One `podman build`.
struct BuildCall<'a> {
    what: &'a str,
    context: &'a Path,
    file: &'a Path,
    tag: &'a str,
    target: Option<&'a str>,
    args: &'a [(String, String)],
    labels: &'a [(String, String)],
    /// One new layer over the base, with timestamps at the epoch (layers).
    squash: bool,
    log: LogSink<'a>,
}

impl PodmanRunner {
    /// `cache gc --podman`: removes charly's own names from podman's
    /// storage (`localhost/charly-layer:*`, `charly-image:*`, and
    /// `charly-build:*` a killed build left), and the images that had no
    /// other name (an image a box reference, or anything of yours, names
    /// stays; an image a container uses stays too). The next build loads
    /// from the store what it needs again. Returns (names removed, images
    /// removed).
    pub fn prune_charly_images(&self) -> Result<(usize, usize), RunError> {
        #[derive(serde::Deserialize)]
        struct Listed {
            #[serde(rename = "Id", default)]
            id: String,
            #[serde(rename = "Names", default)]
            names: Option<Vec<String>>,
        }
        let listed = self.run(
            "list images",
            self.cmd()
                .args(["images", "--all", "--no-trunc", "--format", "json"]),
        )?;
        let list: Vec<Listed> = serde_json::from_slice(&listed.stdout).unwrap_or_default();
        let ours = |n: &str| {
            [
                "localhost/charly-layer:",
                "localhost/charly-image:",
                "localhost/charly-build:",
            ]
            .iter()
            .any(|p| n.starts_with(p))
        };
        let mut names = 0;
        let mut only_ours = Vec::new();
        for l in list {
            let all = l.names.unwrap_or_default();
            let mine: Vec<&String> = all.iter().filter(|n| ours(n)).collect();
            if mine.is_empty() || l.id.is_empty() {
                continue;
            }
            // `untag IMAGE NAME`: only that name (IMAGE alone would take
            // every name it has). One gone already (listed twice) is fine.
            for n in &mine {
                if self
                    .cmd()
                    .args(["untag", &l.id, n.as_str()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
                {
                    names += 1;
                }
            }
            if mine.len() == all.len() {
                only_ours.push(l.id);
            }
        }
        let mut images = 0;
        for id in &only_ours {
            // In use (a container, a child image): kept.
            if self
                .cmd()
                .args(["rmi", id])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
            {
                images += 1;
            }
        }
        Ok((names, images))
    }
}

impl crate::check::BedHost for PodmanRunner {
    fn start(&self, image: &str, name: &str, user: &str, cmd: &[String]) -> Result<String, String> {
        let mut c = self.cmd();
        c.args(["run", "-d", "--pull=never", "--name", name, "--user", user]);
        if let Some((first, rest)) = cmd.split_first() {
            c.arg("--entrypoint").arg(first).arg(image).args(rest);
        } else {
            c.arg(image);
        }
        let out = self
            .run(&format!("start bed {name}"), &mut c)
            .map_err(|e| e.message)?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn exec(
        &self,
        id: &str,
        user: &str,
        script: &str,
        timeout: std::time::Duration,
    ) -> Result<crate::check::ExecOutput, String> {
        let mut child = self
            .cmd()
            .args(["exec", "--user", user, id, "sh", "-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("podman exec: {e}"))?;
        let start = std::time::Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if start.elapsed() > timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("timed out after {} s", timeout.as_secs()));
                }
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
                Err(e) => return Err(format!("podman exec: {e}")),
            }
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("podman exec: {e}"))?;
        Ok(crate::check::ExecOutput {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    fn remove(&self, id: &str) {
        let _ = self.cmd().args(["rm", "-f", "-t", "0", id]).output();
    }
}

/// Where the cache slots are: beside buildah's cache mounts. buildah before
/// 1.29 keeps every `id=` cache in `$TMPDIR/buildah-cache` (`/var/tmp`
/// without `TMPDIR`), one directory for the whole host whatever podman
/// storage a build uses, so every charly process of the user must see the
/// same slots, whichever `--podman-root` it builds into.
fn slot_dir(tmpdir: Option<&std::ffi::OsStr>, uid: u32) -> PathBuf {
    let tmp = tmpdir
        .filter(|t| !t.is_empty())
        .unwrap_or("/var/tmp".as_ref());
    Path::new(tmp).join(format!("charly-cache-slots-{uid}"))
}

/// A cache slot: on buildah before 1.29, cache mounts are `sharing=shared`
/// (see [`PodmanRunner`]), so two builds running `apt-get` at once on one
/// storage would share `/var/cache/apt` and the second dies on apt's lock
/// ("Could not get lock /var/cache/apt/archives/lock"). Each build that
/// mounts caches therefore holds a slot, an exclusive lock on
/// `slot-N.lock` in a directory shared by every charly process of the user
/// on the host ([`slot_dir`]), and the cache ids of slot N > 0 carry the suffix `-sN`. The
/// first build takes slot 0 and keeps the generated ids (so its RUN lines,
/// and podman's layer cache, are those of the Containerfile); a concurrent
/// build gets its own caches instead of failing. Slots are per user and host
/// (as buildah's caches are) and reused, so each slot's caches stay warm.
struct CacheSlot {
    n: usize,
    _lock: std::fs::File,
}

/// Slots tried before waiting for slot 0.
const CACHE_SLOTS: usize = 16;

impl CacheSlot {
    /// Takes the first free slot, or waits for slot 0 when all are busy.
    fn take(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let open = |n: usize| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join(format!("slot-{n}.lock")))
        };
        for n in 0..CACHE_SLOTS {
            let f = open(n)?;
            match f.try_lock() {
                Ok(()) => return Ok(CacheSlot { n, _lock: f }),
                Err(std::fs::TryLockError::WouldBlock) => continue,
                Err(std::fs::TryLockError::Error(e)) => return Err(e),
            }
        }
        let f = open(0)?;
        f.lock()?;
        Ok(CacheSlot { n: 0, _lock: f })
    }

    /// The Containerfile with `sharing=shared` mounts and this slot's ids.
    fn rewrite(&self, text: &str) -> String {
        slot_text(text, self.n)
    }
}

/// `sharing=locked` becomes `shared`; cache `id=charly-…` gains `-sN` for
/// slot N > 0.
fn slot_text(text: &str, n: usize) -> String {
    let mut text = text.to_string();
    charly_rules::emit::cache_lock::map_cache_mounts(&mut text, |flag| {
        let flag = charly_rules::emit::cache_lock::unlocked(flag);
        if n == 0 {
            return flag;
        }
        let mut parts: Vec<String> = flag
            .split(',')
            .map(|p| match p.strip_prefix("id=") {
                Some(id) => format!("id={id}-s{n}"),
                None => p.to_string(),
            })
            .collect();
        // Without an id, buildah keys the cache by its target path.
        if !parts.iter().any(|p| p.starts_with("id=")) {
            let dst = parts.iter().find_map(|p| {
                ["dst=", "target=", "destination="]
                    .iter()
                    .find_map(|k| p.strip_prefix(k))
            });
            if let Some(dst) = dst {
                parts.push(format!("id={dst}-s{n}"));
            }
        }
        parts.join(",")
    });
    text
}

/// Reads a command's output to its end, sending each line that is not
/// builder chatter to `log`.
fn pump(r: Option<impl std::io::Read>, log: LogSink<'_>) -> Vec<u8> {
    use std::io::BufRead;
    let mut all = Vec::new();
    let Some(r) = r else { return all };
    let mut r = std::io::BufReader::new(r);
    let mut line = Vec::new();
    while let Ok(n) = r.read_until(b'\n', &mut line) {
        if n == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if !is_chatter(text) {
            log.line(text);
        }
        all.extend_from_slice(&line);
        line.clear();
    }
    all
}

/// podman's own bookkeeping lines in a build log: cache hits, commits,
/// blob copies, image ids.
fn is_chatter(l: &str) -> bool {
    const PREFIXES: [&str; 9] = [
        "--> ",
        "COMMIT",
        "Getting image source signatures",
        "Copying blob ",
        "Copying config ",
        "Writing manifest to image destination",
        "Storing signatures",
        "Successfully tagged ",
        "time=",
    ];
    PREFIXES.iter().any(|p| l.starts_with(p))
        || (l.len() == 64 && l.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `[s/t] STEP n/m: …` (the stage prefix only in multi-stage builds):
/// `(stage, step, the instruction)`.
fn parse_step(l: &str) -> Option<(usize, usize, &str)> {
    let (stage, rest) = match l.strip_prefix('[') {
        Some(r) => {
            let (st, rest) = r.split_once("] ")?;
            (st.split_once('/')?.0.parse().ok()?, rest)
        }
        None => (1, l),
    };
    let rest = rest.strip_prefix("STEP ")?;
    let (num, instr) = rest.split_once(": ")?;
    Some((stage, num.split_once('/')?.0.parse().ok()?, instr))
}

/// The error of a failed build or package build: the failing step, its
/// instruction (shortened) and the status in the message; the command's own
/// last lines (after the last `STEP` line, podman's chatter and its closing
/// `Error: building at STEP …` line removed) in `output`.
fn build_failure(what: &str, out: &Output) -> RunError {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    let last_step = lines.iter().rposition(|l| parse_step(l).is_some());
    let step = last_step.and_then(|i| parse_step(lines[i]));
    let after = last_step.map_or(&lines[..], |i| &lines[i + 1..]);
    let mut cause = None;
    let mut output: Vec<String> = after
        .iter()
        .copied()
        .chain(stderr.lines())
        .filter(|l| {
            if let Some(rest) = l.strip_prefix("Error: building at STEP ") {
                cause = rest.rsplit_once("\": ").map(|(_, c)| c.to_string());
                return false;
            }
            !is_chatter(l) && parse_step(l).is_none()
        })
        .map(str::to_string)
        .collect();
    output.drain(..output.len().saturating_sub(20));
    let cause = cause.unwrap_or_else(|| out.status.to_string());
    let message = match step {
        Some((_, n, instr)) => {
            // The keyword and the command: mount and chown flags say nothing.
            let mut words = instr.split_whitespace();
            let instr: String = words
                .next()
                .into_iter()
                .chain(words.skip_while(|w| w.starts_with("--")))
                .collect::<Vec<_>>()
                .join(" ");
            let short: String = instr.chars().take(100).collect();
            let more = if short.len() < instr.len() { "…" } else { "" };
            format!("{what} failed at step {n} (`{short}{more}`): {cause}")
        }
        None => format!("{what} failed: {cause}"),
    };
    RunError {
        message,
        step: step.map(|(st, n, _)| (st, n)),
        output,
    }
}

/// The last `n` lines of command output.
fn tail_lines(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Whether a `major.minor.patch` version is older than `(major, minor)`.
fn buildah_before(v: &str, (maj, min): (u64, u64)) -> bool {
    let mut it = v.split('.').map(|x| x.parse::<u64>().unwrap_or(0));
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    a != 0 && (a, b) < (maj, min)
}

fn which(bin: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
}

impl Runner for PodmanRunner {
    fn name(&self) -> &str {
        "podman"
    }

    fn build_stage(&self, req: &StageRequest) -> Result<(), RunError> {
        let tmp = tempfile::tempdir().map_err(|e| RunError::new(e.to_string()))?;
        let file = tmp.path().join("Containerfile");
        // A CA bundle reaches the stage's RUNs through ENV right after its FROM.
        let mut text = req.containerfile.clone();
        let env = self.ca_env();
        if !env.is_empty() {
            let mut patched = String::new();
            for line in text.lines() {
                patched.push_str(line);
                patched.push('\n');
                if line.starts_with("FROM ") && !line.starts_with("FROM scratch") {
                    for (k, v) in &env {
                        patched.push_str(&format!("ENV {k}={v}\n"));
                    }
                }
            }
            text = patched;
        }
        std::fs::write(&file, text).map_err(|e| RunError::new(e.to_string()))?;
        let stage = req
            .containerfile
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("FROM ").and_then(|r| r.split(" AS ").nth(1)))
            .map(|s| s.trim().to_string());
        let tag = format!(
            "localhost/charly-stage:{}",
            &req.key[..16.min(req.key.len())]
        );
        let what = format!("builder stage {}", req.node);
        let id = self.build(&BuildCall {
            what: &what,
            context: &req.context,
            file: &file,
            tag: &tag,
            target: stage.as_deref(),
            args: &[],
            labels: &[],
            squash: false,
            log: req.log,
        })?;
        // Export the artifact paths from a stopped container.
        let ctr = format!("charly-export-{}", &req.key[..16.min(req.key.len())]);
        let _ = self.cmd().args(["rm", "-f", &ctr]).output();
        self.run(
            "create export container",
            self.cmd().args(["create", "--name", &ctr, &id, "true"]),
        )?;
        let result = (|| -> Result<(), RunError> {
            let mut files: Vec<charly_files::artifact::Entry> = Vec::new();
            for src in &req.export {
                let src = src.trim_end_matches('/');
                let out = self.run(
                    &format!("podman cp {src}"),
                    self.cmd().arg("cp").arg(format!("{ctr}:{src}")).arg("-"),
                )?;
                files.extend(
                    charly_files::artifact::read_export(&out.stdout, src)
                        .map_err(|e| RunError::new(format!("reading {src}: {e}")))?,
                );
            }
            charly_files::artifact::write_tar(&req.out, files, Some(req.owner))
                .map_err(|e| RunError::new(format!("writing artifact: {e}")))
        })();
        let _ = self.cmd().args(["rm", "-f", &ctr]).output();
        let _ = self.cmd().args(["rmi", "-f", &tag]).output();
        result
    }

    fn has_image(&self, reference: &str) -> bool {
        self.image_id(reference).is_some()
    }

    fn image_id(&self, reference: &str) -> Option<String> {
        if reference.is_empty() {
            return None;
        }
        let r = reference.trim_start_matches("sha256:");
        let known = self.images.get_or_init(|| {
            let listed = self
                .cmd()
                .args(["images", "--all", "--no-trunc", "--format", "json"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| listed_images(&o.stdout))
                .unwrap_or_default();
            std::sync::Mutex::new(listed)
        });
        if let Some(id) = known.lock().ok().and_then(|k| k.get(r).cloned()) {
            return Some(id);
        }
        // Made after the listing: asked about on its own.
        let out = self
            .cmd()
            .args(["image", "inspect", "--format", "{{.Id}}", r])
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        let id = String::from_utf8_lossy(&out.stdout)
            .trim()
            .trim_start_matches("sha256:")
            .to_string();
        if id.is_empty() {
            return None;
        }
        if let Ok(mut k) = known.lock() {
            k.insert(r.to_string(), id.clone());
        }
        Some(id)
    }

    fn tag_image(&self, image: &str, tags: &[String]) -> Result<(), RunError> {
        let tags: Vec<&str> = tags
            .iter()
            .map(String::as_str)
            .filter(|t| !t.is_empty())
            .collect();
        if tags.is_empty() {
            return Ok(());
        }
        self.run(
            &format!("tag {}", tags.join(", ")),
            self.cmd().arg("tag").arg(image).args(&tags),
        )?;
        if let Some(id) = self.image_id(image)
            && let Some(Ok(mut k)) = self.images.get().map(|m| m.lock())
        {
            for t in tags {
                k.insert(t.to_string(), id.clone());
            }
        }
        Ok(())
    }

    fn build_layer(&self, req: &LayerRequest) -> Result<LayerResult, RunError> {
        let mut args: Vec<(String, String)> = req
            .build_args
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        args.push((
            charly_rules::emit::containerfile::LAYER_PARENT_ARG.to_string(),
            req.parent.clone().unwrap_or_else(|| "scratch".into()),
        ));
        self.build(&BuildCall {
            what: "podman build",
            context: &req.context,
            file: &req.containerfile,
            tag: &req.tag,
            target: None,
            args: &args,
            labels: &[],
            squash: true,
            log: req.log,
        })?;
        let layout = req.out.join("layout");
        let (layers, config) = self.push_layout(&req.tag, &layout, &req.parent_layers)?;
        let known = req.parent_layers.len();
        let same_base = layers.len() >= known
            && layers
                .iter()
                .zip(&req.parent_layers)
                .all(|(a, b)| a.desc.diff_id == b.diff_id);
        if !same_base || layers.len() > known + 1 {
            return Err(RunError::new(format!(
                "layer {}: the built image does not extend its parent by one layer ({} layers on a parent of {known})",
                req.node,
                layers.len()
            )));
        }
        Ok(LayerResult {
            layer: layers.into_iter().nth(known),
            config,
            in_runner: true,
        })
    }

    fn export_layers(&self, reference: &str, out: &Path) -> Result<ExportedImage, RunError> {
        if !self.has_image(reference) {
            self.pull(reference)?;
        }
        let (layers, config) = self.push_layout(reference, &out.join("layout"), &[])?;
        Ok(ExportedImage { layers, config })
    }

    fn load_layout(
        &self,
        dir: &Path,
        reference: &str,
        tags: &[String],
    ) -> Result<String, RunError> {
        let what = format!("load {}", tags.join(", "));
        let out = self.run(
            &what,
            self.cmd()
                .args(["pull", "-q"])
                .arg(format!("oci:{}:{reference}", dir.display())),
        )?;
        let id = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        if id.is_empty() {
            return Err(RunError::new(format!("{what}: podman printed no image id")));
        }
        let tags: Vec<&str> = tags
            .iter()
            .map(String::as_str)
            .filter(|t| !t.is_empty())
            .collect();
        if !tags.is_empty() {
            self.run(&what, self.cmd().arg("tag").arg(&id).args(&tags))?;
        }
        // podman names an image pulled from a layout after its path.
        let _ = self
            .cmd()
            .args(["untag", &id])
            .arg(format!("localhost{}:latest", dir.display()))
            .output();
        Ok(format!("sha256:{}", id.trim_start_matches("sha256:")))
    }

    fn rename_image(&self, from: &str, to: &str) -> Result<(), RunError> {
        self.run(&format!("tag {to}"), self.cmd().args(["tag", from, to]))?;
        self.run(
            &format!("untag {from}"),
            self.cmd().args(["untag", from, from]),
        )?;
        Ok(())
    }

    fn build_local_pkg(&self, req: &LocalPkgRequest) -> Result<(), RunError> {
        let mut c = self.cmd();
        c.args([
            "run",
            "--rm",
            "--pull=never",
            "--network=host",
            "--user",
            "0:0",
        ])
        .arg("-v")
        .arg(format!("{}:/src:ro", req.source.display()))
        .arg("-v")
        .arg(format!("{}:/out", req.out.display()));
        self.ca_args(&mut c);
        c.arg(&req.image).arg("sh").arg("-c").arg(&req.script);
        self.run_logged(&format!("local package {}", req.node), &mut c, req.log)?;
        Ok(())
    }

    fn build_rootfs(&self, req: &RootfsRequest) -> Result<(), RunError> {
        if req.builder != "debootstrap" {
            return Err(RunError::new(format!(
                "bootstrapping with `{}` needs its builder image; only debootstrap runs on the host",
                req.builder
            )));
        }
        if !which("debootstrap") && !Path::new("/usr/sbin/debootstrap").exists() {
            return Err(RunError::new(
                "debootstrap is not installed (apt-get install debootstrap)",
            ));
        }
        if req.suite.is_empty() || req.mirror.is_empty() {
            return Err(RunError::new(
                "the distro's `debootstrap:` settings need `suite` and `mirror`",
            ));
        }
        let tmp = tempfile::tempdir().map_err(|e| RunError::new(e.to_string()))?;
        let target = tmp.path().join("rootfs");
        let mut c = Command::new("debootstrap");
        c.arg(format!("--variant={}", req.variant));
        if !req.include.is_empty() {
            c.arg(format!("--include={}", req.include.join(",")));
        }
        c.arg(&req.suite).arg(&target).arg(&req.mirror);
        self.run_logged(
            &format!("debootstrap {} from {}", req.suite, req.mirror),
            &mut c,
            req.log,
        )?;
        // apt state that only matters inside the bootstrap.
        let _ = std::fs::remove_dir_all(target.join("var/cache/apt/archives"));
        let st = Command::new("tar")
            .arg("-C")
            .arg(&target)
            .args(["--numeric-owner", "--xattrs", "-czf"])
            .arg(&req.out)
            .arg(".")
            .status()
            .map_err(|e| RunError::new(format!("tar: {e}")))?;
        if !st.success() {
            return Err(RunError::new("packing the root filesystem failed"));
        }
        Ok(())
    }

    fn export_image(&self, image: &str, rootfs: Option<&Path>) -> Result<ImageConfig, RunError> {
        #[derive(serde::Deserialize, Default)]
        #[serde(rename_all = "PascalCase", default)]
        struct Config {
            env: Option<Vec<String>>,
            user: Option<String>,
            working_dir: Option<String>,
        }
        let out = self.run(
            &format!("podman image inspect {image}"),
            self.cmd()
                .args(["image", "inspect", "--format", "{{json .Config}}", image]),
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        let cfg: Config = match text.trim() {
            "" | "null" => Config::default(),
            t => serde_json::from_str(t)
                .map_err(|e| RunError::new(format!("podman image inspect {image}: {e}")))?,
        };
        if let Some(dest) = rootfs {
            let ctr = format!(
                "charly-rootfs-{}-{}",
                std::process::id(),
                &blake3::hash(image.as_bytes()).to_hex()[..16]
            );
            let _ = self.cmd().args(["rm", "-f", &ctr]).output();
            self.run(
                "create export container",
                self.cmd().args(["create", "--name", &ctr, image, "true"]),
            )?;
            let r = self.run(
                &format!("podman export {image}"),
                self.cmd().arg("export").arg("-o").arg(dest).arg(&ctr),
            );
            let _ = self.cmd().args(["rm", "-f", &ctr]).output();
            r?;
        }
        Ok(ImageConfig {
            env: cfg.env.unwrap_or_default(),
            user: cfg.user.unwrap_or_default(),
            workdir: cfg.working_dir.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_build_that_installs_ca_certificates_goes_without_the_bundle() {
        assert!(installs_ca_certificates(
            "RUN apt-get update && apt-get install -y --no-install-recommends curl ca-certificates gnupg && \\\n    true\n"
        ));
        assert!(installs_ca_certificates(
            "RUN dnf install -y ca-certificates\n"
        ));
        assert!(installs_ca_certificates(
            "RUN cp x /usr/local/share/ca-certificates/ && update-ca-certificates\n"
        ));
        // The bundle's path (the ENV a builder stage gets) is not an install.
        assert!(!installs_ca_certificates(
            "FROM x\nENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt\nRUN npm install -g cowsay\n"
        ));
        assert!(!installs_ca_certificates("RUN apt-get install -y curl\n"));
    }

    #[test]
    fn listed_images_are_known_by_id_short_id_and_name() {
        let json = br#"[{"Id":"4f7ea8d1c0b2a9e8f7d6c5b4a3928170f6e5d4c3b2a1908f7e6d5c4b3a291807","Names":["localhost/hello:2026.1.1","localhost/charly-layer:abc"]},{"Id":"sha256:0123456789abcdef","Names":null},{"Names":["x"]}]"#;
        let k = listed_images(json);
        let full = "4f7ea8d1c0b2a9e8f7d6c5b4a3928170f6e5d4c3b2a1908f7e6d5c4b3a291807";
        assert_eq!(k.get(full).map(String::as_str), Some(full));
        assert_eq!(k.get("4f7ea8d1c0b2").map(String::as_str), Some(full));
        assert_eq!(
            k.get("localhost/hello:2026.1.1").map(String::as_str),
            Some(full)
        );
        assert!(k.contains_key("0123456789abcdef") && k.contains_key("0123456789ab"));
        assert!(!k.contains_key("x"), "a name without an id names nothing");
        assert!(!k.contains_key(""));
        assert!(listed_images(b"garbage").is_empty());
    }

    /// What podman 4.3 printed for a RUN that failed in a multi-stage build
    /// (stdout, stderr), cache hits included.
    const OUT: &str = "[1/2] STEP 1/2: FROM scratch AS x\n[1/2] STEP 2/2: COPY candy/x/ /\n--> Using cache 2b1c4d\n--> 2b1c4d0f\n[2/2] STEP 1/4: FROM localhost/base:1\n[2/2] STEP 2/4: RUN echo one\n--> Using cache 9f0e\none\n[2/2] STEP 3/4: RUN --mount=type=cache,id=x,dst=/var/cache/x     echo start &&     ls /nonexistent\nstart\n";
    const ERR: &str = "ls: cannot access '/nonexistent': No such file or directory\nError: building at STEP \"RUN --mount=type=cache,id=x,dst=/var/cache/x echo start &&     ls /nonexistent\": while running runtime: exit status 2\n";

    #[test]
    fn a_failed_build_names_its_step_and_keeps_only_the_commands_lines() {
        use std::os::unix::process::ExitStatusExt;
        let out = Output {
            status: std::process::ExitStatus::from_raw(2 << 8),
            stdout: OUT.as_bytes().to_vec(),
            stderr: ERR.as_bytes().to_vec(),
        };
        let e = build_failure("podman build", &out);
        assert_eq!(e.step, Some((2, 3)));
        assert_eq!(
            e.message,
            "podman build failed at step 3 (`RUN echo start && ls /nonexistent`): while running runtime: exit status 2"
        );
        assert_eq!(
            e.output,
            vec![
                "start".to_string(),
                "ls: cannot access '/nonexistent': No such file or directory".to_string()
            ]
        );
        assert!(e.to_string().ends_with(
            "\n  | start\n  | ls: cannot access '/nonexistent': No such file or directory"
        ));
        // Single-stage builds have no `[s/t]` prefix.
        assert_eq!(
            parse_step("STEP 2/4: RUN echo one"),
            Some((1, 2, "RUN echo one"))
        );
        assert_eq!(parse_step("STEP"), None);
        assert!(is_chatter("--> Using cache 9f0e") && is_chatter(&"a".repeat(64)));
        assert!(!is_chatter("E: Unable to locate package x"));
    }

    #[test]
    fn logged_commands_stream_their_lines_and_drop_chatter() {
        let seen = std::sync::Mutex::new(Vec::new());
        let f = |l: &str| seen.lock().unwrap().push(l.to_string());
        let runner = PodmanRunner {
            opts: PodmanOptions::default(),
            conf: None,
            info: std::sync::OnceLock::new(),
            images: std::sync::OnceLock::new(),
        };
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo one; echo '--> Using cache 1'; echo two >&2; echo three; echo four >&2; exit 3",
        ]);
        let e = runner
            .run_logged("sh", &mut c, LogSink::new(&f))
            .expect_err("exit 3");
        // Both streams, in the order they were written.
        let order = ["one", "two", "three", "four"].map(String::from).to_vec();
        assert_eq!(*seen.lock().unwrap(), order);
        assert_eq!(e.step, None);
        assert_eq!(e.output, order);
        assert!(e.message.starts_with("sh failed: "), "{}", e.message);
    }

    #[test]
    fn buildah_versions() {
        assert!(buildah_before("1.28.2", (1, 29)));
        assert!(!buildah_before("1.29.0", (1, 29)));
        assert!(!buildah_before("1.33.7", (1, 29)));
        assert!(!buildah_before("2.0.0", (1, 29)));
        assert!(!buildah_before("", (1, 29)), "unknown: assume fixed");
    }

    const RUN: &str = "FROM x\nRUN --mount=type=cache,id=charly-apt,dst=/var/cache/apt,sharing=locked \\\n    --mount=type=cache,dst=/root/.npm apt-get update\nRUN echo id=charly-x\n";

    #[test]
    fn slot_zero_keeps_the_generated_ids() {
        let t = slot_text(RUN, 0);
        assert!(
            t.contains("id=charly-apt,dst=/var/cache/apt,sharing=shared "),
            "{t}"
        );
        assert!(!t.contains("sharing=locked"));
        assert!(
            t.contains("--mount=type=cache,dst=/root/.npm apt-get"),
            "{t}"
        );
    }

    #[test]
    fn other_slots_get_their_own_cache_ids() {
        let t = slot_text(RUN, 3);
        assert!(
            t.contains("id=charly-apt-s3,dst=/var/cache/apt,sharing=shared "),
            "{t}"
        );
        assert!(
            t.contains("--mount=type=cache,dst=/root/.npm,id=/root/.npm-s3 apt-get"),
            "{t}"
        );
        assert!(
            t.contains("RUN echo id=charly-x\n"),
            "only mount options change: {t}"
        );
        assert!(t.contains("\\\n    --mount"), "continuations kept: {t}");
    }

    #[test]
    fn a_scripts_own_text_is_never_rewritten() {
        let text = "FROM x\n# --mount=type=cache,id=c,sharing=locked\nRUN --mount=type=cache,id=a,dst=/a,sharing=locked echo 'sharing=locked --mount=type=cache,id=y,dst=/y' > /f\n";
        for n in [0, 2] {
            let t = slot_text(text, n);
            assert!(
                t.contains("echo 'sharing=locked --mount=type=cache,id=y,dst=/y' > /f"),
                "{t}"
            );
            assert!(
                t.contains("# --mount=type=cache,id=c,sharing=locked\n"),
                "{t}"
            );
            assert!(t.contains("dst=/a,sharing=shared echo"), "{t}");
        }
    }

    #[test]
    fn slots_are_per_host_and_user_like_buildahs_caches_not_per_storage() {
        assert_eq!(
            slot_dir(None, 0),
            Path::new("/var/tmp/charly-cache-slots-0")
        );
        assert_eq!(
            slot_dir(Some("".as_ref()), 1000),
            Path::new("/var/tmp/charly-cache-slots-1000")
        );
        assert_eq!(
            slot_dir(Some("/scratch".as_ref()), 0),
            Path::new("/scratch/charly-cache-slots-0")
        );
    }

    #[test]
    fn concurrent_builds_take_different_slots() {
        let dir = tempfile::tempdir().expect("tmp");
        let a = CacheSlot::take(dir.path()).expect("a");
        let b = CacheSlot::take(dir.path()).expect("b");
        assert_eq!((a.n, b.n), (0, 1));
        drop(a);
        let c = CacheSlot::take(dir.path()).expect("c");
        assert_eq!(c.n, 0, "a freed slot is reused, so its caches stay warm");
    }
}
