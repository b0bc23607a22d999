//! The identifier rules: one place that says which names and tokens charly
//! accepts, checked once at load.
//!
//! **Why.** Names become paths (`.build/<box>/`, `_inline/<candy>/`), image
//! references (`localhost/<box>:<version>`), stage names (`FROM scratch AS
//! <candy>`), unit and file names (`<service>.conf`) and Containerfile tokens
//! (`ENV <key>=…`, `USER <user>`, `COPY <src> <dst>`). A name such as `../..`
//! or `x\nRUN touch /pwned` would let the project's text escape the output
//! directory or add instructions the YAML never asked for. So every identifier
//! is checked against the rule of its class **before** anything uses it, and a
//! project with a refused name is not used at all (the CLI refuses every
//! command but `validate`, which lists the problems).
//!
//! **The classes** follow the original's CUE schema (`charly/schema/*.cue`),
//! the reference wherever it is stricter than "no `..`":
//!
//! | class | rule | used for |
//! | --- | --- | --- |
//! | [`entity`] | `^[a-z0-9]+(-[a-z0-9]+)*$` (`#EntityRef`) | box, candy (and its directory), builder type, distro, format, init, import alias, volume |
//! | [`qualified_box`] | entities joined by `.` | `base:` / builder boxes naming another box (`ns.box`) |
//! | [`candy_ref`] | an entity, or `@host/org/repo[/sub…][:tag]` with each part checked (`#CandyRef`) | `candy:`, `require:` |
//! | [`distro_tag`] | `entity[:version]`, version `[a-z0-9][a-z0-9._-]*` | box `distro:` (`ubuntu:24.04`) |
//! | [`env_key`] | `^[A-Za-z_][A-Za-z0-9_]*$` (`#EnvVar`) | `env:` keys of candies, tasks, services, boxes |
//! | [`var_name`] | `^[A-Z_][A-Z0-9_]*$` (candy `var:`) | `var:` keys |
//! | [`user_name`] | `^[a-z_][a-z0-9_-]*\$?$` (POSIX login names) | box user, base user |
//! | [`unit_name`] | `^[A-Za-z0-9_@:.-]+$`, no leading `.`, no `..` | service names, `use_packaged:` units |
//! | [`bundle`] | `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$` | `charly bundle` names (ledger records, lock files) |
//! | [`path_segment`] | `^[A-Za-z0-9._+-]+$`, not `.` or `..` | each directory of a candy's path in the project |
//! | [`image_ref`] | `[A-Za-z0-9._:/@+-]` (and `${…}`), no `..` segment | external `base:`, `registry:`, `tag:` |
//! | [`token`] | no whitespace, no `\`, no control character, no Unicode line break | paths, URLs, package names, modes, caps: a single Containerfile/shell token |
//! | [`package`] | `[A-Za-z0-9@_][A-Za-z0-9@_+.:=<>*~/-]*` | packages, copr projects, modules, excludes, keys |
//! | [`path`] | a token without quotes, backticks or `$(` | task paths, `path_append:`, volume paths, home |
//! | [`port`] | `N` or `proto:N`, N 1-65535, proto `[a-z+-]+` (`#Port`) | a candy's `port:` (becomes `EXPOSE N`) |
//! | [`single_line`] | no control character (tab allowed), no Unicode line break, no trailing `\` | free text written on one line (comments, repo fields, service fields) |
//!
//! Free text that is meant to span lines (`cmd:`, `content:`, shell `init:`)
//! is not an identifier: the emitters stage it as a file or escape it for the
//! syntax it lands in (see the Containerfile emitter).
//!
//! A reference (`ns.box`, `@github.com/org/repo/candy/x:v1`) is not a
//! definition: its parts are checked, so a reference can never carry `..`,
//! `/` into a path, or a line break into an instruction.

use crate::diag::Diagnostic;
use crate::model::{BoxDef, DistroSection, Service, Shell, Task};
use crate::project::{CandyEntry, Namespace, Project};
use crate::source::Span;
use crate::yaml::{Node, OrderedMap, Spanned, Yaml};

/// What a name failed, in words (used after "`<value>` ").
pub type Why = &'static str;

