//! Candy validation: everything about a candy that can be checked without a
//! box (as the original validates them). Every problem is collected, each pointing at the
//! exact value.

use crate::diag::{Diagnostic, nearest};
use crate::model::candy::TASK_VERBS;
use crate::model::{Task, Vocab};
use crate::project::{CandyEntry, Project};
use crate::yaml::Spanned;

/// Variables the generator or the shell always provides.
pub const AUTO_VARS: [&str; 6] = ["USER", "UID", "GID", "HOME", "ARCH", "BUILD_ARCH"];

/// Checks every candy of a project, and the checks (`eval:`) of its boxes.
pub fn validate_candies(p: &Project) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for c in p.candies.values() {
        validate_candy(c, &p.ns(c.ns).vocab, &mut out);
    }
    for ns in &p.namespaces {
        for b in ns.boxes.values() {
            if let Some(e) = &b.def.eval {
                crate::check::parse_checks(&e.0, &format!("box:{}", b.name), &mut out);
            }
        }
    }
    out
}

/// The errors `validate` reports about candy `key` itself: the load errors
/// of its file and what [`validate_candy`] finds. A box using a candy with
/// errors is not built, generated or deployed (the CLI asks this before it
/// uses a box), so every command refuses what `validate` refuses.
pub fn candy_errors(p: &Project, key: &str) -> Vec<Diagnostic> {
    let Some(c) = p.candies.get(key) else {
        return Vec::new();
    };
    let mut out: Vec<Diagnostic> = p
        .diags
        .errors()
        .filter(|d| d.span.is_some_and(|s| s.file == c.file))
        .cloned()
        .collect();
    let mut found = Vec::new();
    check_candy(c, &p.ns(c.ns).vocab, Files::Unchecked, &mut found);
    out.extend(found.into_iter().filter(Diagnostic::is_error));
    out
}

/// Whether a check looks for the files a candy names in its directory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Files {
    /// `validate`: a `copy:` source that is not there is an error.
    Checked,
    /// Before a build: it is the build's error (a partial checkout still
    /// generates).
    Unchecked,
}

/// Checks one candy against the vocabulary it is used with.
pub fn validate_candy(c: &CandyEntry, vocab: &Vocab, out: &mut Vec<Diagnostic>) {
    check_candy(c, vocab, Files::Checked, out);
}

