//! A builder stage as one REAPI action.
//!
//! A stage is a one-stage Containerfile rendered from the builder's
//! `stage_template` (`FROM <builder image> AS <stage>`, then `USER`,
//! `WORKDIR`, `ENV`, `COPY [--chown]` and `RUN [--mount=type=cache,…]`).
//! REAPI knows commands, not Containerfiles, so the stage is interpreted:
//! [`parse`] reads the instructions and [`script`] turns them into one POSIX
//! shell script that performs them in order inside the builder image and
//! ends by writing a tar of every export path to `charly-out/<i>.tar` under
//! the input root. The caller turns those tars into the artifact exactly as
//! the podman runner turns `podman cp` output into it, so both produce the
//! same artifact bytes (the end-to-end test compares them).
//!
//! How each instruction is carried out:
//!
//! * `FROM`: the image the action runs in (see [`StageMode`]); exactly one.
//! * `ENV k=v …` (and the legacy `ENV k v`): exported for later steps,
//!   values expanded by the shell as Docker expands them from earlier `ENV`s.
//! * `WORKDIR`: created, and the directory later relative paths and `RUN`s
//!   use.
//! * `USER u[:g]`: later `RUN`s run as that user (numeric, or a name looked
//!   up in the image's `/etc/passwd`); `HOME` comes from the passwd entry
//!   unless an `ENV` set it. Switching needs `setpriv` in the image and the
//!   privilege to use it; where the sandbox runs the action as a fixed user
//!   without that privilege (bubblewrap, as in CI here), the step runs as
//!   the sandbox's user and a note goes to the action's stderr. Ownership
//!   of the artifact never depends on it: every file is given the box
//!   user's uid:gid when the tar is written. For the same reason, where the
//!   sandbox cannot give files to other users (bubblewrap maps one uid),
//!   `chown`, `chgrp` and `install -o/-g` leave owners alone with a note
//!   (shell functions before each `RUN`'s command, and the same as
//!   commands first on `PATH` for the programs it starts), so a stage that
//!   hands its work directory to the box user, as the npm stage does,
//!   runs. What needs root's other privileges (a package manager) still
//!   fails in such a sandbox: the failure is the command's, so it is
//!   reported and never retried locally; those stages need an engine that
//!   runs actions in containers or as root, and to keep stages local on
//!   such an engine, leave out `--remote-stage-rootfs` (with
//!   `--remote-no-image-property`, stages are not sent).
//! * `COPY [--chown=u:g] src… dst`: the sources (files or directories
//!   relative to the build context) travel in the input root under
//!   `charly-ctx/` and are copied with Docker's rules (a directory's
//!   contents; into `dst/` when it ends in `/` or there are several
//!   sources). Modes are 0755 for executables and 0644 otherwise, because
//!   REAPI trees carry only the executable bit.
//! * `RUN [--mount=type=cache,target=…] cmd` (shell or JSON form): `sh -c`
//!   in the working directory; a cache mount is an empty directory for the
//!   duration of the step, and whatever was at that path before is put back
//!   afterwards, so cache contents never reach the artifact, as with podman.
//! * `RUN --mount=type=bind,[from=<layer>,]source=…,target=…`: a copy of
//!   that path of the context (or of the layer stage) at the target for the
//!   duration of the step.
//! * Earlier stages: only layer stages as charly writes them for a candy's
//!   files (`FROM scratch AS <candy>` + `COPY <dir>/ /`); `COPY --from=` and
//!   bind mounts `from=` them read that directory of the context.
//! * `LABEL`, `EXPOSE`, `CMD`, `ENTRYPOINT`, `VOLUME`, `STOPSIGNAL`,
//!   `HEALTHCHECK`, `MAINTAINER`: image metadata, no effect on files; skipped.
//! * Anything else (`ARG`, `ADD`, `SHELL`, `ONBUILD`, `COPY --from` an
//!   image, other mount types, an earlier stage that is not a layer) is
//!   refused with the line it is on, and the stage is not sent.

use std::collections::BTreeMap;
use std::path::Path;

use crate::client::RemoteError;
use crate::tree::InputRoot;
use charly_text::sh::quote_min_pct;

/// How a stage action gets its builder image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageMode {
    /// `container-image=docker://<builder image>` as a platform property:
    /// for engines that run each action in a container of that image
    /// (Buildbarn, BuildBuddy, NativeLink, EngFlow). The image must be
    /// pullable by the engine.
    ImageProperty,
    /// The builder image's root filesystem is the input root, so the
    /// action's `/` is the image: for engines that only sandbox commands
    /// (buildbox-run with bubblewrap). Costs one upload of the image's
    /// files per engine (the CAS deduplicates); the engine must not
    /// bind-mount host directories over the image's.
    Rootfs,
}

/// A `RUN --mount=type=cache` target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheMount {
    /// Where it is mounted.
    pub target: String,
    /// `uid=`, `gid=` and `mode=`, as given.
    pub uid: Option<String>,
    /// Group.
    pub gid: Option<String>,
    /// Mode (octal).
    pub mode: Option<String>,
}

/// A `RUN --mount`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// `type=cache`: an empty directory for the step.
    Cache(CacheMount),
    /// `type=bind` of a path of the build context (directly, or through a
    /// layer stage's `from=`): a copy at `target` for the step.
    Bind {
        /// Path relative to the build context.
        src: String,
        /// Where it appears.
        target: String,
    },
}

/// One instruction that changes the stage's files or environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `ENV`: (name, value as a shell word).
    Env(Vec<(String, String)>),
    /// `WORKDIR` (a shell word).
    Workdir(String),
    /// `USER` user\[:group\].
    User(String),
    /// `ARG name[=default]` (layers only): the build argument's value (a
    /// shell word), in the environment of later steps, not the image's.
    Arg(String, String),
    /// `ADD <tar> <dir>` of a tar archive of the context (layers only):
    /// unpacked into the directory.
    AddTar {
        /// The archive, relative to the build context.
        src: String,
        /// Where it is unpacked (an absolute literal path).
        dst: String,
    },
    /// `COPY` (also `COPY --from=<layer stage>`).
    Copy {
        /// `--chown` value.
        chown: Option<String>,
        /// `--chmod` value (octal).
        chmod: Option<String>,
        /// Sources, relative to the build context (literal paths; those of
        /// `--from=` resolved through the layer stage).
        srcs: Vec<String>,
        /// Destination (a shell word).
        dst: String,
    },
    /// `RUN`.
    Run {
        /// Its mounts.
        mounts: Vec<Mount>,
        /// The command, for `sh -c`.
        command: String,
    },
}

/// A parsed stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// The `FROM` image.
    pub from: String,
    /// Its steps, in order.
    pub steps: Vec<Step>,
    /// Instructions of the last stage that change only the image's
    /// configuration (`EXPOSE`, `LABEL`, `CMD`, …): name (upper case) and
    /// the rest of the line. A builder stage ignores them; a layer's
    /// configuration takes them.
    pub config: Vec<(String, String)>,
    /// Earlier stages made of copies to absolute paths, by name: (context
    /// path, destination) of each. Steps read them as `/<name>/<path>`
    /// sources, which [`add_sources`] composes under [`CTX_DIR`].
    pub composed: BTreeMap<String, Vec<(String, String)>>,
}

