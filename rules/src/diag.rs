//! Diagnostics: errors and warnings that point at file:line:col.
//!
//! Loading collects every problem instead of stopping at the first, so a user
//! sees the whole list at once. A [`Diagnostic`] is plain data (message, span,
//! hint); it becomes a miette report (source line, caret, hint) only when the
//! CLI prints it, and a `{file, line, column, message}` object for `--json`.

use crate::source::{SourceMap, Span};
use serde::Serialize;

/// How bad a diagnostic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The input is accepted; something looks wrong.
    Warning,
    /// The input cannot be used as written.
    Error,
}

/// One problem found in the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// What is wrong, in one sentence.
    pub message: String,
    /// Where it is, when it is somewhere in a file.
    pub span: Option<Span>,
    /// How to fix it, when we can say.
    pub hint: Option<String>,
    /// What kind of problem it is, when a policy depends on it
    /// ([`UNKNOWN_FIELD`]).
    pub code: Option<&'static str>,
}

/// The code of a field (or top-level key) charly does not know: an error
/// unless the project allows unknown fields (`--allow-unknown-fields`).
pub const UNKNOWN_FIELD: &str = "unknown-field";

impl Diagnostic {
    /// An error at a place.
    pub fn error(span: impl Into<Option<Span>>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            message: message.into(),
            span: span.into(),
            hint: None,
            code: None,
        }
    }

    /// A warning at a place.
    pub fn warning(span: impl Into<Option<Span>>, message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Warning,
            message: message.into(),
            span: span.into(),
            hint: None,
            code: None,
        }
    }

    /// Adds a hint.
    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Marks what kind of problem it is.
    #[must_use]
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// Whether this is an error.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// `file:line:col` of the span, or empty when there is none.
    pub fn location(&self, sources: &SourceMap) -> String {
        match self.span {
            Some(s) => format!("{}:{}:{}", sources.rel(s.file), s.line, s.col),
            None => String::new(),
        }
    }

    /// One line: `file:line:col: message` (used inside other messages and JSON).
    pub fn one_line(&self, sources: &SourceMap) -> String {
        let loc = self.location(sources);
        if loc.is_empty() {
            self.message.clone()
        } else {
            format!("{loc}: {}", self.message)
        }
    }

    /// The machine-readable form.
    pub fn to_json(&self, sources: &SourceMap) -> DiagnosticJson {
        DiagnosticJson {
            severity: self.severity,
            file: self.span.map(|s| sources.rel(s.file).to_string()),
            line: self.span.map(|s| s.line),
            column: self.span.map(|s| s.col),
            message: self.message.clone(),
            hint: self.hint.clone(),
        }
    }

    /// A miette report showing the source line with a caret and the hint.
    pub fn to_report(&self, sources: &SourceMap) -> miette::Report {
        let severity = match self.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        };
        let mut labels = Vec::new();
        let mut source = None;
        if let Some(span) = self.span
            && let Some(file) = sources.get(span.file)
        {
            let len = (span.len as usize).max(1);
            let offset = (span.offset as usize).min(file.text.len());
            let len = len.min(file.text.len().saturating_sub(offset));
            let (code, offset, len) = Excerpt::around(&file.rel, &file.text, offset, len);
            labels.push(miette::LabeledSpan::new(
                Some(self.label_text()),
                offset,
                len,
            ));
            source = Some(code);
        }
        let diag = miette::MietteDiagnostic {
            message: self.message.clone(),
            code: None,
            severity: Some(severity),
            help: self.hint.clone(),
            url: None,
            labels: Some(labels),
        };
        let report = miette::Report::new(diag);
        match source {
            Some(Snippet::Whole(src)) => report.with_source_code(src),
            Some(Snippet::Excerpt(src)) => report.with_source_code(src),
            None => report,
        }
    }

    fn label_text(&self) -> String {
        match self.severity {
            Severity::Error => "here".into(),
            Severity::Warning => "this".into(),
        }
    }
}

/// Lines longer than this (bytes) are shown as a window around the span:
/// a report stays readable, and the renderer's column widths stay small
/// (it cannot pad past 65,535 columns).
const LONG_LINE: usize = 512;
/// How much of a long line is shown before the span, and in all.
const WINDOW_BEFORE: usize = 60;
const WINDOW: usize = 160;

/// What a report shows of a file.
enum Snippet {
    /// The file as it is.
    Whole(miette::NamedSource<String>),
    /// Its lines around the span, long ones cut to a window.
    Excerpt(Excerpt),
}

/// The lines around a span with long lines cut (`...` where text was
/// left out), reporting the file's own line and column numbers.
struct Excerpt {
    name: String,
    text: String,
    /// The file's line number (0-based) of the excerpt's first line.
    first_line: usize,
    /// The excerpt's line (0-based) the span is on.
    primary: usize,
    /// What the span's line lost before the window (bytes, less the `...`).
    col_fix: usize,
}

