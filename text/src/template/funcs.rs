//! Go's builtin template functions (Go: `text/template/funcs.go`).
//!
//! Builtins: `and` and `or` (short-circuit, returning the deciding value),
//! `not`, `len`, `index`, `slice`, `eq` (several operands), `ne`, `lt`, `le`,
//! `gt`, `ge` (with Go's kind rules: comparing a string with a number is an
//! error, comparing anything with a missing value is false), `print`,
//! `printf`, `println`, `html`, `js`, `urlquery`.
//!
//! `and` and `or` are listed here so that they resolve, but they evaluate
//! their arguments lazily and so run in the executor.

use super::exec::{Val, truth};
use super::fmt::{fmt_arg_v, fmt_v, is_go_print, sprint, sprintf, type_name};
use serde_json::Value as Json;
use std::fmt::Write as _;

/// The names of Go's builtin functions.
pub(super) const FUNCS: &[&str] = &[
    "and", "or", "not", "len", "index", "slice", "eq", "ne", "lt", "le", "gt", "ge", "print",
    "printf", "println", "html", "js", "urlquery",
];

/// Go's error for a call to a function that is not defined.
pub(super) fn undefined(name: &str) -> String {
    format!("{name:?} is not a defined function")
}

/// Go's arity error unless a call to `name` has exactly `want` of its `n`
/// arguments.
pub(super) fn want_exactly(name: &str, n: usize, want: usize) -> Result<(), String> {
    if n == want {
        Ok(())
    } else {
        Err(format!(
            "wrong number of args for {name}: want {want} got {n}"
        ))
    }
}

/// Go's arity error unless a call to `name` has at least `want` arguments.
fn want_at_least(name: &str, n: usize, want: usize) -> Result<(), String> {
    if n >= want {
        Ok(())
    } else {
        Err(format!(
            "wrong number of args for {name}: want at least {want} got {n}"
        ))
    }
}

/// Go's wrapping of an error a function returned.
pub(super) fn error_calling(name: &str, e: String) -> String {
    format!("error calling {name}: {e}")
}

/// Calls the Go builtin `name` (one of [`FUNCS`] other than `and` and `or`).
pub(super) fn call<'a>(name: &str, args: &[Val<'a>]) -> Result<Val<'a>, String> {
    let n = args.len();
    let exactly = |want: usize| want_exactly(name, n, want);
    let at_least = |want: usize| want_at_least(name, n, want);
    let calling = |e: String| error_calling(name, e);
    let s = |j: String| Ok(Val::own(Json::String(j)));
    let b = |v: bool| Ok(Val::own(Json::Bool(v)));
    match name {
        "not" => {
            exactly(1)?;
            b(!truth(&args[0]))
        }
        "len" => {
            exactly(1)?;
            let len = match args[0].non_nil() {
                None => return Err(calling("len of nil pointer".into())),
                Some(Json::String(s)) => s.len(),
                Some(Json::Array(a)) => a.len(),
                Some(Json::Object(m)) => m.len(),
                Some(other) => {
                    return Err(calling(format!("len of type {}", type_name(Some(other)))));
                }
            };
            Ok(Val::own(Json::from(len)))
        }
        "index" => {
            at_least(1)?;
            index(&args[0], &args[1..]).map_err(calling)
        }
        "slice" => {
            at_least(1)?;
            slice(&args[0], &args[1..]).map(Val::own).map_err(calling)
        }
        "eq" => {
            at_least(1)?;
            if n < 2 {
                return Err(calling("missing argument for comparison".into()));
            }
            for other in &args[1..] {
                if go_eq(&args[0], other).map_err(calling)? {
                    return b(true);
                }
            }
            b(false)
        }
        "ne" => {
            exactly(2)?;
            b(!go_eq(&args[0], &args[1]).map_err(calling)?)
        }
        "lt" | "le" | "gt" | "ge" => {
            exactly(2)?;
            let (x, y) = (&args[0], &args[1]);
            let lt = go_lt(x, y).map_err(calling)?;
            let r = match name {
                "lt" => lt,
                "ge" => !lt,
                _ => {
                    let le = lt || go_eq(x, y).map_err(calling)?;
                    if name == "le" { le } else { !le }
                }
            };
            b(r)
        }
        "print" => s(sprint(args)),
        "println" => {
            let mut out = String::new();
            for (i, a) in args.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                fmt_arg_v(a, &mut out);
            }
            out.push('\n');
            s(out)
        }
        "printf" => {
            at_least(1)?;
            let Some(Json::String(f)) = args[0].json() else {
                let t = type_name(args[0].non_nil());
                return Err(format!("wrong type for value; expected string; got {t}"));
            };
            s(sprintf(f, &args[1..]))
        }
        "html" => s(html_escape(&escaper_text(args))),
        "js" => s(js_escape(&escaper_text(args))),
        "urlquery" => s(query_escape(&escaper_text(args))),
        _ => Err(undefined(name)),
    }
}

