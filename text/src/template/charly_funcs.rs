//! charly's own template functions: the vocabulary's functions that Go's
//! `text/template` does not have. They live in their own table, apart from
//! the port of Go's builtins (`funcs.rs`), and resolve after them.
//!
//! Verified against the original (the original's functions, as its generated files show them):
//!
//! * `cacheMounts LIST` — per entry `--mount=type=cache,id=charly-<safe>,`
//!   `dst=<dst>,sharing=<sharing|locked>`, where `<safe>` is `dst` without its
//!   leading `/` and with `/` turned into `-`; entries are joined by
//!   `" \\\n    "` (space, backslash, newline, four spaces), no trailing one.
//! * `cacheMountsOwned LIST UID GID` — `--mount=type=cache,id=charly-<safe>-
//!   uid<UID>,dst=<dst>,uid=<UID>,gid=<GID>`, every entry followed by the
//!   separator (so the command can follow directly; an empty list gives "").
//! * `cacheMountsAuto LIST UID GID` — each entry owned or shared by its
//!   `owned` flag, joined, no trailing separator.
//!   List entries are objects `{dst, sharing, owned}` (the serde form of
//!   `charly_rules::model::vocab::CacheMount`; `Dst`/`Sharing`/`Owned` are also
//!   read). A missing or null list is empty.
//! * `quote V` — Go `%q` (`"a\"b"`). `default V FB` — the text of `FB` when
//!   `V` prints as `""` or `<nil>` (missing, null or empty), else the text of
//!   `V`; it returns a string, so `eq (default .gpgcheck "true") "false"`
//!   works for a boolean `gpgcheck: false` too.
//! * `splitFirst S SEP` (the part before the first `SEP`, all of `S` without
//!   one), `replace S OLD NEW` (all occurrences), `join LIST SEP` (items
//!   printed as `%v`), `hasSuffix S SUFFIX`, `shquote S` (bare when it only has
//!   `[A-Za-z0-9_./:=@%+,-]`, else single-quoted with `'\''`; `''` when
//!   empty), `anyRepoHasURL LIST` (some entry has a non-empty `url`).
//! * Service functions: `derefBool B` (a Go `*bool`: nil is false; see
//!   below), `systemdStdout S` (`file:P` → `append:P`, else `S`),
//!   `supervisordLog S` (`file:P` → `P`, `none` → `/dev/null`, else
//!   `/dev/fd/1`), `supervisordLogMaxbytes S` (`10MB` for `file:…`, else `0`).
//! * Not pinned by the original's outputs, chosen to agree with the verified service
//!   templates: `systemdRestart R` gives the systemd `Restart=` value:
//!   `always`, `on-failure`, `no` and other systemd values unchanged, and ""
//!   (omit the line) for unset and `unless-stopped`; `supervisordRestart R`
//!   gives the `autorestart=` value: `false` for `no`, else `true`.
//!
//! String arguments of these functions accept strings, numbers and booleans
//! (printed as `%v`); a missing value or null counts as `""`. The original
//! gives its service templates a separate function set; here one set serves
//! every template (a superset: nothing renders differently).
//!
//! Go `*bool` fields (e.g. a service's `AutoStart`) have three states and a
//! non-nil pointer is true even when it points at `false`. JSON has no
//! pointers, so pass such a field as `null` (unset) or as a one-element list
//! `[true]` / `[false]`: the list is truthy like the pointer, and `derefBool`
//! unwraps it. `derefBool` also accepts plain booleans and the strings Go's
//! `strconv.ParseBool` reads.

use super::exec::{Val, truth};
use super::fmt::{fmt_v, sprint, sprintf, type_name};
use super::funcs::{error_calling, want_exactly};
use serde_json::Value as Json;

/// The names of charly's own functions.
pub(super) const FUNCS: &[&str] = &[
    "cacheMounts",
    "cacheMountsOwned",
    "cacheMountsAuto",
    "quote",
    "default",
    "splitFirst",
    "replace",
    "join",
    "shquote",
    "hasSuffix",
    "anyRepoHasURL",
    "derefBool",
    "systemdRestart",
    "supervisordRestart",
    "systemdStdout",
    "supervisordLog",
    "supervisordLogMaxbytes",
];

/// Separator between cache mounts: space, backslash, newline, four spaces.
const MOUNT_SEP: &str = " \\\n    ";

/// Calls charly's function `name` (one of [`FUNCS`]).
pub(super) fn call<'a>(name: &str, args: &[Val<'a>]) -> Result<Val<'a>, String> {
    match name {
        "cacheMounts" | "cacheMountsOwned" | "cacheMountsAuto" => call_cache_mounts(name, args),
        "quote" | "default" | "splitFirst" | "replace" | "shquote" | "hasSuffix" => {
            call_string(name, args)
        }
        "join" | "anyRepoHasURL" => call_list(name, args),
        "derefBool"
        | "systemdRestart"
        | "supervisordRestart"
        | "systemdStdout"
        | "supervisordLog"
        | "supervisordLogMaxbytes" => call_service(name, args),
        _ => Err(super::funcs::undefined(name)),
    }
}