fn is_lower_digit(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// A character that ends a line somewhere: ASCII controls (C0, DEL, C1) and
/// the Unicode line and paragraph separators.
pub fn is_line_break_like(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// `#EntityRef`: lowercase words of letters and digits joined by single `-`.
pub fn entity(s: &str) -> Result<(), Why> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.split('-')
            .all(|p| !p.is_empty() && p.bytes().all(is_lower_digit));
    if ok {
        Ok(())
    } else {
        Err("must be lowercase letters and digits in words joined by `-` (e.g. `my-box`)")
    }
}

/// A box reference: entities joined by `.` (`cachyos.cachyos`).
pub fn qualified_box(s: &str) -> Result<(), Why> {
    if !s.is_empty() && s.split('.').all(|p| entity(p).is_ok()) {
        Ok(())
    } else {
        Err("must be a box name, optionally qualified by import aliases (`ns.box`)")
    }
}

/// A candy reference: an entity, or `@host/org/repo[/sub…][:tag]`.
pub fn candy_ref(s: &str) -> Result<(), Why> {
    let Some(r) = s.strip_prefix('@') else {
        return entity(s).map_err(
            |_| "must be a candy name (lowercase words joined by `-`) or `@host/org/repo/…:tag`",
        );
    };
    remote_ref(r)
}

/// The part of a remote reference after `@`: `host/org/repo[/sub…][:tag]`.
pub fn remote_ref(r: &str) -> Result<(), Why> {
    const BAD: Why = "must be `@host/org/repo[/path][:tag]` with plain names (letters, digits, `.`, `_`, `-`; no `..`)";
    let (path, tag) = match r.rsplit_once(':') {
        Some((p, t)) if !t.contains('/') => (p, Some(t)),
        _ => (r, None),
    };
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() < 3 || parts.iter().any(|p| path_segment(p).is_err()) {
        return Err(BAD);
    }
    if let Some(t) = tag
        && (t.is_empty()
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+')))
    {
        return Err(BAD);
    }
    Ok(())
}

/// A distro tag: `name` or `name:version` (`ubuntu:24.04`).
pub fn distro_tag(s: &str) -> Result<(), Why> {
    const BAD: Why = "must be a distro name, optionally with `:version` (e.g. `ubuntu:24.04`)";
    let (name, version) = match s.split_once(':') {
        Some((n, v)) => (n, Some(v)),
        None => (s, None),
    };
    entity(name).map_err(|_| BAD)?;
    if let Some(v) = version {
        let mut b = v.bytes();
        let ok = matches!(b.next(), Some(c) if is_lower_digit(c))
            && b.all(|c| is_lower_digit(c) || matches!(c, b'.' | b'_' | b'-'))
            && !v.contains("..");
        if !ok {
            return Err(BAD);
        }
    }
    Ok(())
}

/// `#EnvVar` key: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn env_key(s: &str) -> Result<(), Why> {
    let mut b = s.bytes();
    if matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
    {
        Ok(())
    } else {
        Err("must be a variable name matching [A-Za-z_][A-Za-z0-9_]*")
    }
}

/// Candy `var:` key: `[A-Z_][A-Z0-9_]*`.
pub fn var_name(s: &str) -> Result<(), Why> {
    let mut b = s.bytes();
    if matches!(b.next(), Some(c) if c.is_ascii_uppercase() || c == b'_')
        && b.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_')
    {
        Ok(())
    } else {
        Err("must match [A-Z_][A-Z0-9_]*")
    }
}

/// A login name: `[a-z_][a-z0-9_-]*` with an optional trailing `$`.
pub fn user_name(s: &str) -> Result<(), Why> {
    let body = s.strip_suffix('$').unwrap_or(s);
    let mut b = body.bytes();
    if s.len() <= 32
        && matches!(b.next(), Some(c) if c.is_ascii_lowercase() || c == b'_')
        && b.all(|c| is_lower_digit(c) || matches!(c, b'_' | b'-'))
    {
        Ok(())
    } else {
        Err(
            "must be a login name: lowercase letters, digits, `_` and `-`, starting with a letter or `_`",
        )
    }
}

/// A systemd unit or service name (no path, no `..`).
pub fn unit_name(s: &str) -> Result<(), Why> {
    let ok = !s.is_empty()
        && s.len() <= 255
        && !s.starts_with('.')
        && !s.contains("..")
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'@' | b':' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err("must be a unit name: letters, digits, `_`, `@`, `:`, `.` and `-` (no path, no `..`)")
    }
}

