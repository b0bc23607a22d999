//! charly's plugin host: finds the executable of the candy that declares a
//! word, starts it once per run (`charly-plugin`), and answers the build
//! leg (Describe, `emit`, both cached in the store's directory by the
//! executable's digest, so a run that changes nothing starts no plugin)
//! and the deploy leg (`execute`, streamed with `InvokeStream` when the
//! plugin serves it, with the walk's [`Host`] served back to the plugin as
//! its venue).
//!
//! Where an executable is looked for, in order: `$CHARLY_PLUGIN_DIR/<candy>`,
//! `<store>/plugins/bin/<candy>`; else, when the candy declares `build:`,
//! the host builds it into `<store>/plugins/build/<candy>-<source digest>/`.

use crate::host::{Cmd, FileAttrs, Host};
use crate::walk::{PluginCall, PluginSteps, TargetUser, parse_deploy_reply};
use charly_engine::graph::PluginBuild;
use charly_plugin::{Capabilities, Capture, ExecError, Executor, LineSink, Plugin, PluginOptions};
use charly_rules::load::Project;
use charly_rules::plan::{Gate, InstallPlan, Scope, StepData, Venue};
use charly_rules::plugin::{ProviderClass, StepContract};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The environment variable naming a directory of plugin executables.
pub const PLUGIN_DIR_ENV: &str = "CHARLY_PLUGIN_DIR";

/// Who serves a word.
#[derive(Clone, Debug)]
struct Served {
    class: ProviderClass,
    /// The candy's short name (the executable's file name).
    name: String,
    dir: PathBuf,
    build: Option<String>,
}

/// What a plugin said about itself, cached by its executable's digest.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct Described {
    exe_digest: String,
    caps: Capabilities,
}

impl Described {
    /// The identity keys carry: the executable and what it said.
    fn identity(&self) -> String {
        let reply = serde_json::to_vec(&self.caps).unwrap_or_default();
        format!(
            "exe:{} describe:{}",
            self.exe_digest,
            blake3::hash(&reply).to_hex()
        )
    }
}

/// The plugin host of one charly run.
pub struct PluginHost {
    served: BTreeMap<String, Served>,
    dirs: Vec<PathBuf>,
    cache: PathBuf,
    sink: Option<LineSink>,
    timeout: Duration,
    running: Mutex<BTreeMap<PathBuf, Arc<Plugin>>>,
    described: Mutex<BTreeMap<String, Described>>,
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost")
            .field("words", &self.served.keys().collect::<Vec<_>>())
            .field("dirs", &self.dirs)
            .finish_non_exhaustive()
    }
}

impl PluginHost {
    /// The host for project `p`, caching under `store_dir/plugins`; plugin
    /// output lines go to `sink`; every call may take `timeout`.
    pub fn new(p: &Project, store_dir: &Path, sink: Option<LineSink>, timeout: Duration) -> Self {
        let mut served = BTreeMap::new();
        for prov in p.plugins.providers.values() {
            if !matches!(prov.class, ProviderClass::Step | ProviderClass::Verb) {
                continue;
            }
            let Some(c) = p.candies.get(&prov.candy) else {
                continue;
            };
            served.entry(prov.word.clone()).or_insert(Served {
                class: prov.class,
                name: c.name.clone(),
                dir: c.dir.clone(),
                build: p.plugins.builds.get(&c.key).cloned(),
            });
        }
        let cache = store_dir.join("plugins");
        let mut dirs = Vec::new();
        if let Some(d) = std::env::var_os(PLUGIN_DIR_ENV).filter(|d| !d.is_empty()) {
            dirs.push(PathBuf::from(d));
        }
        dirs.push(cache.join("bin"));
        PluginHost {
            served,
            dirs,
            cache,
            sink,
            timeout,
            running: Mutex::new(BTreeMap::new()),
            described: Mutex::new(BTreeMap::new()),
        }
    }

    fn served(&self, word: &str) -> Result<&Served, String> {
        self.served
            .get(word)
            .ok_or_else(|| format!("plugin `{word}` is declared by no candy"))
    }

    /// The executable serving `word`.
    fn exe(&self, word: &str) -> Result<PathBuf, String> {
        let s = self.served(word)?;
        for d in &self.dirs {
            let p = d.join(&s.name);
            if p.is_file() {
                return Ok(p);
            }
        }
        match &s.build {
            Some(cmd) => self.build(s, cmd),
            None => Err(format!(
                "plugin `{word}`: no executable `{}` in {} (put it there, or declare `build:` in candy `{}`'s plugin)",
                s.name,
                self.dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
                s.name
            )),
        }
    }