/// Logical lines: continuations joined, comments and blank lines dropped,
/// each with the 1-based number of its first physical line.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && cur.is_none()) {
            continue;
        }
        if trimmed.is_empty() {
            continue;
        }
        let (body, more) = match raw.trim_end().strip_suffix('\\') {
            Some(b) => (b, true),
            None => (raw.trim_end(), false),
        };
        match &mut cur {
            Some((_, s)) => {
                s.push(' ');
                s.push_str(body.trim_start());
            }
            None => cur = Some((i + 1, body.trim_start().to_string())),
        }
        if !more && let Some(done) = cur.take() {
            out.push(done);
        }
    }
    out.extend(cur);
    out
}

/// Splits into words as written (quotes and backslashes kept), respecting
/// single and double quotes and backslash escapes.
fn raw_words(s: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
                continue;
            }
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (Some('\''), _) => {}
            (_, '\\') => {
                cur.push(c);
                match chars.next() {
                    Some(n) => cur.push(n),
                    None => return Err("a trailing backslash".into()),
                }
                in_word = true;
                continue;
            }
            _ => {}
        }
        cur.push(c);
        in_word = true;
    }
    if quote.is_some() {
        return Err("an unterminated quote".into());
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// The words of an instruction's arguments, each as its literal value;
/// a word that needs the shell (a variable, a glob) is refused.
pub fn words(s: &str) -> Result<Vec<String>, String> {
    raw_words(s)?
        .iter()
        .map(|w| {
            literal(w)
                .ok_or_else(|| format!("`{w}` needs the shell; only literal words are taken here"))
        })
        .collect()
}

/// A word's literal value (quotes removed, escapes resolved); `None` if it
/// needs the shell (a `$` outside single quotes, or a glob character).
fn literal(word: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = word.chars();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (Some('\''), c) => out.push(c),
            (_, '\\') => out.push(chars.next()?),
            (_, '$') => return None,
            (None, '*' | '?' | '[') => return None,
            (_, c) => out.push(c),
        }
    }
    Some(out)
}

fn flag<'a>(word: &'a str, name: &str) -> Option<&'a str> {
    word.strip_prefix("--")?
        .strip_prefix(name)?
        .strip_prefix('=')
}

fn parse_mount(spec: &str, layers: &BTreeMap<String, String>) -> Result<Mount, String> {
    let mut kind = "bind";
    let (mut from, mut source) = (None, String::new());
    let mut m = CacheMount {
        target: String::new(),
        uid: None,
        gid: None,
        mode: None,
    };
    for part in spec.split(',') {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        match k {
            "type" => kind = v,
            "target" | "dst" | "destination" => m.target = v.to_string(),
            "source" | "src" => source = v.to_string(),
            "from" => from = Some(v.to_string()),
            "uid" => m.uid = Some(v.to_string()),
            "gid" => m.gid = Some(v.to_string()),
            "mode" => m.mode = Some(v.to_string()),
            "id" | "sharing" | "readonly" | "ro" | "rw" | "readwrite" => {}
            other => return Err(format!("mount option `{other}` is not supported")),
        }
    }
    if !m.target.starts_with('/') {
        return Err(format!(
            "a mount needs an absolute target, not `{}`",
            m.target
        ));
    }
    match kind {
        "cache" => Ok(Mount::Cache(m)),
        "bind" => Ok(Mount::Bind {
            src: context_path(from.as_deref(), &source, layers)?,
            target: m.target,
        }),
        other => Err(format!("`--mount=type={other}` is not supported")),
    }
}

/// A path of the build context, or of a layer stage (`from`), as a path
/// relative to the build context.
fn context_path(
    from: Option<&str>,
    path: &str,
    layers: &BTreeMap<String, String>,
) -> Result<String, String> {
    let base = match from {
        None => String::new(),
        Some(name) => layers
            .get(name)
            .cloned()
            .ok_or_else(|| format!("`from={name}` names no layer stage before it"))?,
    };
    let rel = path.trim_start_matches('/');
    if rel.split('/').any(|p| p == "..") {
        return Err(format!("`{path}` leaves the build context"));
    }
    let joined = [base.trim_end_matches('/'), rel]
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("/");
    Ok(if joined.is_empty() {
        ".".into()
    } else {
        joined
    })
}

/// An earlier stage as charly writes it for a candy's files (`FROM
/// scratch AS <candy>` with `COPY <dir>/ /`): the context directory it
/// holds.
fn layer_dir(image: &str, steps: &[Step]) -> Option<String> {
    match steps {
        [
            Step::Copy {
                chown: None,
                chmod: None,
                srcs,
                dst,
            },
        ] if image == "scratch" && dst == "/" && srcs.len() == 1 => {
            Some(srcs[0].trim_end_matches('/').to_string())
        }
        _ => None,
    }
}

/// Reads a stage Containerfile. Errors name the line.
///
/// The last stage is the one that runs. Earlier stages may only be layer
/// stages (see `layer_dir`); `COPY --from=` and `RUN --mount=type=bind,from=`
/// of the last stage read the context directory they hold.
pub fn parse(containerfile: &str) -> Result<Stage, String> {
    parse_with(containerfile, None)
}

/// [`parse`], for a layer: `ARG` is taken (before the first `FROM`, where
/// only `FROM` lines could use it, it is skipped; in the last stage its
/// value comes from `build_args`, else its default).
pub fn parse_layer(
    containerfile: &str,
    build_args: &BTreeMap<String, String>,
) -> Result<Stage, String> {
    parse_with(containerfile, Some(build_args))
}

fn parse_with(
    containerfile: &str,
    build_args: Option<&BTreeMap<String, String>>,
) -> Result<Stage, String> {
    let mut from: Option<(usize, String, Option<String>)> = None;
    let mut config = Vec::new();
    let mut composed = BTreeMap::new();
    let mut layers: BTreeMap<String, String> = BTreeMap::new();
    let mut steps = Vec::new();
    for (line, text) in logical_lines(containerfile) {
        let at = |m: String| format!("line {line}: {m}");
        let (word, rest) = text
            .split_once(char::is_whitespace)
            .map_or((text.as_str(), ""), |(w, r)| (w, r.trim()));
        let step = match word.to_ascii_uppercase().as_str() {
            "FROM" => {
                if let Some((l, image, alias)) = from.take() {
                    let (name, dir) = layer_stage(l, &image, alias, &steps, &mut composed)?;
                    layers.insert(name, dir);
                    steps.clear();
                    config.clear();
                }
                let (image, alias) = parse_from(rest).map_err(at)?;
                from = Some((line, image, alias));
                continue;
            }
            "ARG" if build_args.is_some() && from.is_none() => continue,
            _ if from.is_none() => return Err(at(format!("{word} before FROM"))),
            "ARG" if build_args.is_some() => {
                parse_arg(rest, build_args.unwrap_or(&BTreeMap::new()))
            }
            "ENV" => parse_env(rest),
            "WORKDIR" => parse_workdir(rest),
            "USER" => parse_user(rest),
            "COPY" => parse_copy(rest, &layers),
            "ADD" if build_args.is_some() => parse_add(rest),
            "RUN" => parse_run(rest, &layers),
            "LABEL" | "EXPOSE" | "CMD" | "ENTRYPOINT" | "VOLUME" | "STOPSIGNAL" | "HEALTHCHECK"
            | "MAINTAINER" => {
                config.push((word.to_ascii_uppercase(), rest.to_string()));
                continue;
            }
            other => Err(format!(
                "{other} is not supported in a builder stage run remotely"
            )),
        };
        steps.push(step.map_err(at)?);
    }
    let (_, from, _) = from.ok_or("no FROM")?;
    Ok(Stage {
        from,
        steps,
        config,
        composed,
    })
}