/// One path component: `[A-Za-z0-9._+-]+`, not `.` or `..`.
pub fn path_segment(s: &str) -> Result<(), Why> {
    let ok = !s.is_empty()
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'));
    if ok {
        Ok(())
    } else {
        Err("must be a plain name: letters, digits, `.`, `_`, `+` and `-` (not `.` or `..`)")
    }
}

/// A deploy bundle's name (`charly bundle add NAME`): a letter or digit,
/// then letters, digits, `.`, `_` and `-`, at most 128 bytes. It names a
/// ledger record and, through it, lock files and pod units: never a path.
pub fn bundle(s: &str) -> Result<(), Why> {
    let ok = s.len() <= 128
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(
            "must start with a letter or digit and hold only letters, digits, `.`, `_` and `-` (at most 128)",
        )
    }
}

/// An image reference part (`quay.io/fedora/fedora:43`, `ghcr.io/org`, a tag).
pub fn image_ref(s: &str) -> Result<(), Why> {
    let ok = !s.is_empty()
        && s.len() <= 512
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '.' | '_' | '-' | ':' | '/' | '@' | '+' | '$' | '{' | '}')
        })
        && !s.split(['/', ':']).any(|p| p == "..");
    if ok {
        Ok(())
    } else {
        Err(
            "must be an image reference: letters, digits, `.`, `_`, `-`, `:`, `/`, `@` (no spaces, no `..`)",
        )
    }
}

/// A base: another box (`box`, `ns.box`) or an external image reference.
pub fn base_ref(s: &str) -> Result<(), Why> {
    qualified_box(s).or_else(|_| image_ref(s))
}

/// One token of a Containerfile or shell line: no whitespace, no control
/// character, no Unicode line break.
pub fn token(s: &str) -> Result<(), Why> {
    if s.chars()
        .any(|c| c.is_whitespace() || c == '\\' || is_line_break_like(c))
    {
        Err("must be one word: no spaces, backslashes, line breaks or control characters")
    } else {
        Ok(())
    }
}

/// A candy port: `N` or `proto:N` ([`parse_port`]). Checked
/// at load, not only by `validate`: a port the emitters cannot read would
/// otherwise drop its `EXPOSE` without a word.
pub fn port(s: &str) -> Result<(), Why> {
    match parse_port(s) {
        Some(_) => Ok(()),
        None => Err(
            "must be a number 1-65535, optionally with a protocol (`tcp:2222`, `udp:53`, `https+insecure:3000`)",
        ),
    }
}

/// A package name (or a copr project, a module, a key): a [`token`] of
/// `[A-Za-z0-9@_][A-Za-z0-9@_+.:=<>*~/-]*`. Package lists are rendered one
/// per continuation line by the vocabulary's templates, where a leading `#`
/// would turn the line into a comment and a shell character would change
/// the command.
pub fn package(s: &str) -> Result<(), Why> {
    let mut b = s.bytes();
    if matches!(b.next(), Some(c) if c.is_ascii_alphanumeric() || c == b'@' || c == b'_')
        && b.all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(
                    c,
                    b'@' | b'_'
                        | b'+'
                        | b'.'
                        | b':'
                        | b'='
                        | b'<'
                        | b'>'
                        | b'*'
                        | b'~'
                        | b'/'
                        | b'-'
                )
        })
    {
        Ok(())
    } else {
        Err(
            "must be a package name: letters, digits and `@_+.:=<>*~/-`, starting with a letter, digit, `@` or `_`",
        )
    }
}

/// A path: a [`token`] that is also safe inside shell double quotes (the
/// PATH lines of shell snippets, `export PATH="…"`): no quote, no backtick,
/// no `$(`. `$VAR` and `${VAR}` stay (they are expanded on purpose).
pub fn path(s: &str) -> Result<(), Why> {
    token(s)?;
    if s.contains(['"', '\'', '`']) || s.contains("$(") {
        Err("must be a path: no quotes, backticks or `$(`")
    } else {
        Ok(())
    }
}