fn index<'a>(item: &Val<'a>, keys: &[Val<'a>]) -> Result<Val<'a>, String> {
    if item.non_nil().is_none() {
        return Err("index of untyped nil".into());
    }
    let mut cur = item.clone();
    for key in keys {
        let borrowed: Option<&'a Json> = match cur {
            Val::Ref(r) => Some(r),
            _ => None,
        };
        let Some(col) = cur.non_nil() else {
            return Err("index of nil pointer".into());
        };
        let next = match col {
            Json::Array(a) => {
                let i = index_arg(key, a.len())?;
                if i >= a.len() {
                    return Err(format!("index out of range: {i}"));
                }
                match borrowed {
                    Some(Json::Array(ba)) => Val::Ref(&ba[i]),
                    _ => Val::own(a[i].clone()),
                }
            }
            Json::String(s) => {
                let i = index_arg(key, s.len())?;
                match s.as_bytes().get(i) {
                    Some(byte) => Val::own(Json::from(*byte)),
                    None => return Err(format!("index out of range: {i}")),
                }
            }
            Json::Object(m) => {
                let k = match key.non_nil() {
                    Some(Json::String(k)) => k.clone(),
                    None => return Err("value is nil; should be of type string".into()),
                    Some(other) => {
                        return Err(format!(
                            "value has type {}; should be string",
                            type_name(Some(other))
                        ));
                    }
                };
                match borrowed {
                    Some(Json::Object(bm)) => bm.get(&k).map_or(Val::Missing, Val::Ref),
                    _ => m.get(&k).map_or(Val::Missing, |v| Val::own(v.clone())),
                }
            }
            other => {
                return Err(format!(
                    "can't index item of type {}",
                    type_name(Some(other))
                ));
            }
        };
        cur = next;
    }
    Ok(cur)
}

fn index_arg(key: &Val<'_>, cap: usize) -> Result<usize, String> {
    let Some(j) = key.non_nil() else {
        return Err("cannot index slice/array with nil".into());
    };
    let Some(i) = j.as_i64() else {
        return Err(format!(
            "cannot index slice/array with type {}",
            type_name(Some(j))
        ));
    };
    match usize::try_from(i) {
        Ok(u) if u <= cap => Ok(u),
        _ => Err(format!("index out of range: {i}")),
    }
}

fn slice(item: &Val<'_>, idx: &[Val<'_>]) -> Result<Json, String> {
    let Some(j) = item.non_nil() else {
        return Err("slice of untyped nil".into());
    };
    if idx.len() > 3 {
        return Err(format!("too many slice indexes: {}", idx.len()));
    }
    let len = match j {
        Json::String(s) => {
            if idx.len() == 3 {
                return Err("cannot 3-index slice a string".into());
            }
            s.len()
        }
        Json::Array(a) => a.len(),
        other => {
            return Err(format!(
                "can't slice item of type {}",
                type_name(Some(other))
            ));
        }
    };
    let mut bounds = [0, len, len];
    for (k, v) in idx.iter().enumerate() {
        bounds[k] = index_arg(v, len)?;
    }
    if bounds[0] > bounds[1] {
        return Err(format!(
            "invalid slice index: {} > {}",
            bounds[0], bounds[1]
        ));
    }
    if idx.len() == 3 && bounds[1] > bounds[2] {
        return Err(format!(
            "invalid slice index: {} > {}",
            bounds[1], bounds[2]
        ));
    }
    Ok(match j {
        Json::String(s) => {
            Json::String(String::from_utf8_lossy(&s.as_bytes()[bounds[0]..bounds[1]]).into_owned())
        }
        Json::Array(a) => Json::Array(a[bounds[0]..bounds[1]].to_vec()),
        _ => Json::Null,
    })
}

/// Go's `basicKind` classes for comparisons.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind<'v> {
    /// Nil, no value, lists and maps (no basic kind).
    Other,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(&'v str),
}

fn kind<'v>(v: &'v Val<'_>) -> Kind<'v> {
    match v.non_nil() {
        Some(Json::Bool(b)) => Kind::Bool(*b),
        Some(Json::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Kind::Int(i),
            (None, Some(u)) => Kind::Uint(u),
            _ => Kind::Float(n.as_f64().unwrap_or(0.0)),
        },
        Some(Json::String(s)) => Kind::Str(s),
        _ => Kind::Other,
    }
}

