//! Go `text/template` rendering for the build vocabulary (`build.yml`).
//!
//! The vocabulary's templates (format install templates, builder stages, init
//! service units, …) are Go `text/template` source, and the same text must
//! render the same bytes here as in the original Go tool. [`render`] runs a
//! template against a `serde_json::Value`; [`check`] only parses (to validate
//! a vocabulary at load time). Errors are [`TemplateError`]s naming the
//! template and, where known, the `line:col` inside its text.
//!
//! # Why a small evaluator instead of `gtmpl`
//!
//! The `gtmpl` crate (0.7.1, a Rust port of Go templates) was tried first,
//! against every template of the real `build.yml`. It parses them, but it
//! diverges from Go exactly where this engine must not:
//!
//! * `range` over a map iterates a `HashMap` in random order (Go sorts keys):
//!   the output, and therefore every content key, would be nondeterministic;
//! * the `else` branch of `range` runs even when the range produced items;
//! * `.A.B` with `.A` missing is an error (Go: "no value");
//! * a nil prints as `nil` (Go: `<nil>`); `printf "%q"` does not quote;
//! * its lexer runs on a thread per parse and panics (printed to stderr, and
//!   reported as "receiving on a closed channel") on a multi-byte character
//!   before a `{{-` trim marker; `{{-` followed by a newline is not a trim;
//!   variable assignment (`$x = …`) is unsupported.
//!
//! Its parsed tree is private, so none of this can be patched from outside.
//! This module is therefore a compact port of exactly the parts of Go's
//! `text/template` (lexer, parser, executor, and the `fmt` verbs templates
//! use) that a vocabulary needs, following the Go sources closely.
//!
//! # Layout
//!
//! The port follows Go's package layout, one file per concern; each file's
//! own documentation says what it supports and where it departs from Go:
//!
//! * `lex.rs` — the lexer (Go: `text/template/parse/lex.go`);
//! * `parse.rs` — the parser and its tree, with the supported language
//!   (Go: `text/template/parse/parse.go`);
//! * `exec.rs` — the executor: values, truth, `range`, and the data model
//!   that maps JSON onto Go values (Go: `text/template/exec.go`);
//! * `fmt.rs` — printing values as Go's `fmt` and `strconv` do (`%v`,
//!   `Sprint`, `Sprintf`, `Quote`, `FormatFloat`);
//! * `funcs.rs` — Go's builtin functions (Go: `text/template/funcs.go`);
//! * `charly_funcs.rs` — the vocabulary's own functions (`cacheMounts`,
//!   `default`, `systemdRestart`, …), which are not part of Go's
//!   `text/template` and are kept apart from the port, in their own table.
//!
//! A function name resolves against Go's builtins first, then against
//! charly's table; a name in neither is a parse error.
//!
//! # Caching and threads
//!
//! Parsed templates are cached process-wide, keyed by their text (names only
//! label errors), behind a mutex; the parse runs outside the lock. Rendering
//! shares nothing, so [`render`] may be called from any number of threads.
//! Nesting (actions, parentheses, control structures, `{{template}}` calls)
//! is bounded at 100 levels, which fits a 1 MiB stack even unoptimised, so
//! hostile text is an error rather than a stack overflow on a worker thread.

mod charly_funcs;
mod exec;
mod fmt;
mod funcs;
mod lex;
mod parse;

use exec::Val;
use parse::Parsed;
use serde_json::Value as Json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// A template that failed to parse or to render.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template {name}: {message}")]
pub struct TemplateError {
    /// The name the caller gave the template (for example
    /// `distro/fedora/format/rpm/install_template`).
    pub name: String,
    /// What failed, prefixed by `line:col` inside the template text when the
    /// place is known (and, for rendering, the failing action).
    pub message: String,
}