/// Text written on one line: no control character but tab, no Unicode line
/// break.
pub fn single_line(s: &str) -> Result<(), Why> {
    if s.ends_with('\\') || s.chars().any(|c| c != '\t' && is_line_break_like(c)) {
        Err("must be on one line: no line breaks or control characters, no `\\` at the end")
    } else {
        Ok(())
    }
}

/// Checks every identifier of a loaded project. Each problem is an error at
/// the value (or, for fields the schema keeps without a position, at the
/// nearest enclosing entry).
pub fn check_project(p: &Project) -> Vec<Diagnostic> {
    use rayon::prelude::*;
    let mut c = Checker { out: Vec::new() };
    for n in &p.namespaces {
        c.namespace(n);
    }
    // Candies side by side (there may be thousands), reported in name order.
    let per_candy: Vec<Vec<Diagnostic>> = p
        .candies
        .par_iter()
        .map(|(_, e)| {
            let mut c = Checker { out: Vec::new() };
            c.candy(e);
            c.out
        })
        .collect();
    c.out.extend(per_candy.into_iter().flatten());
    c.out
}

struct Checker {
    out: Vec<Diagnostic>,
}

impl Checker {
    fn check(&mut self, span: Span, what: &str, value: &str, rule: fn(&str) -> Result<(), Why>) {
        if let Err(why) = rule(value) {
            self.out.push(Diagnostic::error(
                span,
                format!("{what} `{}` {why}", shown(value)),
            ));
        }
    }

    fn spanned(&mut self, v: &Spanned<String>, what: &str, rule: fn(&str) -> Result<(), Why>) {
        self.check(v.span, what, &v.value, rule);
    }

    fn namespace(&mut self, n: &Namespace) {
        for (name, b) in &n.boxes {
            let span = b.def.name.as_ref().map(|s| s.span).unwrap_or(b.span);
            self.check(span, "box name", name, entity);
            self.box_def(&b.def, b.span);
        }
        self.vocab(n);
        // Import aliases are checked where they are bound (`load`): an
        // alias that is not an entity is never bound.
    }

    /// The vocabulary's names: builder types, distros, formats, inits (they
    /// become stage names and paths). Entries carry no position of their
    /// own; the error points at the start of the file that defined them.
    fn vocab(&mut self, n: &Namespace) {
        let at = |kind: &str, name: &str| Span {
            file: n
                .vocab_origin
                .get(&format!("{kind}/{name}"))
                .copied()
                .unwrap_or_default(),
            line: 1,
            col: 1,
            ..Span::default()
        };
        for name in n.vocab.builder.keys() {
            self.check(at("builder", name), "builder", name, entity);
        }
        for (name, d) in &n.vocab.distro {
            let span = at("distro", name);
            self.check(span, "distro", name, entity);
            for f in d.format.keys() {
                self.check(span, "format", f, entity);
            }
            if let Some(i) = &d.inherits {
                self.spanned(i, "inherits", entity);
            }
        }
        for (name, i) in &n.vocab.init {
            let span = at("init", name);
            self.check(span, "init", name, entity);
            if let Some(s) = &i.stage_name {
                self.check(span, "stage_name", s, entity);
            }
            if let Some(f) = &i.fragment_dir {
                for seg in f.split('/') {
                    self.check(span, "fragment_dir", seg, path_segment);
                }
            }
            if let Some(h) = &i.header_file {
                self.check(span, "header_file", h, path);
            }
        }
    }

