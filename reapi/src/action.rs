//! One command as a REAPI action: build the Command and Action messages,
//! upload what the engine's CAS is missing, look the action up in the
//! ActionCache, execute it when there is no entry, then download every
//! output, verify its digest and only then write it under a local
//! directory. A non-zero exit code, an engine error or an output that does
//! not match its digest is an error naming the action digest; nothing of a
//! failed action is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bazel_remote_apis::build::bazel::remote::execution::v2 as re;
use bazel_remote_apis::google::protobuf::Duration as PbDuration;
use prost::Message;

use crate::client::{Client, RemoteError, digest_str};
use crate::tree::{InputRoot, TreeEntry};

/// A command to run remotely.
#[derive(Debug, Clone, Default)]
pub struct RemoteCommand {
    /// argv.
    pub args: Vec<String>,
    /// Environment (sent sorted by name, as the protocol requires).
    pub env: BTreeMap<String, String>,
    /// Working directory relative to the input root ("" for the root).
    pub workdir: String,
    /// Output paths relative to the working directory (files or directories).
    pub outputs: Vec<String>,
    /// Platform properties (sent sorted by name).
    pub platform: BTreeMap<String, String>,
    /// Execution timeout.
    pub timeout: Option<Duration>,
}

/// How an action went.
#[derive(Debug, Clone)]
pub struct ActionOutcome {
    /// `hash/size` of the Action message.
    pub action_digest: String,
    /// Whether the result came from the ActionCache (ours or the engine's).
    pub cached: bool,
    /// Bytes uploaded (blobs the engine was missing).
    pub uploaded_bytes: u64,
    /// Bytes of outputs downloaded.
    pub downloaded_bytes: u64,
    /// Wall time of the whole round trip.
    pub elapsed: Duration,
    /// The command's stdout and stderr (when the engine inlined or stored them).
    pub stdout: Vec<u8>,
    /// See `stdout`.
    pub stderr: Vec<u8>,
}

/// A failed remote action.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ActionError {
    /// For people: what failed, with the action digest.
    pub message: String,
    /// `hash/size` of the Action (empty when it was never built).
    pub action_digest: String,
    /// Whether the engine could not be reached or refused the call (a
    /// fallback to local execution makes sense), as opposed to the command
    /// itself failing or its outputs being bad.
    pub engine_error: bool,
}

fn sorted_platform(p: &BTreeMap<String, String>) -> Option<re::Platform> {
    if p.is_empty() {
        return None;
    }
    Some(re::Platform {
        properties: p
            .iter()
            .map(|(k, v)| re::platform::Property {
                name: k.clone(),
                value: v.clone(),
            })
            .collect(),
    })
}