/// The stage of the `FROM` on line `l`, ended by a later `FROM`, as a layer
/// stage: its name and the context directory it holds.
fn layer_stage(
    l: usize,
    image: &str,
    alias: Option<String>,
    steps: &[Step],
    composed: &mut BTreeMap<String, Vec<(String, String)>>,
) -> Result<(String, String), String> {
    let named = || {
        alias
            .clone()
            .ok_or_else(|| format!("line {l}: a layer stage needs a name"))
    };
    if let Some(dir) = layer_dir(image, steps) {
        return Ok((named()?, dir));
    }
    let files = composed_files(image, steps).ok_or_else(|| {
        format!(
            "line {l}: only the last stage runs remotely; an earlier stage must be \
             `FROM scratch AS <name>` with plain `COPY <path> <absolute path>` steps"
        )
    })?;
    let name = named()?;
    composed.insert(name.clone(), files);
    // Read through the composed directory (see `Stage::composed`).
    Ok((name.clone(), format!("/{name}")))
}

/// An earlier stage of plain copies to absolute paths (`FROM scratch AS
/// <name>`, `COPY <path> /<dest>` …, as charly writes the init
/// fragments): (context path, destination) of each.
fn composed_files(image: &str, steps: &[Step]) -> Option<Vec<(String, String)>> {
    if image != "scratch" || steps.is_empty() {
        return None;
    }
    steps
        .iter()
        .map(|s| match s {
            Step::Copy {
                chown: None,
                chmod: None,
                srcs,
                dst,
            } if srcs.len() == 1
                && dst.starts_with('/')
                && literal(dst).as_deref() == Some(dst) =>
            {
                Some((srcs[0].clone(), dst.clone()))
            }
            _ => None,
        })
        .collect()
}

/// `FROM image [AS name]`: the image and the stage's name.
fn parse_from(rest: &str) -> Result<(String, Option<String>), String> {
    let words = raw_words(rest)?;
    match words.as_slice() {
        [image] => Ok((image.clone(), None)),
        [image, as_, name] if as_.eq_ignore_ascii_case("as") => {
            Ok((image.clone(), Some(name.clone())))
        }
        _ => Err(format!("FROM {rest} is not supported")),
    }
}

/// `ENV name=value…`, or the legacy `ENV name value…` (the rest of the
/// line); every name must be a variable name.
fn parse_env(rest: &str) -> Result<Step, String> {
    let words = raw_words(rest)?;
    let mut pairs = Vec::new();
    if words.first().is_some_and(|w| !w.contains('=')) {
        // Legacy `ENV name value…`: the rest of the line.
        let name = words[0].clone();
        let value = rest[name.len()..].trim();
        pairs.push((name, quote_min_pct(value)));
    } else {
        for w in &words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| format!("ENV word `{w}` is not name=value"))?;
            pairs.push((k.to_string(), v.to_string()));
        }
    }
    for (k, _) in &pairs {
        if k.is_empty()
            || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || k.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(format!("`{k}` is not a variable name"));
        }
    }
    Ok(Step::Env(pairs))
}

/// `ARG name[=default]`: the value `build_args` gives, else the default
/// (a literal), else empty; quoted for the shell.
fn parse_arg(rest: &str, build_args: &BTreeMap<String, String>) -> Result<Step, String> {
    let words = raw_words(rest)?;
    let [word] = words.as_slice() else {
        return Err(format!("ARG {rest}: one name[=default] per ARG"));
    };
    let (name, default) = match word.split_once('=') {
        Some((n, d)) => (
            n,
            Some(literal(d).ok_or_else(|| format!("ARG {rest}: the default must be a literal"))?),
        ),
        None => (word.as_str(), None),
    };
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("ARG {rest}: `{name}` is not a variable name"));
    }
    let value = build_args
        .get(name)
        .cloned()
        .or(default)
        .unwrap_or_default();
    Ok(Step::Arg(name.to_string(), quote_min_pct(&value)))
}

/// `ADD <tar> <dir>`: only a plain `.tar`/`.tar.gz`/`.tgz` path of the
/// context unpacked into an absolute directory (what charly writes for
/// builder artifacts); anything else `ADD` does (URLs, plain files) is
/// refused.
fn parse_add(rest: &str) -> Result<Step, String> {
    let words = words(rest)?;
    let [src, dst] = words.as_slice() else {
        return Err(format!(
            "ADD {rest}: only `ADD <archive> <dir>` is supported"
        ));
    };
    let is_tar = [".tar", ".tar.gz", ".tgz"].iter().any(|x| src.ends_with(x));
    if !is_tar || src.contains("://") || !dst.starts_with('/') {
        return Err(format!(
            "ADD {rest}: only a tar archive of the context unpacked into an absolute directory is supported"
        ));
    }
    let src = context_path(None, src, &BTreeMap::new())
        .map_err(|_| format!("ADD source `{src}` must be a plain path inside the context"))?;
    Ok(Step::AddTar {
        src,
        dst: dst.clone(),
    })
}

/// `WORKDIR path`: a literal path quoted for the shell, else the word in
/// double quotes (the shell expands its variables).
fn parse_workdir(rest: &str) -> Result<Step, String> {
    if rest.is_empty() {
        return Err("WORKDIR without a path".into());
    }
    let word = literal(rest).map_or_else(|| format!("\"{rest}\""), |l| quote_min_pct(&l));
    Ok(Step::Workdir(word))
}

/// `USER user[:group]`: one literal word.
fn parse_user(rest: &str) -> Result<Step, String> {
    let u = literal(rest)
        .filter(|u| !u.is_empty() && !u.contains(char::is_whitespace))
        .ok_or_else(|| format!("USER {rest} is not supported"))?;
    Ok(Step::User(u))
}