    fn box_def(&mut self, d: &BoxDef, at: Span) {
        if let Some(b) = &d.base {
            self.spanned(b, "base", base_ref);
        }
        if let Some(f) = &d.from {
            let rule: fn(&str) -> Result<(), Why> = |s| match s.strip_prefix("builder:") {
                Some(b) => entity(b),
                None => qualified_box(s),
            };
            self.spanned(f, "from", rule);
        }
        if let Some(b) = &d.bootstrap_builder_image {
            self.spanned(b, "bootstrap_builder_image", base_ref);
        }
        if let Some(ds) = &d.distro {
            for t in &ds.value.0 {
                self.check(ds.span, "distro", t, distro_tag);
            }
        }
        if let Some(bs) = &d.build {
            for f in &bs.value.0 {
                self.check(bs.span, "build format", f, entity);
            }
        }
        for (k, v) in d.builder.iter() {
            self.spanned(k, "builder type", entity);
            self.spanned(v, "builder box", base_ref);
        }
        for p in &d.produce {
            self.spanned(p, "builder type", entity);
        }
        for c in &d.candy {
            self.spanned(c, "candy reference", candy_ref);
        }
        if let Some(u) = &d.user {
            self.spanned(u, "user", user_name);
        }
        if let Some(h) = &d.home {
            self.check(at, "home", h, path);
        }
        for p in &d.port {
            self.spanned(p, "port", token);
        }
        if let Some(e) = &d.env {
            self.env_yaml(&e.0);
        }
        if let Some(pl) = &d.platform {
            for x in &pl.0 {
                self.check(at, "platform", x, image_ref);
            }
        }
        if let Some(t) = &d.tag {
            self.check(at, "tag", t, image_ref);
        }
        if let Some(r) = &d.registry {
            self.check(at, "registry", r, image_ref);
        }
        if let Some(v) = &d.version {
            self.spanned(v, "version", image_ref);
        }
    }

    /// A box `env:`: `K=V` strings or a mapping; keys are env keys.
    fn env_yaml(&mut self, n: &Node) {
        if let Some(items) = n.as_seq() {
            for it in items {
                if let Some(s) = it.as_str() {
                    let key = s.split_once('=').map_or(s, |(k, _)| k);
                    self.check(it.span, "env key", key, env_key);
                }
            }
        } else if let Some(m) = n.as_map() {
            for (k, _) in m {
                if let Some(s) = k.as_str() {
                    self.check(k.span, "env key", s, env_key);
                }
            }
        }
    }

    fn candy(&mut self, e: &CandyEntry) {
        let d = &e.def;
        let name_span = d.name.as_ref().map(|n| n.span).unwrap_or(e.span);
        if !e.key.contains('/') {
            self.check(name_span, "candy name", &e.name, entity);
        }
        if let Some(n) = &d.name {
            self.spanned(n, "candy name", entity);
        }
        if let Some(rel) = &e.rel_dir {
            for seg in rel.split('/').filter(|s| *s != e.name) {
                self.check(e.span, "candy directory", seg, path_segment);
            }
        }
        for r in d.require.iter().chain(d.candy.iter()) {
            self.spanned(r, "candy reference", candy_ref);
        }
        for (k, _) in d.env.iter() {
            self.spanned(k, "env key", env_key);
        }
        for (k, _) in d.var.iter() {
            self.spanned(k, "var", var_name);
        }
        for p in &d.path_append {
            self.spanned(p, "path_append entry", path);
        }
        for pk in &d.package {
            self.spanned(&pk.name, "package", package);
        }
        for (key, sec) in d.distro.iter() {
            self.distro_section(key, sec);
        }
        for t in &d.task {
            self.task(t, e.span);
        }
        for s in &d.service {
            self.service(s);
        }
        if let Some(sh) = &d.shell {
            self.shell(sh, e.span);
        }
        for p in &d.port {
            self.spanned(p, "port", port);
        }
        for v in &d.volume {
            self.spanned(&v.name, "volume name", entity);
            self.spanned(&v.path, "volume path", path);
        }
        if let Some(lp) = &d.localpkg {
            for (k, v) in lp.value.0.iter() {
                self.spanned(k, "localpkg format", entity);
                self.spanned(v, "localpkg source", single_line);
            }
        }
        if let Some(data) = &d.data {
            self.data_entries(data);
        }
    }

    /// A candy's distro section under `key`: the key's tags, packages,
    /// repos, package entries, options and AUR part.
    fn distro_section(&mut self, key: &Spanned<String>, sec: &DistroSection) {
        for t in crate::cascade::section_tags(&key.value) {
            self.check(key.span, "distro key", &t, distro_tag);
        }
        for pk in &sec.package {
            self.spanned(&pk.name, "package", package);
        }
        for r in &sec.repo {
            self.repo(r);
        }
        for s in sec
            .copr
            .iter()
            .chain(&sec.exclude)
            .chain(&sec.module)
            .chain(&sec.keys)
        {
            self.check(key.span, "package entry", s, package);
        }
        for s in &sec.option {
            self.check(key.span, "option", s, single_line);
        }
        if let Some(a) = &sec.aur {
            for pk in &a.package {
                self.spanned(&pk.name, "package", package);
            }
            for s in a.replace.iter() {
                self.check(key.span, "package entry", s, package);
            }
            for s in &a.option {
                self.check(key.span, "option", s, single_line);
            }
        }
    }