fn check_candy(c: &CandyEntry, vocab: &Vocab, files: Files, out: &mut Vec<Diagnostic>) {
    let def = &c.def;
    // Its checks, as `charly check` will read them: a typo in one is found
    // now, not when a bed runs.
    if let Some(e) = &def.eval {
        crate::check::parse_checks(&e.0, &format!("candy:{}", c.name), out);
    }
    // Section keys must name a distro (optionally `:version`) or a format.
    let mut known: Vec<&str> = vocab.distro.keys().map(String::as_str).collect();
    for d in vocab.distro.values() {
        known.extend(d.format.keys());
    }
    known.sort_unstable();
    known.dedup();
    for (key, _) in def.distro.iter() {
        for tag in crate::cascade::section_tags(&key.value) {
            let name = tag.split(':').next().unwrap_or("");
            if !known.contains(&name) {
                let mut d = Diagnostic::warning(
                    key.span,
                    format!(
                        "distro key `{}` names no known distro or format (`{name}`); the section never applies",
                        key.value
                    ),
                );
                if let Some(n) = nearest(name, known.iter().copied()) {
                    d = d.with_hint(format!("did you mean `{n}`?"));
                } else {
                    d = d.with_hint(format!("known: {}", known.join(", ")));
                }
                out.push(d);
            }
        }
    }
    match &def.version {
        None => out.push(
            Diagnostic::error(c.span, format!("candy `{}` has no `version:`", c.name))
                .with_hint("add a version such as `version: 2026.1.1`"),
        ),
        Some(v) if !is_version(&v.value) => out.push(Diagnostic::error(
            v.span,
            format!(
                "candy version `{}` is not a dotted number like 2026.144.1443 or 1.2.3",
                v.value
            ),
        )),
        _ => {}
    }
    for (k, _) in def.var.iter() {
        if crate::names::var_name(&k.value).is_err() {
            // Reported at load by `names::check_project`.
        } else if AUTO_VARS.contains(&k.value.as_str()) {
            out.push(Diagnostic::error(
                k.span,
                format!("var `{}` is reserved (set by charly)", k.value),
            ));
        } else if def.env.get(&k.value).is_some() {
            out.push(Diagnostic::error(
                k.span,
                format!("`{}` is in both `var:` and `env:`", k.value),
            ));
        }
    }
    for (k, _) in def.env.iter() {
        if k.value == "PATH" {
            out.push(
                Diagnostic::error(k.span, "`PATH` cannot be set in `env:`")
                    .with_hint("use `path_append:` to add directories to PATH"),
            );
        }
    }
    for (key, sec) in def.distro.iter() {
        let has_packages = !sec.package.is_empty() || !def.package.is_empty();
        if !has_packages && (!sec.repo.is_empty() || !sec.copr.is_empty() || !sec.module.is_empty())
        {
            out.push(Diagnostic::error(
                key.span,
                format!(
                    "distro section `{}` adds repos/copr/modules but installs no packages",
                    key.value
                ),
            ));
        }
        for r in &sec.repo {
            if r.value.get("name").is_none_or(String::is_empty) {
                out.push(Diagnostic::error(r.span, "a repo needs a `name:`"));
            }
        }
    }
    for p in &def.port {
        // A port that does not parse is refused at load (`crate::names::port`).
        match parse_port(&p.value) {
            Some((proto, _)) if !PORT_PROTOCOLS.contains(&proto.as_str()) => {
                let mut d = Diagnostic::warning(
                    p.span,
                    format!(
                        "unknown port protocol `{proto}`; it is published over TCP (known: {})",
                        PORT_PROTOCOLS.join(", ")
                    ),
                );
                if let Some(n) = nearest(&proto, PORT_PROTOCOLS.iter().copied()) {
                    d = d.with_hint(format!("did you mean `{n}`?"));
                }
                out.push(d);
            }
            _ => {}
        }
    }
    // Volume names, env and var keys are checked at load (`crate::names`).
    for s in &def.service {
        if s.name.value.is_empty() {
            out.push(Diagnostic::error(s.name.span, "a service needs a `name:`"));
        }
        match (&s.use_packaged, &s.exec) {
            (Some(_), Some(e)) => out.push(Diagnostic::error(
                e.span,
                "a service has `use_packaged:` or `exec:`, not both",
            )),
            (None, None) => out.push(Diagnostic::error(
                s.name.span,
                format!(
                    "service `{}` needs `use_packaged:` or `exec:`",
                    s.name.value
                ),
            )),
            (Some(u), None) if u.value.contains('/') || u.value.contains(' ') => {
                out.push(Diagnostic::error(
                    u.span,
                    "`use_packaged:` names a unit (e.g. `sshd.service`), not a path",
                ));
            }
            _ => {}
        }
        if let Some(sc) = &s.scope
            && !matches!(sc.value.as_str(), "system" | "user")
        {
            out.push(Diagnostic::error(
                sc.span,
                format!("service scope `{}` must be `system` or `user`", sc.value),
            ));
        }
    }
    for (i, t) in def.task.iter().enumerate() {
        validate_task(c, i, t, files, out);
    }
}

fn validate_task(c: &CandyEntry, index: usize, t: &Task, files: Files, out: &mut Vec<Diagnostic>) {
    let verbs = t.verbs();
    let task_span = verbs.first().map(|(_, v)| v.span).unwrap_or(c.span);
    let label = |verb: &str, v: &Spanned<String>| {
        let short: String = v
            .value
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(50)
            .collect();
        format!("task #{} ({verb}: {short})", index + 1)
    };
    let (verb, value) = match verbs.as_slice() {
        [] => {
            out.push(
                Diagnostic::error(
                    task_span,
                    format!("task #{} of candy `{}` has no verb", index + 1, c.name),
                )
                .with_hint(format!("use one of: {}", TASK_VERBS.join(", "))),
            );
            return;
        }
        [one] => *one,
        [_, (second, v), ..] => {
            out.push(Diagnostic::error(
                v.span,
                format!(
                    "task #{} has more than one verb (`{}` and `{second}`); split it",
                    index + 1,
                    verbs[0].0
                ),
            ));
            return;
        }
    };
    let what = label(verb, value);
    if let Some(u) = &t.user
        && !is_valid_user(&u.value)
    {
        out.push(
            Diagnostic::error(u.span, format!("{what}: user `{}` is not valid", u.value))
                .with_hint("use root, ${USER}, ${UID}:${GID}, a name, a number or uid:gid"),
        );
    }
    if let Some(m) = &t.mode
        && !is_mode(&m.value)
    {
        out.push(
            Diagnostic::error(
                m.span,
                format!("{what}: mode `{}` must look like 0644 or 0755", m.value),
            )
            .with_hint(
                "quote it (`mode: \"0755\"`) and give 3 or 4 octal digits after a leading 0",
            ),
        );
    }
    let path_fields: Vec<&Spanned<String>> = match verb {
        "mkdir" | "write" | "link" | "setcap" => vec![value],
        _ => Vec::new(),
    }
    .into_iter()
    .chain(t.to.as_deref())
    .collect();
    for pf in &path_fields {
        if let Some(m) = crate::plan::compile::climbing_path(&pf.value) {
            out.push(Diagnostic::error(pf.span, format!("{what}: {m}")));
        }
        if !is_abs_path(&pf.value) {
            out.push(Diagnostic::error(
                pf.span,
                format!(
                    "{what}: `{}` must be an absolute path (or start with ~/ or ${{HOME}})",
                    pf.value
                ),
            ));
        }
    }
    // ${VAR} in non-shell fields must be a var or an auto-export.
    let mut non_shell: Vec<&Spanned<String>> = path_fields.clone();
    if matches!(verb, "download" | "copy") {
        non_shell.push(value);
    }
    non_shell.extend(t.target.as_deref());
    check_vars(c, &non_shell, &what, out);
    check_verb_fields(c, t, verb, value, &what, files, out);
    check_caches(t, verb, &what, out);
}