/// `COPY [--chown=…] [--from=<layer>] src… dst`: plain source paths inside
/// the context (or the layer stage's directory).
fn parse_copy(rest: &str, layers: &BTreeMap<String, String>) -> Result<Step, String> {
    let words = raw_words(rest)?;
    let mut chown = None;
    let mut chmod = None;
    let mut layer = None;
    let mut args = Vec::new();
    for w in words {
        if let Some(v) = flag(&w, "chown") {
            chown = Some(literal(v).ok_or_else(|| format!("--chown={v}"))?);
        } else if let Some(v) = flag(&w, "chmod") {
            if v.is_empty() || v.len() > 4 || !v.chars().all(|c| ('0'..='7').contains(&c)) {
                return Err(format!("COPY --chmod={v}: an octal mode"));
            }
            chmod = Some(v.to_string());
        } else if let Some(v) = flag(&w, "from") {
            if !layers.contains_key(v) {
                return Err(format!("COPY --from={v} names no layer stage before it"));
            }
            layer = Some(v.to_string());
        } else if w.starts_with("--") {
            return Err(format!("COPY {w} is not supported"));
        } else {
            args.push(w);
        }
    }
    let Some((dst, srcs)) = args.split_last().filter(|(_, s)| !s.is_empty()) else {
        return Err("COPY needs a source and a destination".into());
    };
    let srcs = srcs
        .iter()
        .map(|s| {
            literal(s)
                .and_then(|l| context_path(layer.as_deref(), &l, layers).ok())
                .ok_or_else(|| {
                    format!(
                        "COPY source `{s}` must be a plain path inside the context \
                         (no variables, globs or `..`)"
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Step::Copy {
        chown,
        chmod,
        srcs,
        dst: dst.clone(),
    })
}

/// `RUN [--mount=…]… command`, the command in shell or JSON form.
fn parse_run(rest: &str, layers: &BTreeMap<String, String>) -> Result<Step, String> {
    let mut rest = rest;
    let mut mounts = Vec::new();
    while rest.starts_with("--") {
        let (w, r) = rest
            .split_once(char::is_whitespace)
            .map_or((rest, ""), |(w, r)| (w, r.trim_start()));
        let spec = flag(w, "mount").ok_or_else(|| format!("RUN {w} is not supported"))?;
        mounts.push(parse_mount(spec, layers)?);
        rest = r;
    }
    let command = if rest.starts_with('[') {
        let argv: Vec<String> =
            serde_json::from_str(rest).map_err(|e| format!("RUN in JSON form: {e}"))?;
        argv.iter()
            .map(|a| quote_min_pct(a))
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        rest.to_string()
    };
    if command.is_empty() {
        return Err("RUN without a command".into());
    }
    Ok(Step::Run { mounts, command })
}

/// The preamble every stage script starts with: the input root, the user
/// to run as, and the helpers of the steps.
const PRELUDE: &str = r#"set -eu
umask 022
charly_root=$(pwd)
charly_wd=/
charly_user=
charly_home_set=${HOME:+1}
# Helpers keep their variables under charly_ (none is exported), so a
# stage's own ENV names are never touched.
charly_ids() { # user[:group] -> "uid gid home"
    charly_u=${1%%:*}; charly_g=; case $1 in *:*) charly_g=${1#*:};; esac
    charly_line=$(awk -F: -v u="$charly_u" '$1 == u || $3 == u { print; exit }' /etc/passwd 2>/dev/null || :)
    if [ -n "$charly_line" ]; then
        charly_uid=$(echo "$charly_line" | cut -d: -f3)
        charly_gid=$(echo "$charly_line" | cut -d: -f4)
        charly_home=$(echo "$charly_line" | cut -d: -f6)
    else
        case $charly_u in *[!0-9]*|'') echo "charly: user $charly_u is not in /etc/passwd" >&2; exit 1;; esac
        charly_uid=$charly_u; charly_gid=0; charly_home=/
    fi
    if [ -n "$charly_g" ]; then
        case $charly_g in
        *[!0-9]*) charly_gid=$(awk -F: -v g="$charly_g" '$1 == g { print $3; exit }' /etc/group 2>/dev/null || :)
                  [ -n "$charly_gid" ] || { echo "charly: group $charly_g is not in /etc/group" >&2; exit 1; };;
        *) charly_gid=$charly_g;;
        esac
    fi
    echo "$charly_uid $charly_gid ${charly_home:-/}"
}
charly_chown() { # owner path...
    charly_o=$1; shift
    set -- $(charly_ids "$charly_o") "$@"
    charly_og="$1:$2"; shift 3
    chown -R "$charly_og" "$@" 2>/dev/null || echo "charly: could not chown $* to $charly_og in this sandbox (the artifact's owner is set when it is written)" >&2
}
# A sandbox that cannot give files to other users (one uid mapped, as
# bubblewrap maps it) gets chown, chgrp and install -o/-g that leave owners
# alone, with a note: a stage's artifact is given the box user's owner when
# it is written, so no owner set inside reaches it. They are functions
# defined before each RUN's command (busybox sh runs its applets before
# anything on PATH) and, for the programs a RUN starts, the same functions
# as commands first on PATH.
charly_shims=
if [ -n "$charly_want_shims" ] && ! { : > "$charly_root/charly-probe" && chown 1:1 "$charly_root/charly-probe"; } 2>/dev/null; then
charly_tool() { # how the shims call the real tool: its path, or busybox's applet
    charly_t=$(command -v "$1" 2>/dev/null || :)
    case $charly_t in /*) echo "'$charly_t'";; *) echo "command $1";; esac
}
charly_shim_funcs="chown() { $(charly_tool chown) \"\$@\" 2>/dev/null || echo \"charly: chown \$* left as it is in this sandbox (the artifact owner is set when it is written)\" >&2; }
chgrp() { $(charly_tool chgrp) \"\$@\" 2>/dev/null || echo \"charly: chgrp \$* left as it is in this sandbox (the artifact owner is set when it is written)\" >&2; }
install() {
    charly_skip=
    for charly_a do
        shift
        if [ -n \"\$charly_skip\" ]; then charly_skip=; continue; fi
        case \$charly_a in
        -o|-g|--owner|--group) charly_skip=1; continue;;
        --owner=*|--group=*|-o?*|-g?*) continue;;
        esac
        set -- \"\$@\" \"\$charly_a\"
    done
    $(charly_tool install) \"\$@\"
}"
    charly_shims="$charly_root/charly-shims"
    mkdir -p "$charly_shims"
    for charly_c in chown chgrp install; do
        printf '#!/bin/sh\n%s\n%s "$@"\n' "$charly_shim_funcs" "$charly_c" > "$charly_shims/$charly_c"
        chmod 0755 "$charly_shims/$charly_c"
    done
fi
rm -f "$charly_root/charly-probe"
charly_modes() { # source-dir dest-dir: 0755/0644 for what was copied
    for charly_p in "$1"/* "$1"/.[!.]* "$1"/..?*; do
        charly_q="$2/${charly_p##*/}"
        if [ -L "$charly_q" ] || [ ! -e "$charly_q" ]; then continue; fi
        chmod -R u=rwX,go=rX "$charly_q"
    done
}
charly_run() { # command
    (
        cd "$charly_wd"
        if [ -n "$charly_shims" ]; then
            PATH="$charly_shims:$PATH"; export PATH
            set -- "$charly_shim_funcs
$1"
        fi
        charly_me=$(id -u)
        if [ -n "$charly_user" ]; then
            set -- "$1" $(charly_ids "$charly_user")
            [ -n "$charly_home_set" ] || { HOME=$4; export HOME; }
            if [ "$2" != "$charly_me" ]; then
                if command -v setpriv >/dev/null 2>&1 && setpriv --reuid="$2" --regid="$3" --clear-groups true 2>/dev/null; then
                    exec setpriv --reuid="$2" --regid="$3" --clear-groups /bin/sh -c "$1"
                fi
                echo "charly: cannot switch to user $charly_user in this sandbox; running as uid $charly_me" >&2
            fi
        elif [ -z "$charly_home_set" ]; then
            HOME=/root; export HOME
        fi
        exec /bin/sh -c "$1"
    )
}
charly_mount_begin() { # target [source to copy there]
    if [ -e "$1" ] || [ -L "$1" ]; then mv "$1" "$1.charly-kept"; fi
    mkdir -p "$1"
    if [ -n "${2:-}" ]; then
        if [ -d "$2" ]; then cp -R "$2"/. "$1"/; else rmdir "$1" && cp "$2" "$1"; fi
    fi
}
charly_mount_end() { # target [bind]: what was there is back; a cache mount's target stays a directory, a bind mount's made for it goes, as with podman
    rm -rf "$1"
    if [ -e "$1.charly-kept" ] || [ -L "$1.charly-kept" ]; then mv "$1.charly-kept" "$1"; elif [ -z "${2:-}" ]; then mkdir -p "$1"; fi
}
"#;