    /// Builds a candy's plugin with its declared command, once per content
    /// of its directory.
    fn build(&self, s: &Served, cmd: &str) -> Result<PathBuf, String> {
        let digest = dir_digest(&s.dir).map_err(|e| format!("plugin {}: {e}", s.name))?;
        let out_dir = self
            .cache
            .join("build")
            .join(format!("{}-{}", s.name, &digest[..16]));
        let exe = out_dir.join(&s.name);
        if exe.is_file() {
            return Ok(exe);
        }
        std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
        let tmp = tempfile::Builder::new()
            .prefix(".building-")
            .tempfile_in(&out_dir)
            .map_err(|e| format!("{}: {e}", out_dir.display()))?
            .into_temp_path();
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(cmd)
            .current_dir(&s.dir)
            .env("CHARLY_PLUGIN_OUT", &*tmp)
            // Cargo's output stays out of the candy's directory (whose
            // digest names the build).
            .env("CARGO_TARGET_DIR", self.cache.join("build").join("target"))
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("plugin {}: build: {e}", s.name))?;
        if !out.status.success() {
            return Err(format!(
                "plugin {}: `{cmd}` failed ({}): {}",
                s.name,
                out.status,
                crate::host::shorten(&String::from_utf8_lossy(&out.stderr), 400)
            ));
        }
        // The temp file was made private; the result runs.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&*tmp, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("plugin {}: {e}", s.name))?;
        }
        tmp.persist(&exe)
            .map_err(|e| format!("plugin {}: {}: {e}", s.name, exe.display()))?;
        Ok(exe)
    }

    /// The running plugin for `exe` (started on first use).
    fn plugin(&self, exe: &Path) -> Result<Arc<Plugin>, String> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = running.get(exe) {
            return Ok(p.clone());
        }
        let opts = PluginOptions {
            call_timeout: self.timeout,
            sink: self.sink.clone(),
            ..PluginOptions::default()
        };
        let p = Arc::new(Plugin::start(exe, opts).map_err(|e| e.to_string())?);
        running.insert(exe.to_path_buf(), p.clone());
        Ok(p)
    }

    /// What the plugin serving `word` says about itself (cached by its
    /// executable's digest); it must serve `word` in the declared class.
    fn describe(&self, word: &str) -> Result<Described, String> {
        if let Some(d) = self
            .described
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(word)
        {
            return Ok(d.clone());
        }
        let s = self.served(word)?;
        let exe = self.exe(word)?;
        let bytes = std::fs::read(&exe).map_err(|e| format!("{}: {e}", exe.display()))?;
        let exe_digest = blake3::hash(&bytes).to_hex().to_string();
        let cached = self
            .cache
            .join("describe")
            .join(format!("{exe_digest}.json"));
        let d = match std::fs::read(&cached)
            .ok()
            .and_then(|b| serde_json::from_slice::<Described>(&b).ok())
        {
            Some(d) => d,
            None => {
                let caps = self.plugin(&exe)?.describe().map_err(|e| e.to_string())?;
                let d = Described { exe_digest, caps };
                write_atomic(&cached, &serde_json::to_vec(&d).unwrap_or_default())?;
                d
            }
        };
        let class = s.class.as_str();
        if !d
            .caps
            .provided
            .iter()
            .any(|c| c.class == class && c.word == word)
        {
            let serves: Vec<String> = d
                .caps
                .provided
                .iter()
                .map(|c| format!("{}:{}", c.class, c.word))
                .collect();
            return Err(format!(
                "plugin {} does not serve `{class}:{word}` (it serves {})",
                s.name,
                if serves.is_empty() {
                    "nothing".to_string()
                } else {
                    serves.join(", ")
                }
            ));
        }
        self.described
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(word.to_string(), d.clone());
        Ok(d)
    }

    /// The install-step contract the plugin declares for `word` (`None`
    /// for a verb, which declares none).
    pub fn contract(&self, word: &str) -> Result<Option<StepContract>, String> {
        let d = self.describe(word)?;
        let Some(c) = d
            .caps
            .provided
            .iter()
            .find(|c| c.word == word)
            .and_then(|c| c.step_contract.clone())
        else {
            return Ok(None);
        };
        let scope = match c.scope.as_str() {
            "system" | "" => Scope::System,
            "user" => Scope::User,
            "user-profile" => Scope::UserProfile,
            other => return Err(format!("plugin `{word}` declares scope `{other}`")),
        };
        let venue = match c.venue {
            charly_plugin::StepVenue::HostNative => Venue::HostNative,
            charly_plugin::StepVenue::ContainerBuilder => Venue::ContainerBuilder,
            charly_plugin::StepVenue::Skip => Venue::Skip,
            charly_plugin::StepVenue::Other(n) => {
                return Err(format!("plugin `{word}` declares venue {n}"));
            }
        };
        let gate = match c.gate.as_str() {
            "" => Gate::None,
            "allow-repo-changes" => Gate::AllowRepoChanges,
            "allow-root-tasks" => Gate::AllowRootTasks,
            "with-services" => Gate::WithServices,
            other => return Err(format!("plugin `{word}` declares gate `{other}`")),
        };
        Ok(Some(StepContract {
            scope,
            venue,
            gate,
            emits: c.emits,
        }))
    }

    /// The fragment `word` emits for `input` (cached by the plugin's
    /// identity and the input).
    fn emit(&self, word: &str, input: &serde_json::Value) -> Result<String, String> {
        let d = self.describe(word)?;
        let s = self.served(word)?;
        let env = serde_json::json!({});
        let key = blake3::hash(
            format!(
                "{}\0{}\0{word}\0{}\0{}",
                d.identity(),
                s.class.as_str(),
                input,
                env
            )
            .as_bytes(),
        )
        .to_hex()
        .to_string();
        let cached = self.cache.join("emit").join(format!("{key}.txt"));
        if let Ok(f) = std::fs::read_to_string(&cached) {
            return Ok(f);
        }
        let exe = self.exe(word)?;
        let reply = self
            .plugin(&exe)?
            .invoke(s.class.as_str(), word, "emit", input, &env, None)
            .map_err(|e| e.to_string())?;
        let fragment = reply
            .get("fragment")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string();
        write_atomic(&cached, fragment.as_bytes())?;
        Ok(fragment)
    }

    /// The build leg for the plugin steps of `plans` (`(box, plans)`):
    /// the contracts to compile with, and what the graph needs. Call with
    /// plans compiled after the contracts were set ([`Self::contracts`]).
    pub fn build_inputs(&self, plans: &[&InstallPlan]) -> Result<PluginBuild, String> {
        let mut pb = PluginBuild::default();
        for plan in plans {
            for s in &plan.steps {
                let StepData::External(e) = &s.data else {
                    continue;
                };
                if s.venue == Venue::Skip {
                    continue;
                }
                let word = e.data["word"].as_str().unwrap_or_default();
                let Some(task) = e.data["task"].as_u64().map(|t| t as usize) else {
                    continue;
                };
                let d = self.describe(word)?;
                pb.ids.insert(word.to_string(), d.identity());
                if let Some(c) = self.contract(word)?
                    && !c.emits
                {
                    pb.deploy_only.insert(word.to_string());
                    continue;
                }
                let key = (s.candy.clone(), task);
                if pb.fragments.contains_key(&key) {
                    continue;
                }
                let f = self.emit(word, &e.data["input"])?;
                if f.trim().is_empty() {
                    return Err(format!(
                        "plugin `{word}` emitted nothing for candy `{}` task #{} (a build step): a build step must contribute its fragment",
                        s.candy,
                        task + 1
                    ));
                }
                pb.fragments.insert(key, f);
            }
        }
        Ok(pb)
    }

    /// The contracts of every word `words` names that a plugin here
    /// serves; a word whose plugin cannot be found or asked is left out
    /// (its steps keep the task's defaults, and using them fails later,
    /// naming why).
    pub fn contracts<'a>(
        &self,
        words: impl IntoIterator<Item = &'a str>,
    ) -> (BTreeMap<String, StepContract>, Vec<String>) {
        let mut got = BTreeMap::new();
        let mut problems = Vec::new();
        for w in words {
            match self.contract(w) {
                Ok(Some(c)) => {
                    got.insert(w.to_string(), c);
                }
                Ok(None) => {}
                Err(e) => problems.push(e),
            }
        }
        (got, problems)
    }
}