/// The fields a task's verb needs (`copy` its source and `to:`, `write`
/// its `content:`, …) and their values.
fn check_verb_fields(
    c: &CandyEntry,
    t: &Task,
    verb: &str,
    value: &Spanned<String>,
    what: &str,
    files: Files,
    out: &mut Vec<Diagnostic>,
) {
    match verb {
        "copy" => {
            let src = &value.value;
            if let Some(why) = crate::plan::compile::copy_problem(c, src) {
                out.push(Diagnostic::error(value.span, format!("{what}: {why}")));
            } else if files == Files::Checked
                && !c.has_file(src)
                && !c
                    .files
                    .iter()
                    .any(|f| f.starts_with(&format!("{}/", src.trim_end_matches('/'))))
            {
                out.push(
                    Diagnostic::error(
                        value.span,
                        format!(
                            "{what}: file `{src}` does not exist in {}",
                            c.rel_dir.as_deref().unwrap_or(&c.dir.display().to_string())
                        ),
                    )
                    .with_hint("copy sources are relative to the candy directory"),
                );
            }
            if t.to.is_none() {
                out.push(Diagnostic::error(
                    value.span,
                    format!("{what}: copy needs `to:`"),
                ));
            }
        }
        "write" if t.content.is_none() => {
            out.push(Diagnostic::error(
                value.span,
                format!("{what}: write needs `content:`"),
            ));
        }
        "link" if t.target.is_none() => {
            out.push(Diagnostic::error(
                value.span,
                format!("{what}: link needs `target:`"),
            ));
        }
        "download" => {
            let extract = t.extract.as_ref().map(|e| e.value.as_str());
            if let Some(e) = &t.extract
                && !matches!(
                    e.value.as_str(),
                    "tar.gz" | "tar.xz" | "tar.zst" | "zip" | "sh" | "none"
                )
            {
                out.push(Diagnostic::error(
                    e.span,
                    format!(
                        "{what}: extract `{}` must be tar.gz, tar.xz, tar.zst, zip, sh or none",
                        e.value
                    ),
                ));
            }
            if t.to.is_none() && extract != Some("sh") {
                out.push(Diagnostic::error(
                    value.span,
                    format!("{what}: download needs `to:` (except with `extract: sh`)"),
                ));
            }
        }
        "build" if value.value != "all" => {
            out.push(Diagnostic::error(
                value.span,
                format!("{what}: build only accepts `all`"),
            ));
        }
        "setcap" => {
            if let Some(caps) = &t.caps
                && caps.value.trim().is_empty()
            {
                out.push(Diagnostic::error(
                    caps.span,
                    format!("{what}: empty `caps:`; omit it to remove capabilities"),
                ));
            }
        }
        _ => {}
    }
}