/// The largest char boundary of `s` at or below `i`.
fn floor_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl Excerpt {
    /// What to show for a span at `offset` (`len` bytes) in `text`, and the
    /// span's place in it.
    fn around(name: &str, text: &str, offset: usize, len: usize) -> (Snippet, usize, usize) {
        let line_start = |at: usize| text[..at].rfind('\n').map_or(0, |i| i + 1);
        let line_end = |at: usize| text[at..].find('\n').map_or(text.len(), |i| at + i);
        let (ls, le) = (line_start(offset), line_end(offset));
        let prev = (ls > 0).then(|| (line_start(ls - 1), ls - 1));
        let next = (le < text.len()).then(|| (le + 1, line_end(le + 1)));
        let long = |(a, b): (usize, usize)| b - a > LONG_LINE;
        if !long((ls, le)) && !prev.is_some_and(long) && !next.is_some_and(long) {
            let whole = miette::NamedSource::new(name, text.to_string());
            return (Snippet::Whole(whole), offset, len);
        }
        let cut = |(a, b): (usize, usize)| {
            let end = floor_boundary(text, (a + WINDOW).min(b));
            format!("{}{}", &text[a..end], if end < b { "..." } else { "" })
        };
        let mut out = String::new();
        let mut primary = 0;
        if let Some(p) = prev {
            out.push_str(&cut(p));
            out.push('\n');
            primary = 1;
        }
        let ws = floor_boundary(text, offset.saturating_sub(WINDOW_BEFORE).max(ls));
        let we = floor_boundary(text, (ws + WINDOW).min(le)).max(offset.min(le));
        let prefix = if ws > ls { "..." } else { "" };
        out.push_str(prefix);
        let at = out.len() + (offset - ws);
        out.push_str(&text[ws..we]);
        if we < le {
            out.push_str("...");
        }
        let shown = len.min(we.saturating_sub(offset)).max(1);
        if let Some(n) = next {
            out.push('\n');
            out.push_str(&cut(n));
        }
        let line_no = text[..ls].bytes().filter(|b| *b == b'\n').count();
        let excerpt = Excerpt {
            name: name.to_string(),
            text: out,
            first_line: line_no - primary,
            primary,
            col_fix: ws - ls - prefix.len(),
        };
        (Snippet::Excerpt(excerpt), at, shown)
    }
}

impl miette::SourceCode for Excerpt {
    fn read_span<'a>(
        &'a self,
        span: &miette::SourceSpan,
        before: usize,
        after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'a> + 'a>, miette::MietteError> {
        let c = self.text.as_bytes().read_span(span, before, after)?;
        let column = if before == 0 && c.line() == self.primary {
            c.column() + self.col_fix
        } else {
            c.column()
        };
        Ok(Box::new(miette::MietteSpanContents::new_named(
            self.name.clone(),
            c.data(),
            *c.span(),
            c.line() + self.first_line,
            column,
            c.line_count(),
        )))
    }
}

/// The JSON shape of a diagnostic (`validate --json`).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct DiagnosticJson {
    /// `error` or `warning`.
    pub severity: Severity,
    /// Project-relative path.
    pub file: Option<String>,
    /// 1-based line.
    pub line: Option<u32>,
    /// 1-based column.
    pub column: Option<u32>,
    /// The message.
    pub message: String,
    /// A hint, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// A collection of diagnostics in the order they were found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    /// An empty collection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one.
    pub fn push(&mut self, d: Diagnostic) {
        self.items.push(d);
    }

    /// Adds many.
    pub fn extend(&mut self, other: impl IntoIterator<Item = Diagnostic>) {
        self.items.extend(other);
    }

    /// Whether any is an error.
    pub fn has_errors(&self) -> bool {
        self.items.iter().any(Diagnostic::is_error)
    }

    /// Changes each one in place.
    pub fn for_each_mut(&mut self, f: impl FnMut(&mut Diagnostic)) {
        self.items.iter_mut().for_each(f);
    }

    /// All of them.
    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter()
    }

    /// The errors only.
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter().filter(|d| d.is_error())
    }

    /// The warnings only.
    pub fn warnings(&self) -> impl Iterator<Item = &Diagnostic> {
        self.items.iter().filter(|d| !d.is_error())
    }

    /// Number of diagnostics.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Sorts by file, line and column so output is stable however it was found.
    pub fn sort(&mut self) {
        self.items.sort_by(|a, b| {
            let ka = a.span.map(|s| (s.file, s.line, s.col));
            let kb = b.span.map(|s| (s.file, s.line, s.col));
            ka.cmp(&kb)
                .then_with(|| a.severity.cmp(&b.severity))
                .then_with(|| a.message.cmp(&b.message))
        });
        self.items.dedup();
    }

    /// Takes the inner list.
    pub fn into_vec(self) -> Vec<Diagnostic> {
        self.items
    }
}

impl IntoIterator for Diagnostics {
    type Item = Diagnostic;
    type IntoIter = std::vec::IntoIter<Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

/// The known name closest to `word`, when it is close enough to be a likely typo.
pub fn nearest<'a>(word: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(f64, &str)> = None;
    for k in known {
        let score = strsim::jaro_winkler(word, k);
        let lev = strsim::levenshtein(word, k);
        let close = score >= 0.8 || lev <= 2 || k.starts_with(word) || word.starts_with(k);
        if close && best.is_none_or(|(s, _)| score > s) {
            best = Some((score, k));
        }
    }
    best.map(|(_, k)| k)
}

/// Up to `n` known names closest to `word`, best first.
pub fn nearest_n<'a>(
    word: &str,
    known: impl IntoIterator<Item = &'a str>,
    n: usize,
) -> Vec<&'a str> {
    let mut scored: Vec<(f64, &str)> = known
        .into_iter()
        .map(|k| (strsim::jaro_winkler(word, k), k))
        .filter(|(s, _)| *s >= 0.7)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    scored.into_iter().take(n).map(|(_, k)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_finds_typos_and_rejects_unrelated() {
        let known = ["package", "require", "distro", "task"];
        assert_eq!(nearest("packages", known), Some("package"));
        assert_eq!(nearest("requires", known), Some("require"));
        assert_eq!(nearest("tasks", known), Some("task"));
        assert_eq!(nearest("zzzzzz", known), None);
    }

    #[test]
    fn nearest_n_orders_best_first() {
        let known = ["redis", "redis-client", "valkey", "reddit"];
        let got = nearest_n("rediss", known, 2);
        assert_eq!(got[0], "redis");
        assert_eq!(got.len(), 2);
    }
}