impl PluginSteps for PluginHost {
    fn execute(
        &self,
        call: &PluginCall<'_>,
        host: &mut dyn Host,
    ) -> Result<Vec<charly_rules::plan::ReverseOp>, String> {
        let exe = self.exe(call.word)?;
        self.describe(call.word)?;
        let plugin = self.plugin(&exe)?;
        let env = serde_json::json!({"deploy_name": call.bundle, "env": {}});
        let mut venue = HostVenue {
            host,
            user: call.user,
        };
        // The protocol names `execute` a streaming operation: progress frames
        // go to the sink with the plugin's stderr; a plugin that serves only
        // `Invoke` is asked that way instead (charly_plugin handles it).
        let reply = plugin
            .invoke_stream(
                call.class,
                call.word,
                "execute",
                call.input,
                &env,
                Some(&mut venue),
            )
            .map_err(|e| e.to_string())?;
        let bytes = serde_json::to_vec(&reply).map_err(|e| e.to_string())?;
        parse_deploy_reply(&bytes)
    }
}

/// The walk's host as a plugin's venue (`ExecutorService`).
struct HostVenue<'a> {
    host: &'a mut dyn Host,
    user: &'a TargetUser,
}

impl HostVenue<'_> {
    fn run(&mut self, script: &str, privileged: bool, as_user: bool) -> Result<Capture, ExecError> {
        let mut c = Cmd::sh(script.to_string());
        c.privileged = privileged;
        if as_user {
            c.as_user = Some(self.user.name.clone());
            c.env.insert("HOME".into(), self.user.home.clone());
            c.env.insert("USER".into(), self.user.name.clone());
        }
        let out = self.host.run(&c).map_err(|e| ExecError(e.to_string()))?;
        Ok(Capture {
            stdout: out.stdout_str(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            exit_code: out.status,
        })
    }

    fn run_ok(&mut self, script: &str, privileged: bool, as_user: bool) -> Result<(), ExecError> {
        let c = self.run(script, privileged, as_user)?;
        if c.exit_code != 0 {
            return Err(ExecError(format!(
                "exit {}: {}",
                c.exit_code,
                crate::host::shorten(c.stderr.trim(), 400)
            )));
        }
        Ok(())
    }
}