/// `cache:` paths: only on cmd and download tasks, each absolute (or in
/// the home).
fn check_caches(t: &Task, verb: &str, what: &str, out: &mut Vec<Diagnostic>) {
    if !matches!(verb, "cmd" | "download") {
        for cache in &t.cache.0 {
            out.push(Diagnostic::error(
                cache.span,
                format!("{what}: `cache:` only applies to cmd and download tasks"),
            ));
        }
    }
    for cache in &t.cache.0 {
        if !is_abs_path(&cache.value) {
            out.push(Diagnostic::error(
                cache.span,
                format!(
                    "{what}: cache `{}` must be absolute, ~/ or ${{HOME}}",
                    cache.value
                ),
            ));
        }
    }
}

/// `${VAR}` in fields no shell reads: each a `var:` of the candy or an
/// automatic one.
fn check_vars(c: &CandyEntry, fields: &[&Spanned<String>], what: &str, out: &mut Vec<Diagnostic>) {
    for f in fields {
        for var in vars_in(&f.value) {
            if !AUTO_VARS.contains(&var.as_str()) && c.def.var.get(&var).is_none() {
                let known: Vec<&str> = AUTO_VARS.iter().copied().chain(c.def.var.keys()).collect();
                let mut d = Diagnostic::error(
                    f.span,
                    format!(
                        "{what}: `${{{var}}}` is neither a `var:` of this candy nor one of {}",
                        AUTO_VARS.join(", ")
                    ),
                );
                if let Some(n) = nearest(&var, known) {
                    d = d.with_hint(format!("did you mean `${{{n}}}`?"));
                }
                out.push(d);
            }
        }
    }
}

fn is_version(v: &str) -> bool {
    !v.is_empty()
        && v.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Port protocols charly knows (the original's `http`, `https`,
/// `https+insecure`, `tcp`, `udp`; `sctp`; and the backend schemes its
/// tunnel plugin reads from the `port_proto` label). Every one but `udp` and
/// `sctp` is published over TCP.
pub const PORT_PROTOCOLS: &[&str] = &[
    "http",
    "https",
    "https+insecure",
    "tcp",
    "udp",
    "sctp",
    "tls-terminated-tcp",
    "ssh",
    "rdp",
    "smb",
];

/// Valid `user:` values: root, ${USER}, ${UID}:${GID}, N:M, a name, a number.
pub fn is_valid_user(u: &str) -> bool {
    if matches!(u, "root" | "${USER}" | "${UID}:${GID}" | "${UID}") {
        return true;
    }
    if let Some((a, b)) = u.split_once(':') {
        return !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit());
    }
    if !u.is_empty() && u.bytes().all(|c| c.is_ascii_digit()) {
        return true;
    }
    let mut b = u.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_lowercase() || c == b'_')
        && b.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
}

/// `^0[0-7]{3,4}$`.
pub fn is_mode(m: &str) -> bool {
    m.starts_with('0')
        && (4..=5).contains(&m.len())
        && m.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

fn is_abs_path(p: &str) -> bool {
    p.starts_with('/')
        || p.starts_with("~/")
        || p == "~"
        || p.starts_with("${HOME}")
        || p.starts_with("$HOME")
}

pub use crate::names::{parse_port, vars_in};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_modes_ports() {
        for ok in [
            "root",
            "${USER}",
            "${UID}:${GID}",
            "1000:1000",
            "postgres",
            "0",
            "1000",
        ] {
            assert!(is_valid_user(ok), "{ok}");
        }
        for bad in ["Root", "${FOO}", "a b", ""] {
            assert!(!is_valid_user(bad), "{bad}");
        }
        assert!(is_mode("0755") && is_mode("04755"));
        assert!(!is_mode("755") && !is_mode("0855") && !is_mode("07555x"));
        assert_eq!(parse_port("8080"), Some(("tcp".into(), 8080)));
        assert_eq!(parse_port("udp:53"), Some(("udp".into(), 53)));
        assert_eq!(parse_port("0"), None);
        assert_eq!(parse_port("http"), None);
        assert_eq!(
            parse_port("https+insecure:3000"),
            Some(("https+insecure".into(), 3000))
        );
        assert_eq!(
            parse_port("tls-terminated-tcp:443"),
            Some(("tls-terminated-tcp".into(), 443))
        );
        for bad in [
            "tcp:+80",
            "tcp:",
            ":80",
            "TCP:80",
            "tcp:65536",
            "a b:1",
            "tcp:0",
        ] {
            assert_eq!(parse_port(bad), None, "{bad}");
        }
    }

    #[test]
    fn vars_found() {
        assert_eq!(
            vars_in("${HOME}/x/${V_1}:${HOST_PORT:80}"),
            vec!["HOME", "V_1", "HOST_PORT"]
        );
    }
}