fn kind_rank(k: Kind<'_>) -> u8 {
    match k {
        Kind::Other => 0,
        Kind::Bool(_) => 1,
        Kind::Int(_) => 3,
        Kind::Float(_) => 4,
        Kind::Str(_) => 5,
        Kind::Uint(_) => 6,
    }
}

/// Go's `eq` for one pair.
fn go_eq(a: &Val<'_>, b: &Val<'_>) -> Result<bool, String> {
    let (x, y) = (kind(a), kind(b));
    if kind_rank(x) != kind_rank(y) {
        return match (x, y) {
            (Kind::Int(i), Kind::Uint(u)) | (Kind::Uint(u), Kind::Int(i)) => {
                Ok(u64::try_from(i).is_ok_and(|i| i == u))
            }
            _ if a.non_nil().is_some() && b.non_nil().is_some() => Err(format!(
                "incompatible types for comparison: {} and {}",
                type_name(a.non_nil()),
                type_name(b.non_nil())
            )),
            _ => Ok(false),
        };
    }
    Ok(match (x, y) {
        (Kind::Bool(p), Kind::Bool(q)) => p == q,
        (Kind::Int(p), Kind::Int(q)) => p == q,
        (Kind::Uint(p), Kind::Uint(q)) => p == q,
        (Kind::Float(p), Kind::Float(q)) => p == q,
        (Kind::Str(p), Kind::Str(q)) => p == q,
        _ => {
            // Nil, lists and maps: only comparisons with nil are defined.
            let (ja, jb) = (a.non_nil(), b.non_nil());
            match (ja, jb) {
                (None, None) => true,
                (None, Some(_)) | (Some(_), None) => false,
                (Some(p), Some(q)) => {
                    let same = matches!(
                        (p, q),
                        (Json::Array(_), Json::Array(_)) | (Json::Object(_), Json::Object(_))
                    );
                    let mut vp = String::new();
                    fmt_v(q, &mut vp);
                    return Err(if same {
                        format!("non-comparable type {vp}: {}", type_name(Some(q)))
                    } else {
                        let mut va = String::new();
                        fmt_v(p, &mut va);
                        format!(
                            "non-comparable types {va}: {}, {}: {vp}",
                            type_name(Some(p)),
                            type_name(Some(q))
                        )
                    });
                }
            }
        }
    })
}

/// Go's `lt`.
fn go_lt(a: &Val<'_>, b: &Val<'_>) -> Result<bool, String> {
    let (x, y) = (kind(a), kind(b));
    if matches!(x, Kind::Other) || matches!(y, Kind::Other) {
        return Err("invalid type for comparison".into());
    }
    if kind_rank(x) != kind_rank(y) {
        return match (x, y) {
            (Kind::Int(i), Kind::Uint(u)) => Ok(u64::try_from(i).map_or(true, |i| i < u)),
            (Kind::Uint(u), Kind::Int(i)) => Ok(u64::try_from(i).is_ok_and(|i| u < i)),
            _ => Err(format!(
                "incompatible types for comparison: {} and {}",
                type_name(a.non_nil()),
                type_name(b.non_nil())
            )),
        };
    }
    match (x, y) {
        (Kind::Int(p), Kind::Int(q)) => Ok(p < q),
        (Kind::Uint(p), Kind::Uint(q)) => Ok(p < q),
        (Kind::Float(p), Kind::Float(q)) => Ok(p < q),
        (Kind::Str(p), Kind::Str(q)) => Ok(p < q),
        _ => Err("invalid type for comparison".into()),
    }
}

/// Text for the escaper builtins (Go's `evalArgs`).
fn escaper_text(args: &[Val<'_>]) -> String {
    if let [one] = args {
        match one.json() {
            Some(Json::String(s)) => return s.clone(),
            None => return "<no value>".into(),
            _ => {}
        }
    }
    let mut out = String::new();
    let mut prev_string = false;
    for (i, a) in args.iter().enumerate() {
        let is_string = matches!(a.json(), Some(Json::String(_)) | None);
        if i > 0 && !is_string && !prev_string {
            out.push(' ');
        }
        match a.json() {
            None => out.push_str("<no value>"),
            Some(j) => fmt_v(j, &mut out),
        }
        prev_string = is_string;
    }
    out
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\0' => out.push('\u{FFFD}'),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
    out
}

fn js_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '"' => out.push_str("\\\""),
            '<' => out.push_str("\\u003C"),
            '>' => out.push_str("\\u003E"),
            '&' => out.push_str("\\u0026"),
            '=' => out.push_str("\\u003D"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c if !c.is_ascii() && !is_go_print(c) => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for byte in s.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(byte));
            }
            b' ' => out.push('+'),
            _ => {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}