    /// One repo of a distro section: its keys and values.
    fn repo(&mut self, r: &Spanned<OrderedMap<String>>) {
        for (k, v) in r.value.iter() {
            self.spanned(k, "repo key", env_key);
            self.check(r.span, "repo value", v, single_line);
            // The name becomes a file name on hosts
            // (`sources.list.d/<name>.list`), signed_by a path.
            match k.value.as_str() {
                "name" => self.check(r.span, "repo name", v, path_segment),
                "signed_by" => self.check(r.span, "repo signed_by", v, path),
                _ => {}
            }
        }
    }

    /// A candy's service: its name, units, exec, env and one-line fields.
    fn service(&mut self, s: &Service) {
        self.spanned(&s.name, "service name", unit_name);
        let at = s.name.span;
        if let Some(u) = &s.use_packaged {
            self.spanned(u, "use_packaged", unit_name);
        }
        if let Some(x) = &s.exec {
            self.spanned(x, "exec", single_line);
        }
        for (k, v) in s.env.iter() {
            self.spanned(k, "env key", env_key);
            self.check(k.span, "env value", v, single_line);
        }
        for v in [
            &s.restart,
            &s.working_directory,
            &s.user,
            &s.stdout,
            &s.stop_timeout,
            &s.kind,
            &s.start_retry,
            &s.start_sec,
            &s.stop_signal,
            &s.exit_code,
            &s.priority,
        ]
        .into_iter()
        .flatten()
        {
            self.check(at, "service field", v, single_line);
        }
        for v in s.after.0.iter().chain(&s.before.0).chain(&s.wanted_by.0) {
            self.check(at, "unit", v, unit_name);
        }
        if let Some(ev) = &s.event {
            for v in &ev.0 {
                self.check(at, "event", v, token);
            }
        }
    }

    /// A candy's `shell:`: the paths of it and of each shell's part, at the
    /// candy's span `at`.
    fn shell(&mut self, sh: &Shell, at: Span) {
        for p in sh.path_append.iter().chain(sh.path.iter()) {
            self.check(at, "shell path", p, path);
        }
        for o in [&sh.bash, &sh.zsh, &sh.fish, &sh.sh].into_iter().flatten() {
            for p in o.path_append.iter().chain(o.path.iter()) {
                self.check(at, "shell path", p, path);
            }
        }
    }

    /// A candy's `data:` entries: their volume, src and dest (when `data:`
    /// is a list).
    fn data_entries(&mut self, data: &Yaml) {
        let Some(items) = data.0.as_seq() else {
            return;
        };
        for it in items {
            for (field, rule) in [
                ("volume", entity as fn(&str) -> Result<(), Why>),
                ("src", path),
                ("dest", path),
            ] {
                if let Some(v) = it.get(field)
                    && let Some(s) = v.as_str()
                {
                    self.check(v.span, &format!("data {field}"), s, rule);
                }
            }
        }
    }

    fn task(&mut self, t: &Task, at: Span) {
        for (verb, v) in t.verbs() {
            match verb {
                "cmd" => {}
                "download" => self.spanned(v, "download", token),
                "copy" | "build" | "plugin" => self.spanned(v, verb, token),
                _ => self.spanned(v, verb, path),
            }
        }
        for (what, v, rule) in [
            (
                "user",
                t.user.as_deref(),
                token as fn(&str) -> Result<(), Why>,
            ),
            ("mode", t.mode.as_deref(), token),
            ("to", t.to.as_deref(), path),
            ("target", t.target.as_deref(), path),
            ("extract", t.extract.as_deref(), token),
        ] {
            if let Some(v) = v {
                self.spanned(v, what, rule);
            }
        }
        if let Some(c) = &t.caps {
            self.spanned(c, "caps", single_line);
        }
        for c in &t.cache.0 {
            self.spanned(c, "cache", path);
        }
        for (k, v) in t.env.iter() {
            self.spanned(k, "env key", env_key);
            // A download's env lands inside its RUN line.
            self.spanned(v, "env value", single_line);
        }
        for s in t.include.iter().chain(&t.uninstall) {
            self.check(at, "path", s, path);
        }
        if let Some(c) = &t.comment {
            self.check(at, "comment", c, single_line);
        }
    }
}