/// How a script deals with owners the sandbox cannot give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// In a sandbox that cannot give files to other users, `chown`,
    /// `chgrp` and `install -o/-g` leave owners alone with a note (a
    /// builder stage's artifact gets its owner when written).
    Shims,
    /// `COPY --chown` (and cache mounts' owners) are recorded in
    /// `/charly-out/owners` (`uid gid path` lines) instead of applied, for
    /// whoever writes the result to give; so is every path a `RUN` as
    /// another user creates (the sandbox runs it as its own user, with
    /// that user's `HOME`). Any other `chown` is the sandbox's own (a
    /// layer: one it cannot do fails the step).
    Record,
}

/// [`Owners::Record`]'s `charly_chown`, defined over the prelude's.
const RECORD_OWNERS: &str = r#"mkdir -p "$charly_root/charly-out"
charly_chown() { # owner path...: recorded, for charly to give when it writes the layer
    charly_o=$1; shift
    set -- $(charly_ids "$charly_o") "$@"
    charly_og="$1 $2"; shift 3
    find "$@" | sed "s|^|$charly_og |" >> "$charly_root/charly-out/owners"
}
charly_paths() { # [find action]: every path of the image (not charly's own directories)
    find / -xdev \( -path /charly-ctx -o -path /charly-meta -o -path /charly-out -o -path /charly-shims \) -prune -o "${1:--print}"
}
charly_step() { # command: a RUN as another user is run as the sandbox's, what it creates recorded as that user's
    if [ -z "$charly_user" ]; then charly_run "$1"; return; fi
    set -- "$1" $(charly_ids "$charly_user")
    if [ "$2" = "$(id -u)" ]; then charly_run "$1"; return; fi
    charly_paths > "$charly_root/charly-out/before"
    charly_run "$1"
    charly_paths | awk -v og="$2 $3" 'NR == FNR { seen[$0] = 1; next } !($0 in seen) { print og " " $0 }' "$charly_root/charly-out/before" - >> "$charly_root/charly-out/owners"
    rm -f "$charly_root/charly-out/before"
}
"#;

/// Where COPY sources travel in the input root.
pub const CTX_DIR: &str = "charly-ctx";
/// Where the export tars are written (the action's output directory).
pub const OUT_DIR: &str = "charly-out";

/// The shell script that performs the stage's steps and writes one tar per
/// export path (`charly-out/<i>.tar`, entries relative to the path's
/// parent, as `podman cp` writes them). `home_set`: the image's
/// environment sets `HOME`.
pub fn script(stage: &Stage, export: &[String]) -> String {
    let mut s = steps_script(stage, Owners::Shims);
    s.push_str(&format!("mkdir -p \"$charly_root\"/{OUT_DIR}\n"));
    for (i, path) in export.iter().enumerate() {
        let p = path.trim_end_matches('/');
        let path = Path::new(p);
        let parent = path
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "/".into());
        let base = path
            .file_name()
            .map(|b| b.to_string_lossy().into_owned())
            .unwrap_or_else(|| ".".into());
        s.push_str(&format!(
            "tar -C {} -cf \"$charly_root\"/{OUT_DIR}/{i}.tar {}\n",
            quote_min_pct(&parent),
            quote_min_pct(&base)
        ));
    }
    s
}