impl RemoteCommand {
    /// The Command message. The deprecated fields are set on purpose:
    /// engines older than REAPI 2.1 read `output_files`/`output_directories`
    /// and the Command's platform (2.2 moved it to the Action; both carry it).
    #[allow(deprecated)]
    pub fn command_message(&self, client: &Client) -> re::Command {
        let mut outputs = self.outputs.clone();
        outputs.sort();
        outputs.dedup();
        let v21 = client.capabilities().high_api >= (2, 1);
        re::Command {
            arguments: self.args.clone(),
            environment_variables: self
                .env
                .iter()
                .map(|(k, v)| re::command::EnvironmentVariable {
                    name: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            // REAPI >= 2.1 takes output_paths; older engines the split lists
            // (charly's outputs that are directories end with `/`).
            output_files: if v21 {
                Vec::new()
            } else {
                outputs
                    .iter()
                    .filter(|o| !o.ends_with('/'))
                    .cloned()
                    .collect()
            },
            output_directories: if v21 {
                Vec::new()
            } else {
                outputs
                    .iter()
                    .filter(|o| o.ends_with('/'))
                    .map(|o| o.trim_end_matches('/').to_string())
                    .collect()
            },
            output_paths: if v21 {
                outputs
                    .iter()
                    .map(|o| o.trim_end_matches('/').to_string())
                    .collect()
            } else {
                Vec::new()
            },
            platform: sorted_platform(&self.platform),
            working_directory: self.workdir.clone(),
            output_node_properties: Vec::new(),
            output_directory_format: 0,
        }
    }

    /// Runs the command with this input root, writing its outputs under
    /// `out_dir` (each output path relative to it). `skip_cache` forces an
    /// execution even when the ActionCache has an entry.
    pub fn run(
        &self,
        client: &Client,
        input: InputRoot,
        out_dir: &Path,
        skip_cache: bool,
    ) -> Result<ActionOutcome, ActionError> {
        let start = Instant::now();
        let (result, mut outcome) = self.execute(client, input, skip_cache)?;
        let ad = outcome.action_digest.clone();
        outcome.downloaded_bytes =
            fetch_outputs(client, &result, &self.outputs, out_dir).map_err(|e| ActionError {
                message: format!("{} (action {ad})", e.message),
                action_digest: ad.clone(),
                engine_error: false,
            })?;
        outcome.elapsed = start.elapsed();
        Ok(outcome)
    }

    /// Runs the action whose only output is its whole input root (the
    /// output directory `.`, which engines capture as one Tree) and returns
    /// that tree's entries without downloading any file: the caller
    /// compares them with the input it sent and downloads only what
    /// changed ([`Client::download`] verifies each blob).
    pub fn run_root(
        &self,
        client: &Client,
        input: InputRoot,
        skip_cache: bool,
    ) -> Result<(ActionOutcome, BTreeMap<String, TreeEntry>), ActionError> {
        let (result, outcome) = self.execute(client, input, skip_cache)?;
        let ad = outcome.action_digest.clone();
        let bad = |e: RemoteError| ActionError {
            message: format!("{} (action {ad})", e.message),
            action_digest: ad.clone(),
            engine_error: false,
        };
        let root = result
            .output_directories
            .iter()
            .find(|d| d.path == "." || d.path.is_empty())
            .and_then(|d| d.tree_digest.clone())
            .ok_or_else(|| {
                bad(RemoteError::new(
                    "the engine's result lacks the root directory",
                ))
            })?;
        let bytes = client
            .download(std::slice::from_ref(&root))
            .map_err(bad)?
            .remove(&root.hash)
            .unwrap_or_default();
        let mut walked = Walked::default();
        walked
            .add_tree(client.digest_fn(), &bytes, ".", Path::new(""))
            .map_err(bad)?;
        let Walked { files, dirs, links } = walked;
        let text = |p: &Path| p.to_string_lossy().into_owned();
        let mut out = BTreeMap::new();
        for d in dirs {
            out.insert(text(&d), TreeEntry::Dir);
        }
        for f in files {
            out.insert(text(&f.path), TreeEntry::File(f.digest, f.exec));
        }
        for (l, target) in links {
            out.insert(text(&l), TreeEntry::Symlink(target));
        }
        Ok((outcome, out))
    }

    /// Uploads what the engine misses and executes the action (or finds
    /// it in the ActionCache); a non-zero exit is an error.
    fn execute(
        &self,
        client: &Client,
        input: InputRoot,
        skip_cache: bool,
    ) -> Result<(re::ActionResult, ActionOutcome), ActionError> {
        let start = Instant::now();
        let f = client.digest_fn();
        let engine = |action: &str, e: RemoteError| ActionError {
            message: if action.is_empty() {
                e.message
            } else {
                format!("{} (action {action})", e.message)
            },
            action_digest: action.to_string(),
            engine_error: true,
        };
        let (root, mut blobs) = input.finish();
        let (cmd_digest, cmd_bytes) = f.message(&self.command_message(client));
        let action = re::Action {
            command_digest: Some(cmd_digest.clone()),
            input_root_digest: Some(root),
            timeout: self.timeout.map(|t| PbDuration {
                seconds: t.as_secs() as i64,
                nanos: t.subsec_nanos() as i32,
            }),
            do_not_cache: false,
            salt: Vec::new(),
            platform: sorted_platform(&self.platform),
        };
        let (action_digest, action_bytes) = f.message(&action);
        let ad = digest_str(&action_digest);
        blobs.insert(
            cmd_digest.hash.clone(),
            (cmd_digest, crate::tree::Blob::Bytes(cmd_bytes.into())),
        );
        blobs.insert(
            action_digest.hash.clone(),
            (
                action_digest.clone(),
                crate::tree::Blob::Bytes(action_bytes.into()),
            ),
        );

        // The ActionCache first: a hit needs no upload at all.
        let mut cached = None;
        if !skip_cache {
            cached = client
                .get_action_result(&action_digest)
                .map_err(|e| engine(&ad, e))?
                .filter(|r| r.exit_code == 0);
        }
        let mut uploaded = 0u64;
        let (result, was_cached) = match cached {
            Some(r) => (r, true),
            None => {
                let all: Vec<re::Digest> = blobs.values().map(|(d, _)| d.clone()).collect();
                let missing = client.find_missing(&all).map_err(|e| engine(&ad, e))?;
                // Read as they are sent: a root filesystem in the input
                // root is never in memory at once.
                let up = missing.iter().filter_map(|d| {
                    let (_, b) = blobs.get(&d.hash)?;
                    Some(b.read().map(|data| {
                        uploaded += data.len() as u64;
                        (d.clone(), data)
                    }))
                });
                client.upload_each(up).map_err(|e| engine(&ad, e))?;
                let ex = client
                    .execute(&action_digest, skip_cache)
                    .map_err(|e| engine(&ad, e))?;
                (ex.result, ex.cached)
            }
        };
        let stdout = read_log(client, &result.stdout_raw, result.stdout_digest.as_ref());
        let stderr = read_log(client, &result.stderr_raw, result.stderr_digest.as_ref());
        if result.exit_code != 0 {
            let text =
                String::from_utf8_lossy(&stderr).to_string() + &String::from_utf8_lossy(&stdout);
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            return Err(ActionError {
                message: format!(
                    "the command exited with code {} on {} (action {ad}):\n{}",
                    result.exit_code,
                    client.url().display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ),
                action_digest: ad,
                engine_error: false,
            });
        }
        let outcome = ActionOutcome {
            action_digest: ad,
            cached: was_cached,
            uploaded_bytes: uploaded,
            downloaded_bytes: 0,
            elapsed: start.elapsed(),
            stdout,
            stderr,
        };
        Ok((result, outcome))
    }
}

fn read_log(client: &Client, raw: &[u8], digest: Option<&re::Digest>) -> Vec<u8> {
    if !raw.is_empty() {
        return raw.to_vec();
    }
    match digest {
        Some(d) if d.size_bytes > 0 => client
            .download(std::slice::from_ref(d))
            .ok()
            .and_then(|mut m| m.remove(&d.hash))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

struct Planned {
    path: PathBuf,
    digest: re::Digest,
    exec: bool,
}

#[allow(deprecated)] // output_file_symlinks: still sent by pre-2.1 engines.
/// Downloads and verifies every output, then writes them (all or nothing:
/// files go to a staging directory beside `out_dir` first).
fn fetch_outputs(
    client: &Client,
    result: &re::ActionResult,
    declared: &[String],
    out_dir: &Path,
) -> Result<u64, RemoteError> {
    let f = client.digest_fn();
    let mut walked = Walked::default();
    for o in &result.output_files {
        let d = o.digest.clone().unwrap_or_default();
        walked.files.push(Planned {
            path: safe_rel(&o.path)?,
            digest: d,
            exec: o.is_executable,
        });
    }
    for l in result
        .output_symlinks
        .iter()
        .chain(&result.output_file_symlinks)
    {
        walked.links.push((safe_rel(&l.path)?, l.target.clone()));
    }
    // Trees: fetch each Tree message, index its children by digest.
    let tree_digests: Vec<re::Digest> = result
        .output_directories
        .iter()
        .filter_map(|d| d.tree_digest.clone())
        .collect();
    let trees = client.download(&tree_digests)?;
    for od in &result.output_directories {
        let base = safe_rel(&od.path)?;
        let td = od.tree_digest.clone().unwrap_or_default();
        let bytes = trees.get(&td.hash).cloned().unwrap_or_default();
        walked.add_tree(f, &bytes, &od.path, &base)?;
        walked.dirs.push(base);
    }
    let Walked { files, dirs, links } = walked;
    // Every declared output must be there.
    for want in declared {
        let w = want.trim_end_matches('/');
        let present = files.iter().any(|p| p.path == Path::new(w))
            || dirs.iter().any(|p| p == Path::new(w))
            || links.iter().any(|(p, _)| p == Path::new(w));
        if !present {
            return Err(RemoteError::new(format!(
                "the engine's result lacks the declared output `{want}`"
            )));
        }
    }
    let digests: Vec<re::Digest> = files.iter().map(|p| p.digest.clone()).collect();
    // `download` verifies every blob against its digest.
    let blobs = client.download(&digests)?;
    let parent = out_dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .map_err(|e| RemoteError::new(format!("{}: {e}", parent.display())))?;
    let stage = tempfile::Builder::new()
        .prefix(".charly-remote-")
        .tempdir_in(parent)
        .map_err(|e| RemoteError::new(format!("{}: {e}", parent.display())))?;
    let io = |p: &Path, e: std::io::Error| RemoteError::new(format!("{}: {e}", p.display()));
    let mut total = 0u64;
    for d in &dirs {
        let p = stage.path().join(d);
        std::fs::create_dir_all(&p).map_err(|e| io(&p, e))?;
    }
    for pl in &files {
        let p = stage.path().join(&pl.path);
        if let Some(par) = p.parent() {
            std::fs::create_dir_all(par).map_err(|e| io(par, e))?;
        }
        let data = blobs
            .get(&pl.digest.hash)
            .map(Vec::as_slice)
            .unwrap_or_default();
        client.verify(&pl.digest, data)?;
        total += data.len() as u64;
        std::fs::write(&p, data).map_err(|e| io(&p, e))?;
        use std::os::unix::fs::PermissionsExt;
        let mode = if pl.exec { 0o755 } else { 0o644 };
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io(&p, e))?;
    }
    for (l, target) in &links {
        let p = stage.path().join(l);
        if let Some(par) = p.parent() {
            std::fs::create_dir_all(par).map_err(|e| io(par, e))?;
        }
        std::os::unix::fs::symlink(target, &p).map_err(|e| io(&p, e))?;
    }
    // Verified: move into place.
    std::fs::create_dir_all(out_dir).map_err(|e| io(out_dir, e))?;
    for entry in std::fs::read_dir(stage.path()).map_err(|e| io(stage.path(), e))? {
        let entry = entry.map_err(|e| io(stage.path(), e))?;
        let dest = out_dir.join(entry.file_name());
        if dest.is_dir() && !dest.is_symlink() {
            std::fs::remove_dir_all(&dest).map_err(|e| io(&dest, e))?;
        } else if dest.symlink_metadata().is_ok() {
            std::fs::remove_file(&dest).map_err(|e| io(&dest, e))?;
        }
        std::fs::rename(entry.path(), &dest).map_err(|e| io(&dest, e))?;
    }
    Ok(total)
}

/// What output trees hold: files, directories, symlinks.
#[derive(Default)]
struct Walked {
    files: Vec<Planned>,
    dirs: Vec<PathBuf>,
    links: Vec<(PathBuf, String)>,
}

impl Walked {
    /// Adds what the Tree message `bytes` (the output directory `what`)
    /// holds, under `base`.
    fn add_tree(
        &mut self,
        f: crate::client::DigestFn,
        bytes: &[u8],
        what: &str,
        base: &Path,
    ) -> Result<(), RemoteError> {
        let tree = re::Tree::decode(bytes).map_err(|e| {
            RemoteError::new(format!("output directory {what}: bad Tree message: {e}"))
        })?;
        let children: BTreeMap<String, re::Directory> = tree
            .children
            .iter()
            .map(|c| (f.message(c).0.hash, c.clone()))
            .collect();
        walk_tree(
            &tree.root.unwrap_or_default(),
            base,
            &children,
            &mut self.files,
            &mut self.dirs,
            &mut self.links,
            0,
        )
    }
}

fn walk_tree(
    d: &re::Directory,
    base: &Path,
    children: &BTreeMap<String, re::Directory>,
    files: &mut Vec<Planned>,
    dirs: &mut Vec<PathBuf>,
    links: &mut Vec<(PathBuf, String)>,
    depth: usize,
) -> Result<(), RemoteError> {
    if depth > 256 {
        return Err(RemoteError::new("output tree is deeper than 256 levels"));
    }
    for f in &d.files {
        files.push(Planned {
            path: base.join(safe_name(&f.name)?),
            digest: f.digest.clone().unwrap_or_default(),
            exec: f.is_executable,
        });
    }
    for s in &d.symlinks {
        links.push((base.join(safe_name(&s.name)?), s.target.clone()));
    }
    for c in &d.directories {
        let h = c
            .digest
            .as_ref()
            .map(|x| x.hash.clone())
            .unwrap_or_default();
        let child = children.get(&h).ok_or_else(|| {
            RemoteError::new(format!("output tree lacks directory {} ({h})", c.name))
        })?;
        let p = base.join(safe_name(&c.name)?);
        dirs.push(p.clone());
        walk_tree(child, &p, children, files, dirs, links, depth + 1)?;
    }
    Ok(())
}

fn safe_name(n: &str) -> Result<&str, RemoteError> {
    if n.is_empty() || n == "." || n == ".." || n.contains('/') {
        return Err(RemoteError::new(format!(
            "bad name `{n}` in an output tree"
        )));
    }
    Ok(n)
}

fn safe_rel(p: &str) -> Result<PathBuf, RemoteError> {
    let parts: Vec<&str> = p
        .split('/')
        .filter(|x| !x.is_empty() && *x != ".")
        .collect();
    if parts.is_empty() || parts.contains(&"..") || p.starts_with('/') {
        return Err(RemoteError::new(format!(
            "bad output path `{p}` from the engine"
        )));
    }
    Ok(parts.iter().collect())
}