/// A value as shown in a message: control characters escaped, long values cut.
fn shown(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i >= 80 {
            out.push('…');
            break;
        }
        if is_line_break_like(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses `8080` or `proto:2222` into (protocol, port), with the original
/// schema's syntax: a port 1-65535, the protocol `[a-z+-]+`
/// (`https+insecure:3000`). Whether the protocol is known is
/// `validate`'s `PORT_PROTOCOLS`' business: an unknown one parses (the original
/// accepts it) and `validate` warns.
pub fn parse_port(s: &str) -> Option<(String, u16)> {
    let (proto, num) = match s.split_once(':') {
        Some((p, n)) => (p.to_string(), n),
        None => ("tcp".to_string(), s),
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u16 = num.parse().ok()?;
    (n > 0
        && !proto.is_empty()
        && proto
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'+' || b == b'-'))
    .then_some((proto, n))
}

/// Names used as `${NAME}` in a string (`${HOST_PORT:x}` forms included by name).
pub fn vars_in(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        rest = &rest[i + 2..];
        let end = rest.find(['}', ':']).unwrap_or(rest.len());
        let name = &rest[..end];
        if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            out.push(name.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities() {
        for ok in ["a", "my-box", "x1", "ubuntu-24"] {
            assert!(entity(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "../..",
            "a/b",
            "A",
            "a--b",
            "-a",
            "a-",
            "a.b",
            "x\nRUN touch /pwned",
            "a b",
        ] {
            assert!(entity(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bundle_names() {
        for ok in ["a", "k1", "my_bundle", "web-1.prod", "A9"] {
            assert!(bundle(ok).is_ok(), "{ok}");
        }
        let long = "a".repeat(129);
        for bad in [
            "",
            "..",
            ".hidden",
            "../../outside/victim",
            "a/b",
            "-x",
            "a b",
            "a\nb",
            long.as_str(),
        ] {
            assert!(bundle(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn references() {
        assert!(qualified_box("cachyos.cachyos").is_ok());
        assert!(qualified_box("a..b").is_err());
        assert!(candy_ref("@github.com/org/repo/candy/x:v1").is_ok());
        assert!(candy_ref("@github.com/org/repo/../../x").is_err());
        assert!(candy_ref("@github.com/org/repo/x:v1\nRUN x").is_err());
        assert!(base_ref("quay.io/fedora/fedora:43").is_ok());
        assert!(base_ref("debian:13").is_ok());
        assert!(base_ref("x\nRUN touch /pwned").is_err());
        assert!(base_ref("../../etc").is_err());
        assert!(distro_tag("ubuntu:24.04").is_ok());
        assert!(distro_tag("ubuntu:24.04\n").is_err());
    }

    #[test]
    fn keys_and_words() {
        assert!(env_key("PATH_2").is_ok() && env_key("lower_ok").is_ok());
        assert!(env_key("A=1\nRUN touch /pwned-key").is_err());
        assert!(env_key("1A").is_err());
        assert!(var_name("lower").is_err());
        assert!(user_name("fedora").is_ok() && user_name("Root").is_err());
        assert!(unit_name("sshd.service").is_ok() && unit_name("../x").is_err());
        assert!(path_segment("..").is_err() && path_segment("evil\nRUN touch pwned").is_err());
        assert!(token("/opt/x").is_ok() && token("/opt/a b").is_err());
        assert!(token("/opt/\u{2028}x").is_err());
        assert!(path("${HOME}/.local/bin").is_ok() && path("/opt/\"x").is_err());
        assert!(package("python3-dev").is_ok() && package("@development-tools").is_ok());
        assert!(package("#").is_err() && package("a;b").is_err());
        assert!(path("/opt/$(id)").is_err() && path("/opt/`id`").is_err());
        assert!(single_line("a b\tc").is_ok() && single_line("a\rb").is_err());
    }
}