/// The script that performs the stage's steps, from the prelude on;
/// `owners` says what becomes of owners the sandbox cannot give.
pub fn steps_script(stage: &Stage, owners: Owners) -> String {
    let mut s = format!(
        "charly_want_shims={}\n{PRELUDE}",
        if owners == Owners::Shims { "1" } else { "" }
    );
    match owners {
        Owners::Record => s.push_str(RECORD_OWNERS),
        Owners::Shims => s.push_str("charly_step() { charly_run \"$1\"; }\n"),
    }
    for step in &stage.steps {
        match step {
            Step::Env(pairs) => {
                for (k, v) in pairs {
                    s.push_str(&format!("export {k}={v}\n"));
                    if k == "HOME" {
                        s.push_str("charly_home_set=1\n");
                    }
                }
            }
            Step::Workdir(w) => {
                s.push_str(&format!(
                    "cd \"$charly_wd\" && mkdir -p {w} && cd {w} && charly_wd=$(pwd) && cd /\n"
                ));
            }
            Step::User(u) => {
                s.push_str(&format!(
                    "charly_ids {q} >/dev/null\ncharly_user={q}\n",
                    q = quote_min_pct(u)
                ));
            }
            Step::Arg(k, v) => s.push_str(&format!("{k}={v}; export {k}\n")),
            Step::AddTar { src, dst } => {
                let from = format!("\"$charly_root\"/{CTX_DIR}/{}", quote_min_pct(src));
                let dst = quote_min_pct(dst);
                let unzip = if src.ends_with(".tar") {
                    "cat"
                } else {
                    "gzip -dc"
                };
                s.push_str(&format!(
                    "mkdir -p {dst} && {unzip} {from} | tar -xof - -C {dst}\n"
                ));
            }
            Step::Copy {
                chown,
                chmod,
                srcs,
                dst,
            } => {
                let into_dir = srcs.len() > 1 || dst.ends_with('/');
                s.push_str(&format!("cd \"$charly_wd\"\ncharly_dst={dst}\n"));
                for src in srcs {
                    let from = format!(
                        "\"$charly_root\"/{}/{}",
                        CTX_DIR,
                        quote_min_pct(src.trim_end_matches('/'))
                    );
                    let base = Path::new(src.trim_end_matches('/'))
                        .file_name()
                        .map(|b| quote_min_pct(&b.to_string_lossy()))
                        .unwrap_or_default();
                    s.push_str(&format!(
                        "if [ -d {from} ]; then\n    mkdir -p \"$charly_dst\" && cp -R {from}/. \"$charly_dst\"/\n    charly_new=\"$charly_dst\"\n    charly_modes {from} \"$charly_dst\"\n"
                    ));
                    // A file goes into the destination when it ends in `/`,
                    // there are several sources, or it is a directory
                    // already (`COPY x .`), as BuildKit does.
                    let into = if into_dir { "true" } else { "false" };
                    s.push_str(&format!(
                        "elif {into} || [ -d \"$charly_dst\" ]; then\n    mkdir -p \"$charly_dst\" && cp {from} \"$charly_dst\"/ && charly_new=\"$charly_dst\"/{base}\n    chmod u=rw,go=r \"$charly_new\" && if [ -x {from} ]; then chmod a+x \"$charly_new\"; fi\n\
                         else\n    case $charly_dst in */*) mkdir -p \"${{charly_dst%/*}}\";; esac\n    cp {from} \"$charly_dst\" && charly_new=\"$charly_dst\"\n    chmod u=rw,go=r \"$charly_new\" && if [ -x {from} ]; then chmod a+x \"$charly_new\"; fi\n"
                    ));
                    s.push_str("fi\n");
                    if let Some(mode) = chmod {
                        s.push_str(&format!("chmod -R {mode} \"$charly_new\"\n"));
                    }
                    if let Some(owner) = chown {
                        s.push_str(&format!(
                            "charly_chown {} \"$charly_new\"\n",
                            quote_min_pct(owner)
                        ));
                    }
                }
                s.push_str("cd /\n");
            }
            Step::Run { mounts, command } => {
                for m in mounts {
                    match m {
                        Mount::Cache(m) => {
                            let t = quote_min_pct(&m.target);
                            s.push_str(&format!("charly_mount_begin {t}\n"));
                            if m.uid.is_some() || m.gid.is_some() {
                                let owner = format!(
                                    "{}:{}",
                                    m.uid.as_deref().unwrap_or("0"),
                                    m.gid.as_deref().unwrap_or("0")
                                );
                                s.push_str(&format!(
                                    "charly_chown {} {t}\n",
                                    quote_min_pct(&owner)
                                ));
                            }
                            if let Some(mode) = &m.mode {
                                s.push_str(&format!("chmod {} {t}\n", quote_min_pct(mode)));
                            }
                        }
                        Mount::Bind { src, target } => {
                            s.push_str(&format!(
                                "charly_mount_begin {t} \"$charly_root\"/{CTX_DIR}/{src}\n",
                                t = quote_min_pct(target),
                                src = quote_min_pct(src)
                            ));
                        }
                    }
                }
                s.push_str(&format!("charly_step {}\n", quote_min_pct(command)));
                for m in mounts.iter().rev() {
                    let (target, kind) = match m {
                        Mount::Cache(CacheMount { target, .. }) => (target, ""),
                        Mount::Bind { target, .. } => (target, " bind"),
                    };
                    s.push_str(&format!(
                        "charly_mount_end {}{kind}\n",
                        quote_min_pct(target)
                    ));
                }
            }
        }
    }
    s
}

/// Adds every COPY source of `stage` (relative to `context`) to `input`
/// under [`CTX_DIR`].
pub fn add_sources(
    stage: &Stage,
    context: &Path,
    input: &mut InputRoot,
) -> Result<(), RemoteError> {
    for step in &stage.steps {
        let srcs: Vec<&String> = match step {
            Step::Copy { srcs, .. } => srcs.iter().collect(),
            Step::AddTar { src, .. } => vec![src],
            Step::Run { mounts, .. } => mounts
                .iter()
                .filter_map(|m| match m {
                    Mount::Bind { src, .. } => Some(src),
                    Mount::Cache(_) => None,
                })
                .collect(),
            _ => continue,
        };
        for src in srcs {
            let src = src.trim_end_matches('/');
            if let Some(inside) = src.strip_prefix('/') {
                add_composed(stage, inside, context, input)?;
                continue;
            }
            let local = context.join(src);
            let at = if src == "." {
                CTX_DIR.to_string()
            } else {
                format!("{CTX_DIR}/{src}")
            };
            add_source(input, &at, &local)?;
        }
    }
    Ok(())
}

/// Adds a source file or directory of the context at `at`.
fn add_source(input: &mut InputRoot, at: &str, local: &Path) -> Result<(), RemoteError> {
    let err = |e: std::io::Error| RemoteError::new(format!("COPY source {}: {e}", local.display()));
    let meta = std::fs::metadata(local).map_err(err)?;
    if meta.is_dir() {
        input.add_dir(at, local)
    } else {
        use std::os::unix::fs::PermissionsExt;
        let data = std::fs::read(local).map_err(err)?;
        input.add_bytes(at, data, meta.permissions().mode() & 0o111 != 0)
    }
}

/// Adds what `name/rel` of a composed stage holds (every copy at or under
/// it, or the copy it is inside) at `CTX_DIR/name/…`.
fn add_composed(
    stage: &Stage,
    path: &str,
    context: &Path,
    input: &mut InputRoot,
) -> Result<(), RemoteError> {
    let (name, rel) = path.split_once('/').unwrap_or((path, ""));
    let files = stage.composed.get(name).ok_or_else(|| {
        RemoteError::new(format!("`{name}` is not a stage of this Containerfile"))
    })?;
    for (src, dst) in files {
        let d = dst.trim_matches('/');
        let wanted = rel.is_empty()
            || d == rel
            || d.starts_with(&format!("{rel}/"))
            || rel.starts_with(&format!("{d}/"));
        if !wanted {
            continue;
        }
        let local = context.join(src);
        let at = format!("{CTX_DIR}/{name}/{d}");
        add_source(input, &at, &local)?;
    }
    Ok(())
}