/// A string result.
fn string_val<'a>(s: String) -> Result<Val<'a>, String> {
    Ok(Val::own(Json::String(s)))
}

/// A boolean result.
fn bool_val<'a>(b: bool) -> Result<Val<'a>, String> {
    Ok(Val::own(Json::Bool(b)))
}

/// The cache mount functions: `cacheMounts`, `cacheMountsOwned` and
/// `cacheMountsAuto`.
fn call_cache_mounts<'a>(name: &str, args: &[Val<'a>]) -> Result<Val<'a>, String> {
    let exactly = |want: usize| want_exactly(name, args.len(), want);
    let calling = |e: String| error_calling(name, e);
    match name {
        "cacheMounts" => {
            exactly(1)?;
            let mounts = mounts(&args[0]).map_err(calling)?;
            string_val(
                mounts
                    .iter()
                    .map(shared_mount)
                    .collect::<Vec<_>>()
                    .join(MOUNT_SEP),
            )
        }
        "cacheMountsOwned" => {
            exactly(3)?;
            let mounts = mounts(&args[0]).map_err(calling)?;
            let (uid, gid) = ids(&args[1], &args[2]).map_err(calling)?;
            string_val(
                mounts
                    .iter()
                    .map(|m| owned_mount(m, &uid, &gid) + MOUNT_SEP)
                    .collect(),
            )
        }
        "cacheMountsAuto" => {
            exactly(3)?;
            let mounts = mounts(&args[0]).map_err(calling)?;
            let (uid, gid) = ids(&args[1], &args[2]).map_err(calling)?;
            string_val(
                mounts
                    .iter()
                    .map(|m| {
                        if m.owned {
                            owned_mount(m, &uid, &gid)
                        } else {
                            shared_mount(m)
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(MOUNT_SEP),
            )
        }
        _ => Err(super::funcs::undefined(name)),
    }
}

/// The string functions: `quote`, `default`, `splitFirst`, `replace`,
/// `shquote` and `hasSuffix`.
fn call_string<'a>(name: &str, args: &[Val<'a>]) -> Result<Val<'a>, String> {
    let exactly = |want: usize| want_exactly(name, args.len(), want);
    let calling = |e: String| error_calling(name, e);
    match name {
        "quote" => {
            exactly(1)?;
            string_val(sprintf("%q", args))
        }
        "default" => {
            exactly(2)?;
            let v = sprint(&args[..1]);
            if v.is_empty() || v == "<nil>" {
                string_val(sprint(&args[1..]))
            } else {
                string_val(v)
            }
        }
        "splitFirst" => {
            exactly(2)?;
            let (text, sep) = (
                str_arg(&args[0]).map_err(calling)?,
                str_arg(&args[1]).map_err(calling)?,
            );
            let first = if sep.is_empty() {
                text.chars().next().map(String::from).unwrap_or_default()
            } else {
                text.split(sep.as_str())
                    .next()
                    .unwrap_or_default()
                    .to_string()
            };
            string_val(first)
        }
        "replace" => {
            exactly(3)?;
            let text = str_arg(&args[0]).map_err(calling)?;
            let old = str_arg(&args[1]).map_err(calling)?;
            let new = str_arg(&args[2]).map_err(calling)?;
            string_val(text.replace(old.as_str(), &new))
        }
        "shquote" => {
            exactly(1)?;
            string_val(crate::sh::quote_min_pct(
                &str_arg(&args[0]).map_err(calling)?,
            ))
        }
        "hasSuffix" => {
            exactly(2)?;
            let text = str_arg(&args[0]).map_err(calling)?;
            bool_val(text.ends_with(str_arg(&args[1]).map_err(calling)?.as_str()))
        }
        _ => Err(super::funcs::undefined(name)),
    }
}

/// The list functions: `join` and `anyRepoHasURL`.
fn call_list<'a>(name: &str, args: &[Val<'a>]) -> Result<Val<'a>, String> {
    let exactly = |want: usize| want_exactly(name, args.len(), want);
    let calling = |e: String| error_calling(name, e);
    match name {
        "join" => {
            exactly(2)?;
            let sep = str_arg(&args[1]).map_err(calling)?;
            let items: Vec<String> = match args[0].non_nil() {
                None => Vec::new(),
                Some(Json::Array(a)) => a
                    .iter()
                    .map(|j| {
                        let mut t = String::new();
                        fmt_v(j, &mut t);
                        t
                    })
                    .collect(),
                Some(other) => {
                    return Err(calling(format!(
                        "join needs a list, got {}",
                        type_name(Some(other))
                    )));
                }
            };
            string_val(items.join(&sep))
        }
        "anyRepoHasURL" => {
            exactly(1)?;
            let any = match args[0].non_nil() {
                Some(Json::Array(a)) => a.iter().any(|r| {
                    r.get("url").is_some_and(|u| {
                        let mut t = String::new();
                        fmt_v(u, &mut t);
                        !u.is_null() && !t.is_empty()
                    })
                }),
                _ => false,
            };
            bool_val(any)
        }
        _ => Err(super::funcs::undefined(name)),
    }
}