/// Renders Go `text/template` `text` (named `name` for errors, e.g.
/// `distro/fedora/format/rpm/install_template`) with `data`.
pub fn render(name: &str, text: &str, data: &Json) -> Result<String, TemplateError> {
    let err = |message| TemplateError {
        name: name.to_string(),
        message,
    };
    let parsed = cached(text).map_err(err)?;
    exec::run(&parsed, data).map_err(err)
}

/// Parses without rendering (validation of a vocabulary at load time).
pub fn check(name: &str, text: &str) -> Result<(), TemplateError> {
    cached(text).map(drop).map_err(|message| TemplateError {
        name: name.to_string(),
        message,
    })
}

// ---------------------------------------------------------------------------
// Cache

/// Distinct texts kept before the cache starts over (a vocabulary has a few
/// dozen templates; this only bounds memory for pathological callers).
const CACHE_LIMIT: usize = 4096;
/// Deepest nesting of actions, control structures and parentheses, and of
/// `{{template}}` calls, so hostile input cannot exhaust a worker thread's
/// stack (real templates nest a handful of levels).
const MAX_DEPTH: usize = 100;

fn cached(text: &str) -> Result<Arc<Parsed>, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Parsed>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(p) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(text)
    {
        return Ok(Arc::clone(p));
    }
    let parsed = Arc::new(parse::parse(text)?);
    let mut c = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if c.len() >= CACHE_LIMIT {
        c.clear();
    }
    c.insert(text.to_string(), Arc::clone(&parsed));
    Ok(parsed)
}

/// `line:col` (1-based, column in characters) of a byte offset.
fn location(text: &str, pos: usize) -> String {
    let before = text.get(..pos).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("{line}:{col}")
}

// ---------------------------------------------------------------------------
// Function lookup

/// A template function: its name (for error messages) and its arguments.
type Func = for<'a> fn(&str, &[Val<'a>]) -> Result<Val<'a>, String>;

/// The function `name` stands for: one of Go's builtins first, else one of
/// charly's own functions.
fn lookup(name: &str) -> Option<Func> {
    if funcs::FUNCS.contains(&name) {
        Some(funcs::call)
    } else if charly_funcs::FUNCS.contains(&name) {
        Some(charly_funcs::call)
    } else {
        None
    }
}

/// Whether `name` is a function a template may call (checked at parse time).
fn is_func(name: &str) -> bool {
    lookup(name).is_some()
}

/// Calls the function `name` (`and` and `or` short-circuit in the executor
/// and never get here).
fn call_func<'a>(name: &str, args: &[Val<'a>]) -> Result<Val<'a>, String> {
    match lookup(name) {
        Some(f) => f(name, args),
        None => Err(funcs::undefined(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_builtins_and_charly_functions_are_separate_tables() {
        for name in charly_funcs::FUNCS {
            assert!(
                !funcs::FUNCS.contains(name),
                "{name} is in both the Go builtins and charly's functions"
            );
        }
        for name in ["cacheMounts", "default", "systemdRestart", "derefBool"] {
            assert!(charly_funcs::FUNCS.contains(&name), "{name}");
        }
        for name in ["and", "printf", "urlquery"] {
            assert!(funcs::FUNCS.contains(&name), "{name}");
        }
    }

    #[test]
    fn every_listed_function_resolves_and_is_implemented() {
        for name in funcs::FUNCS.iter().chain(charly_funcs::FUNCS) {
            assert!(is_func(name), "{name}");
            // `and` and `or` run in the executor, never through `call_func`.
            if matches!(*name, "and" | "or") {
                continue;
            }
            if let Err(e) = call_func(name, &[]) {
                assert_ne!(e, funcs::undefined(name), "{name} has no implementation");
            }
        }
    }

    #[test]
    fn unknown_functions_resolve_nowhere() {
        assert!(!is_func("nope"));
        assert_eq!(
            call_func("nope", &[]).unwrap_err(),
            "\"nope\" is not a defined function"
        );
        assert_eq!(
            check("t", "{{nope}}").unwrap_err().message,
            "1:3: function \"nope\" not defined"
        );
    }
}