/// The environment of the action: the image's (`KEY=VALUE` entries), with
/// the default `PATH` container builds use when the image sets none.
pub fn environment(image_env: &[String]) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = image_env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.entry("PATH".into())
        .or_insert_with(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    const NPM: &str = r#"FROM localhost/node-builder:1 AS npm-cowsay
USER root
RUN install -d -o 1000 -g 1000 /home/user
USER 1000
WORKDIR /home/user
# a comment
ENV NPM_CONFIG_PREFIX=/home/user/.npm-global NPM_CONFIG_CACHE=/tmp/npm-cache
COPY --chown=1000:1000 candy/cowsay/package.json /tmp/charly-npm/package.json
RUN --mount=type=cache,dst=/tmp/npm-cache,uid=1000,gid=1000 node -e 'x' | \
    xargs -r npm install --global
"#;

    #[test]
    fn parses_the_npm_stage() {
        let s = parse(NPM).expect("parses");
        assert_eq!(s.from, "localhost/node-builder:1");
        assert_eq!(
            s.steps,
            vec![
                Step::User("root".into()),
                Step::Run {
                    mounts: vec![],
                    command: "install -d -o 1000 -g 1000 /home/user".into()
                },
                Step::User("1000".into()),
                Step::Workdir("/home/user".into()),
                Step::Env(vec![
                    ("NPM_CONFIG_PREFIX".into(), "/home/user/.npm-global".into()),
                    ("NPM_CONFIG_CACHE".into(), "/tmp/npm-cache".into()),
                ]),
                Step::Copy {
                    chmod: None,
                    chown: Some("1000:1000".into()),
                    srcs: vec!["candy/cowsay/package.json".into()],
                    dst: "/tmp/charly-npm/package.json".into(),
                },
                Step::Run {
                    mounts: vec![Mount::Cache(CacheMount {
                        target: "/tmp/npm-cache".into(),
                        uid: Some("1000".into()),
                        gid: Some("1000".into()),
                        mode: None,
                    })],
                    command: "node -e 'x' |  xargs -r npm install --global".into(),
                },
            ]
        );
    }

    #[test]
    fn layer_stages_feed_copy_from_and_bind_mounts() {
        let s = parse(
            "# builder stage for candy greet\nFROM scratch AS greet\nCOPY candy/greet/ /\n\n\
             FROM img AS greet-demo\nCOPY --from=greet demo.json /tmp/x.json\n\
             RUN --mount=type=bind,from=greet,source=/,target=/ctx cat /ctx/demo.json\n",
        )
        .expect("parses");
        assert_eq!(s.from, "img");
        assert_eq!(
            s.steps,
            vec![
                Step::Copy {
                    chmod: None,
                    chown: None,
                    srcs: vec!["candy/greet/demo.json".into()],
                    dst: "/tmp/x.json".into(),
                },
                Step::Run {
                    mounts: vec![Mount::Bind {
                        src: "candy/greet".into(),
                        target: "/ctx".into(),
                    }],
                    command: "cat /ctx/demo.json".into(),
                },
            ]
        );
    }

    #[test]
    fn quoting_in_env_and_json_run() {
        let s = parse(
            "FROM x\nENV A=\"a b\" B='$c' C=d\\ e\nRUN [\"printf\", \"%s\\\\n\", \"it's\"]\n",
        )
        .expect("parses");
        assert_eq!(
            s.steps[0],
            Step::Env(vec![
                ("A".into(), "\"a b\"".into()),
                ("B".into(), "'$c'".into()),
                ("C".into(), "d\\ e".into()),
            ])
        );
        assert_eq!(
            s.steps[1],
            Step::Run {
                mounts: vec![],
                command: r"printf '%s\n' 'it'\''s'".into()
            }
        );
        let legacy = parse("FROM x\nENV GREETING hello world\n").expect("parses");
        assert_eq!(
            legacy.steps[0],
            Step::Env(vec![("GREETING".into(), "'hello world'".into())])
        );
    }

    #[test]
    fn unsupported_instructions_name_their_line() {
        for (text, want) in [
            ("FROM a\nARG X\n", "line 2: ARG is not supported"),
            (
                "FROM a\nFROM b\n",
                "line 1: only the last stage runs remotely",
            ),
            (
                "FROM scratch AS l\nCOPY a/ /\nRUN true\nFROM b\n",
                "line 1: only the last stage runs remotely",
            ),
            (
                "FROM a\nCOPY --from=nope x /y\n",
                "line 2: COPY --from=nope names no layer stage",
            ),
            (
                "FROM a\nCOPY src/*.json /y/\n",
                "line 2: COPY source `src/*.json`",
            ),
            ("FROM a\nCOPY ../x /y\n", "line 2: COPY source `../x`"),
            (
                "FROM a\n\nRUN --mount=type=secret,target=/x true\n",
                "line 3: `--mount=type=secret`",
            ),
            (
                "FROM a\nRUN --mount=type=bind,from=l,target=/x true\n",
                "line 2: `from=l` names no layer stage",
            ),
            (
                "FROM a\nRUN --network=none true\n",
                "line 2: RUN --network=none",
            ),
            ("FROM a\nENV A=\"x\n", "line 2: an unterminated quote"),
            ("USER x\n", "line 1: USER before FROM"),
            ("# nothing\n", "no FROM"),
        ] {
            let e = parse(text).expect_err(text);
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
        // Metadata instructions are accepted and leave no step.
        let s = parse("FROM a\nLABEL a=b\nCMD [\"x\"]\nEXPOSE 80\n").expect("parses");
        assert!(s.steps.is_empty());
    }

    /// Runs the generated script with the host's sh in a scratch root
    /// (absolute paths of the stage rewritten under it), which checks the
    /// shell the script is made of, not just its text.
    #[test]
    fn the_script_runs_and_exports() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path();
        let r = root.display().to_string();
        std::fs::create_dir_all(root.join(CTX_DIR).join("pkg/sub")).expect("mkdir");
        std::fs::write(root.join(CTX_DIR).join("pkg/a.json"), "{}").expect("write");
        std::fs::write(root.join(CTX_DIR).join("pkg/sub/b"), "b").expect("write");
        {
            // Modes the context happens to have are not what a COPY gives.
            use std::os::unix::fs::PermissionsExt;
            let ctx = root.join(CTX_DIR);
            std::fs::set_permissions(ctx.join("pkg/a.json"), PermissionsExt::from_mode(0o600))
                .expect("chmod");
            std::fs::set_permissions(ctx.join("pkg/sub/b"), PermissionsExt::from_mode(0o700))
                .expect("chmod");
        }
        std::fs::create_dir_all(root.join("cache")).expect("mkdir");
        std::fs::write(root.join("cache/kept"), "image content").expect("write");
        let text = format!(
            "FROM img AS s\nWORKDIR {r}/work\nENV OUT={r}/out GREETING=\"hello there\"\n\
             COPY pkg/a.json pkg/sub ./in/\nCOPY pkg/a.json {r}/single.json\nCOPY pkg/a.json .\n\
             RUN --mount=type=cache,target={r}/cache mkdir -p \"$OUT\" && echo \"$GREETING\" > \"$OUT/greeting\" \
             && cp in/a.json in/b \"$OUT/\" && ln -s greeting \"$OUT/link\" && echo x > {r}/cache/junk && pwd > \"$OUT/pwd\"\n\
             RUN --mount=type=bind,source=pkg,target={r}/bound cp {r}/bound/sub/b \"$OUT/bound\"\n"
        );
        let stage = parse(&text).expect("parses");
        let sh = script(&stage, &[format!("{r}/out/")]);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&sh)
            .current_dir(root)
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            sh
        );
        let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
        assert_eq!(read("out/greeting"), "hello there\n");
        assert_eq!(read("out/a.json"), "{}");
        assert_eq!(read("out/b"), "b");
        assert_eq!(read("single.json"), "{}");
        assert_eq!(read("work/a.json"), "{}");
        let mode = |p: &str| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(root.join(p))
                .expect(p)
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("single.json"), 0o644);
        assert_eq!(mode("work/in/a.json"), 0o644);
        assert_eq!(mode("work/in/b"), 0o755);
        assert_eq!(read("out/pwd"), format!("{r}/work\n"));
        // The cache mount's contents are gone and what was there is back.
        assert_eq!(read("cache/kept"), "image content");
        assert!(!root.join("cache/junk").exists());
        // A bind mount's copy is there for its step only, and the mount
        // point made for it goes too: podman's layers do not hold it.
        assert_eq!(read("out/bound"), "b");
        assert!(!root.join("bound").exists());
        let tar = std::fs::read(root.join(OUT_DIR).join("0.tar")).expect("export tar");
        let mut ar = tar::Archive::new(&tar[..]);
        let names: Vec<String> = ar
            .entries()
            .expect("tar")
            .map(|e| {
                let e = e.expect("tar member");
                let p = e
                    .path()
                    .expect("member path")
                    .to_string_lossy()
                    .into_owned();
                format!("/{}", p.trim_start_matches("./").trim_matches('/'))
            })
            .collect();
        for want in [
            "/out",
            "/out/greeting",
            "/out/link",
            "/out/a.json",
            "/out/b",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
    }

    /// The helpers never touch a stage's own variables, even ones with
    /// short common names.
    #[test]
    fn stage_variables_survive_the_helpers() {
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path();
        std::fs::create_dir_all(root.join(CTX_DIR)).expect("mkdir");
        std::fs::write(root.join(CTX_DIR).join("f"), "x").expect("write");
        let r = root.display().to_string();
        let text = format!(
            "FROM x\nENV u=mine g=ours uid=7 home=/h line=l p=q\nUSER 0:0\n\
             COPY --chown=0:0 f {r}/f\nCOPY f {r}/d/\n\
             RUN echo \"$u $g $uid $home $line $p\" > {r}/vars\n"
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script(&parse(&text).expect("parses"), &[]))
            .current_dir(root)
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read_to_string(root.join("vars")).expect("vars"),
            "mine ours 7 /h l q\n"
        );
    }

    /// Where the sandbox refuses to give files to other users, `chown`,
    /// `chgrp` and `install -o/-g` leave owners alone and the step goes
    /// on; everything else `install` was asked reaches it unchanged.
    #[test]
    fn a_sandbox_that_cannot_chown_gets_shims_that_leave_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tmp");
        let root = tmp.path().join("root");
        let bin = tmp.path().join("bin");
        std::fs::create_dir_all(&root).expect("mkdir");
        std::fs::create_dir_all(&bin).expect("mkdir");
        let log = tmp.path().join("install.log");
        for (name, body) in [
            (
                "chown",
                "echo \"chown: $*: Invalid argument\" >&2; exit 1".to_string(),
            ),
            ("chgrp", "exit 1".to_string()),
            (
                "install",
                format!(
                    "printf '%s|' \"$@\" >> {}; echo >> {}",
                    log.display(),
                    log.display()
                ),
            ),
        ] {
            let p = bin.join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write");
            std::fs::set_permissions(&p, PermissionsExt::from_mode(0o755)).expect("chmod");
        }
        let stage = parse(&format!(
            "FROM x\nUSER root\n\
             RUN install -d -o 1000 -g 1000 -m 0750 /home/user && install --owner=u --group=g a b && install -ou -gg c d\n\
             RUN chown -R 1000:1000 /nonexistent && chgrp 1000 /x && echo went on > {}\n",
            root.join("went-on").display()
        ))
        .expect("parses");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script(&stage, &[]))
            .current_dir(&root)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .output()
            .expect("sh");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(
            std::fs::read_to_string(&log).expect("install ran"),
            "-d|-m|0750|/home/user|\na|b|\nc|d|\n"
        );
        assert!(root.join("went-on").exists());
        assert!(
            stderr.contains("charly: chown -R 1000:1000 /nonexistent left as it is"),
            "{stderr}"
        );
    }

    /// Where the sandbox can chown (a root engine), nothing is shimmed.
    #[test]
    fn a_sandbox_that_can_chown_runs_the_real_tools() {
        let tmp = tempfile::tempdir().expect("tmp");
        let which = tmp.path().join("which");
        let stage = parse(&format!(
            "FROM x\nRUN command -v chown > {}\n",
            which.display()
        ))
        .expect("parses");
        let sh = script(&stage, &[]).replace("chown 1:1", "true");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(sh)
            .current_dir(tmp.path())
            .output()
            .expect("sh");
        assert!(out.status.success());
        let which = std::fs::read_to_string(&which).expect("which");
        assert!(!which.contains("charly-shims"), "{which}");
        assert!(!tmp.path().join("charly-shims").exists());
    }

    #[test]
    fn a_failing_run_fails_the_script() {
        let tmp = tempfile::tempdir().expect("tmp");
        let stage = parse("FROM x\nRUN echo before; false\nRUN echo never\n").expect("parses");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(script(&stage, &[]))
            .current_dir(tmp.path())
            .output()
            .expect("sh");
        assert!(!out.status.success());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("before") && !stdout.contains("never"),
            "{stdout}"
        );
    }

    /// An earlier stage of copies to absolute paths (the init fragments)
    /// is composed under the context directory: a bind mount of one of its
    /// directories sees exactly the files copied there.
    #[test]
    fn a_stage_of_copies_is_composed_for_later_steps() {
        let t = tempfile::tempdir().expect("tmp");
        for (rel, body) in [
            ("frag/01-a.conf", "a"),
            ("frag/02-b.conf", "b"),
            ("frag/extra", "x"),
        ] {
            std::fs::create_dir_all(t.path().join(rel).parent().expect("dir")).expect("mkdir");
            std::fs::write(t.path().join(rel), body).expect("w");
        }
        let s = parse_layer(
            "ARG PARENT\nFROM scratch AS conf\nCOPY frag/01-a.conf /supervisor/01-a.conf\n\
             COPY frag/02-b.conf /supervisor/02-b.conf\n\nFROM ${PARENT}\n\
             RUN --mount=type=bind,from=conf,source=/supervisor,target=/supervisor cat /supervisor/*\n",
            &BTreeMap::new(),
        )
        .expect("parses");
        let Step::Run { mounts, .. } = &s.steps[0] else {
            panic!("{:?}", s.steps)
        };
        assert_eq!(
            mounts[0],
            Mount::Bind {
                src: "/conf/supervisor".into(),
                target: "/supervisor".into()
            }
        );
        let mut input = InputRoot::new(crate::client::DigestFn::Sha256);
        add_sources(&s, t.path(), &mut input).expect("sources");
        assert_eq!(
            input.paths(),
            vec![
                "charly-ctx",
                "charly-ctx/conf",
                "charly-ctx/conf/supervisor",
                "charly-ctx/conf/supervisor/01-a.conf",
                "charly-ctx/conf/supervisor/02-b.conf",
            ]
        );
        assert!(
            parse_layer("FROM scratch AS x\nRUN true\nFROM y\n", &BTreeMap::new()).is_err(),
            "a stage that runs commands is not composed"
        );
    }
}