/// A venue path a plugin names: absolute and never climbing.
fn venue_path(path: &str) -> Result<(), ExecError> {
    if !path.starts_with('/') || charly_rules::plan::compile::climbing_path(path).is_some() {
        return Err(ExecError(format!(
            "`{path}` is not an absolute path without `..`"
        )));
    }
    Ok(())
}

impl Executor for HostVenue<'_> {
    fn venue(&mut self) -> Result<String, ExecError> {
        Ok(self.host.describe())
    }

    fn run_system(&mut self, script: &str, _opts: &[u8]) -> Result<(), ExecError> {
        self.run_ok(script, true, false)
    }

    fn run_user(&mut self, script: &str, _opts: &[u8]) -> Result<(), ExecError> {
        self.run_ok(script, false, true)
    }

    fn run_capture(&mut self, script: &str, _opts: &[u8]) -> Result<Capture, ExecError> {
        self.run(script, false, false)
    }

    fn put_file(
        &mut self,
        path: &str,
        content: &[u8],
        mode: u32,
        owner_root: bool,
        _opts: &[u8],
    ) -> Result<(), ExecError> {
        venue_path(path)?;
        let attrs = FileAttrs {
            mode: mode & 0o7777,
            owner: Some(if owner_root {
                (0, 0)
            } else {
                (self.user.uid, self.user.gid)
            }),
            privileged: owner_root,
        };
        self.host
            .write_file(path, content, &attrs)
            .map_err(|e| ExecError(e.to_string()))
    }

    fn get_file(&mut self, path: &str, as_root: bool, _opts: &[u8]) -> Result<Vec<u8>, ExecError> {
        venue_path(path)?;
        self.host
            .read_file(path, as_root)
            .map_err(|e| ExecError(e.to_string()))?
            .ok_or_else(|| ExecError(format!("{path}: no such file")))
    }
}

/// Writes a cache file atomically (a temp file in the same directory,
/// then a rename): two charly processes never see half of one.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = path.parent().ok_or("no parent")?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut t =
        tempfile::NamedTempFile::new_in(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::io::Write::write_all(&mut t, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    t.persist(path)
        .map(|_| ())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// blake3 over a directory's files (relative paths and contents, sorted).
fn dir_digest(dir: &Path) -> Result<String, String> {
    let mut files: Vec<(String, PathBuf)> = walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let rel = e
                .path()
                .strip_prefix(dir)
                .unwrap_or(e.path())
                .to_string_lossy()
                .into_owned();
            (rel, e.path().to_path_buf())
        })
        .collect();
    files.sort();
    let mut h = blake3::Hasher::new();
    for (rel, p) in files {
        let bytes = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        h.update(rel.as_bytes());
        h.update(&[0]);
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(h.finalize().to_hex().to_string())
}