/// The service functions: `derefBool`, `systemdRestart`,
/// `supervisordRestart`, `systemdStdout`, `supervisordLog` and
/// `supervisordLogMaxbytes`.
fn call_service<'a>(name: &str, args: &[Val<'a>]) -> Result<Val<'a>, String> {
    want_exactly(name, args.len(), 1)?;
    if name == "derefBool" {
        return bool_val(deref_bool(args[0].non_nil()));
    }
    let v = str_arg(&args[0]).map_err(|e| error_calling(name, e))?;
    match name {
        "systemdRestart" => string_val(match v.as_str() {
            "" | "unless-stopped" => String::new(),
            other => other.to_string(),
        }),
        "supervisordRestart" => string_val(if v == "no" { "false" } else { "true" }.to_string()),
        "systemdStdout" => string_val(match v.strip_prefix("file:") {
            Some(p) => format!("append:{p}"),
            None => v,
        }),
        "supervisordLog" => string_val(match v.strip_prefix("file:") {
            Some(p) => p.to_string(),
            None if v == "none" => "/dev/null".to_string(),
            None => "/dev/fd/1".to_string(),
        }),
        "supervisordLogMaxbytes" => {
            string_val(if v.starts_with("file:") { "10MB" } else { "0" }.to_string())
        }
        _ => Err(super::funcs::undefined(name)),
    }
}

/// A string argument of a vocabulary function: strings as they are, numbers
/// and booleans as `%v`, nil and no value as "".
fn str_arg(v: &Val<'_>) -> Result<String, String> {
    match v.non_nil() {
        None => Ok(String::new()),
        Some(Json::String(s)) => Ok(s.clone()),
        Some(j @ (Json::Number(_) | Json::Bool(_))) => {
            let mut s = String::new();
            fmt_v(j, &mut s);
            Ok(s)
        }
        Some(other) => Err(format!(
            "wrong type for value; expected string; got {}",
            type_name(Some(other))
        )),
    }
}

fn deref_bool(j: Option<&Json>) -> bool {
    match j {
        None | Some(Json::Null) => false,
        Some(Json::Bool(b)) => *b,
        Some(Json::String(s)) => matches!(s.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True"),
        Some(Json::Array(a)) if a.len() == 1 => deref_bool(a.first()),
        Some(other) => truth(&Val::Ref(other)),
    }
}

struct Mount {
    dst: String,
    sharing: String,
    owned: bool,
}

fn mounts(v: &Val<'_>) -> Result<Vec<Mount>, String> {
    let items = match v.non_nil() {
        None => return Ok(Vec::new()),
        Some(Json::Array(a)) => a,
        Some(other) => {
            return Err(format!(
                "cache mounts must be a list, got {}",
                type_name(Some(other))
            ));
        }
    };
    let field = |m: &serde_json::Map<String, Json>, lower: &str, upper: &str| -> Option<Json> {
        m.get(lower)
            .or_else(|| m.get(upper))
            .filter(|j| !j.is_null())
            .cloned()
    };
    items
        .iter()
        .map(|item| {
            let Json::Object(m) = item else {
                return Err(format!(
                    "a cache mount must be a map, got {}",
                    type_name(Some(item))
                ));
            };
            let dst = match field(m, "dst", "Dst") {
                Some(Json::String(s)) if !s.is_empty() => s,
                _ => return Err("a cache mount has no dst".to_string()),
            };
            let sharing = match field(m, "sharing", "Sharing") {
                Some(Json::String(s)) if !s.is_empty() => s,
                _ => "locked".to_string(),
            };
            let owned = field(m, "owned", "Owned").is_some_and(|j| truth(&Val::Ref(&j)));
            Ok(Mount {
                dst,
                sharing,
                owned,
            })
        })
        .collect()
}

fn mount_id(dst: &str) -> String {
    dst.strip_prefix('/').unwrap_or(dst).replace('/', "-")
}

fn shared_mount(m: &Mount) -> String {
    format!(
        "--mount=type=cache,id=charly-{},dst={},sharing={}",
        mount_id(&m.dst),
        m.dst,
        m.sharing
    )
}

fn owned_mount(m: &Mount, uid: &str, gid: &str) -> String {
    format!(
        "--mount=type=cache,id=charly-{}-uid{uid},dst={},uid={uid},gid={gid}",
        mount_id(&m.dst),
        m.dst
    )
}

fn ids(uid: &Val<'_>, gid: &Val<'_>) -> Result<(String, String), String> {
    let one = |v: &Val<'_>, what: &str| match v.non_nil() {
        None => Err(format!("{what} is missing")),
        Some(_) => str_arg(v),
    };
    Ok((one(uid, "uid")?, one(gid, "gid")?))
}
