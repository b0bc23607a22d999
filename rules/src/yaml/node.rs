//! A YAML document as a tree of spanned nodes.
//!
//! Built from saphyr-parser's event stream. Scalars keep the exact text the
//! author wrote plus its style, so `mode: 0755`, `NO` or `1.10` never change
//! meaning: typing happens later, against the schema, in [`super::de`].
//! Aliases are expanded with a node budget (no billion-laughs), nesting depth
//! is bounded, and duplicate mapping keys are errors, as in the original tool.

use crate::diag::Diagnostic;
use crate::source::{FileId, LineIndex, Span};
use saphyr_parser::{Event, Parser, ScalarStyle};
use std::collections::HashMap;

/// Largest file the loader accepts. Real charly files are a few KiB.
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;
/// Deepest nesting accepted.
pub const MAX_DEPTH: usize = 128;
/// Most nodes one file may expand to (aliases included).
pub const MAX_NODES: usize = 1_000_000;

/// How a scalar was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Unquoted.
    Plain,
    /// `'…'` or `"…"`.
    Quoted,
    /// `|` or `>`.
    Block,
}

/// A YAML value with its position.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Where the node starts (for a scalar: its whole text).
    pub span: Span,
    /// The value.
    pub value: Value,
}

/// The shape of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A scalar, as written.
    Scalar(String, Style),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping in document order.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// Moves the node and everything in it to `file` (a tree parsed ahead,
    /// under a provisional id, before its file was registered).
    pub fn set_file(&mut self, file: FileId) {
        self.span.file = file;
        match &mut self.value {
            Value::Scalar(..) => {}
            Value::Seq(items) => items.iter_mut().for_each(|n| n.set_file(file)),
            Value::Map(entries) => entries.iter_mut().for_each(|(k, v)| {
                k.set_file(file);
                v.set_file(file);
            }),
        }
    }

    /// Whether this is a plain null (`~`, `null`, or nothing).
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar(s, Style::Plain) if is_null_text(s))
    }

    /// The scalar text, when this is a scalar.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar(s, _) => Some(s),
            _ => None,
        }
    }

    /// The entries, when this is a mapping.
    pub fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    /// The items, when this is a sequence.
    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(s) => Some(s),
            _ => None,
        }
    }

    /// The value under a string key of a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// The key node (for its span) under a string key of a mapping.
    pub fn key_node(&self, key: &str) -> Option<&Node> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(k, _)| k)
    }

    /// A short description of the node's kind, for error messages.
    pub fn kind_name(&self) -> &'static str {
        match &self.value {
            Value::Scalar(..) if self.is_null() => "nothing (null)",
            Value::Scalar(..) => "a scalar",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// Converts to a JSON value: scalars become bool/number/null when plain
    /// and unambiguous (YAML 1.2 core schema), otherwise strings.
    pub fn to_json(&self) -> serde_json::Value {
        match &self.value {
            Value::Scalar(s, Style::Plain) => plain_scalar_json(s),
            Value::Scalar(s, _) => serde_json::Value::String(s.clone()),
            Value::Seq(items) => {
                serde_json::Value::Array(items.iter().map(Node::to_json).collect())
            }
            Value::Map(entries) => {
                let mut m = serde_json::Map::new();
                for (k, v) in entries {
                    let key = match &k.value {
                        Value::Scalar(s, _) => s.clone(),
                        _ => k.to_json().to_string(),
                    };
                    m.insert(key, v.to_json());
                }
                serde_json::Value::Object(m)
            }
        }
    }
}

/// Whether plain scalar text means null in YAML 1.2 core.
pub fn is_null_text(s: &str) -> bool {
    matches!(s, "" | "~" | "null" | "Null" | "NULL")
}

/// Plain scalar typing per the YAML 1.2 core schema, strictly: only
/// `true`/`false` are booleans and numbers with leading zeros stay text.
pub fn plain_scalar_json(s: &str) -> serde_json::Value {
    if is_null_text(s) {
        return serde_json::Value::Null;
    }
    match s {
        "true" | "True" | "TRUE" => return serde_json::Value::Bool(true),
        "false" | "False" | "FALSE" => return serde_json::Value::Bool(false),
        _ => {}
    }
    if let Some(i) = parse_int(s) {
        return serde_json::Value::from(i);
    }
    if let Some(f) = parse_float(s)
        && let Some(n) = serde_json::Number::from_f64(f)
    {
        return serde_json::Value::Number(n);
    }
    serde_json::Value::String(s.to_string())
}

/// A decimal integer without leading zeros (so `0755` stays text).
pub fn parse_int(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    s.parse().ok()
}

/// A plain float like `1.5` or `-2e3` (not `1.10.2`, not `.inf`).
pub fn parse_float(s: &str) -> Option<f64> {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    let first = body.chars().next()?;
    if !(first.is_ascii_digit() || first == '.') {
        return None;
    }
    if body.len() > 1 && body.starts_with('0') && !body.starts_with("0.") {
        return None;
    }
    if !body.contains(['.', 'e', 'E']) {
        return None;
    }
    s.parse().ok()
}

/// Parses a YAML stream into documents. An empty stream yields no documents.
pub fn parse_stream(file: FileId, text: &str) -> Result<Vec<Node>, Diagnostic> {
    let lines = LineIndex::new(text);
    let mut b = Builder {
        file,
        lines: &lines,
        anchors: HashMap::new(),
        nodes: 0,
    };
    let mut parser = Parser::new_from_str(text);
    let mut docs = Vec::new();
    while let Some(ev) = parser.next_event() {
        let (ev, span) = ev.map_err(|e| b.scan_error(&e))?;
        match ev {
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
            Event::StreamEnd => break,
            Event::DocumentStart(_) => {
                b.anchors.clear();
                let Some(next) = parser.next_event() else {
                    break;
                };
                let (ev, span) = next.map_err(|e| b.scan_error(&e))?;
                if matches!(ev, Event::DocumentEnd) {
                    continue;
                }
                let node = b.node(&mut parser, ev, span, 0)?;
                docs.push(node);
            }
            other => {
                return Err(Diagnostic::error(
                    b.span(&span),
                    format!("unexpected YAML event {other:?}"),
                ));
            }
        }
    }
    Ok(docs)
}

struct Builder<'a> {
    file: FileId,
    lines: &'a LineIndex<'a>,
    anchors: HashMap<usize, Node>,
    nodes: usize,
}

impl Builder<'_> {
    fn span(&self, s: &saphyr_parser::Span) -> Span {
        let start = self.lines.offset(s.start.line(), s.start.col());
        let end = self.lines.offset(s.end.line(), s.end.col()).max(start);
        Span {
            file: self.file,
            offset: start as u32,
            len: (end - start) as u32,
            line: s.start.line() as u32,
            col: s.start.col() as u32 + 1,
        }
    }

    fn scan_error(&self, e: &saphyr_parser::ScanError) -> Diagnostic {
        let m = e.marker();
        let offset = self.lines.offset(m.line(), m.col());
        Diagnostic::error(
            Span {
                file: self.file,
                offset: offset as u32,
                len: 1,
                line: m.line() as u32,
                col: m.col() as u32 + 1,
            },
            format!("YAML syntax error: {}", e.info()),
        )
    }

    fn count(&mut self, span: Span) -> Result<(), Diagnostic> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(Diagnostic::error(
                span,
                format!("document expands to more than {MAX_NODES} nodes (alias bomb?)"),
            ));
        }
        Ok(())
    }

    fn next<'i>(
        &self,
        parser: &mut Parser<'i, saphyr_parser::StrInput<'i>>,
        at: Span,
    ) -> Result<(Event<'i>, saphyr_parser::Span), Diagnostic> {
        match parser.next_event() {
            Some(Ok(x)) => Ok(x),
            Some(Err(e)) => Err(self.scan_error(&e)),
            None => Err(Diagnostic::error(at, "unexpected end of YAML input")),
        }
    }

    fn node<'i>(
        &mut self,
        parser: &mut Parser<'i, saphyr_parser::StrInput<'i>>,
        ev: Event<'i>,
        raw_span: saphyr_parser::Span,
        depth: usize,
    ) -> Result<Node, Diagnostic> {
        let span = self.span(&raw_span);
        if depth > MAX_DEPTH {
            return Err(Diagnostic::error(
                span,
                format!("nesting deeper than {MAX_DEPTH} levels"),
            ));
        }
        self.count(span)?;
        let (node, anchor) = match ev {
            Event::Scalar(text, style, anchor, _tag) => {
                let style = match style {
                    ScalarStyle::Plain => Style::Plain,
                    ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted => Style::Quoted,
                    _ => Style::Block,
                };
                (
                    Node {
                        span,
                        value: Value::Scalar(text.into_owned(), style),
                    },
                    anchor,
                )
            }
            Event::SequenceStart(anchor, _tag) => {
                let mut items = Vec::new();
                loop {
                    let (ev, sp) = self.next(parser, span)?;
                    if matches!(ev, Event::SequenceEnd) {
                        break;
                    }
                    items.push(self.node(parser, ev, sp, depth + 1)?);
                }
                (
                    Node {
                        span,
                        value: Value::Seq(items),
                    },
                    anchor,
                )
            }
            Event::MappingStart(anchor, _tag) => {
                let mut entries: Vec<(Node, Node)> = Vec::new();
                loop {
                    let (ev, sp) = self.next(parser, span)?;
                    if matches!(ev, Event::MappingEnd) {
                        break;
                    }
                    let key = self.node(parser, ev, sp, depth + 1)?;
                    let (ev, sp) = self.next(parser, span)?;
                    let value = self.node(parser, ev, sp, depth + 1)?;
                    if let Some(k) = key.as_str()
                        && let Some((first, _)) =
                            entries.iter().find(|(e, _)| e.as_str() == Some(k))
                    {
                        return Err(Diagnostic::error(
                            key.span,
                            format!(
                                "duplicate key `{k}` (first defined at line {})",
                                first.span.line
                            ),
                        )
                        .with_hint("a YAML mapping may define each key once"));
                    }
                    entries.push((key, value));
                }
                (
                    Node {
                        span,
                        value: Value::Map(entries),
                    },
                    anchor,
                )
            }
            Event::Alias(id) => {
                let Some(target) = self.anchors.get(&id).cloned() else {
                    return Err(Diagnostic::error(span, "alias to an unknown anchor"));
                };
                let size = count_nodes(&target);
                self.nodes += size;
                if self.nodes > MAX_NODES {
                    return Err(Diagnostic::error(
                        span,
                        format!("document expands to more than {MAX_NODES} nodes (alias bomb?)"),
                    ));
                }
                return Ok(target);
            }
            other => {
                return Err(Diagnostic::error(
                    span,
                    format!("unexpected YAML event {other:?}"),
                ));
            }
        };
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        Ok(node)
    }
}

fn count_nodes(n: &Node) -> usize {
    match &n.value {
        Value::Scalar(..) => 1,
        Value::Seq(items) => 1 + items.iter().map(count_nodes).sum::<usize>(),
        Value::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| count_nodes(k) + count_nodes(v))
                .sum::<usize>()
        }
    }
}

/// Checks that bytes are a loadable text file (size, UTF-8, no NUL).
pub fn check_text(bytes: &[u8]) -> Result<&str, String> {
    if bytes.len() > MAX_FILE_BYTES {
        return Err(format!(
            "file is {:.1} MB; charly reads YAML files up to {} MiB",
            bytes.len() as f64 / 1_000_000.0,
            MAX_FILE_BYTES / (1024 * 1024)
        ));
    }
    if bytes.contains(&0) {
        return Err("file contains NUL bytes: it is binary, not YAML".into());
    }
    std::str::from_utf8(bytes).map_err(|e| {
        format!(
            "file is not valid UTF-8 (byte {}): it is binary or in another encoding",
            e.valid_up_to()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<Node> {
        parse_stream(FileId(0), text).expect("parses")
    }

    #[test]
    fn keeps_scalar_text_and_positions() {
        let docs = parse("a:\n  mode: 0755\n  b: NO\n  c: \"x\"\n");
        let a = docs[0].get("a").expect("a");
        let mode = a.get("mode").expect("mode");
        assert_eq!(mode.as_str(), Some("0755"));
        assert_eq!((mode.span.line, mode.span.col), (2, 9));
        assert_eq!(a.get("b").and_then(Node::as_str), Some("NO"));
        assert_eq!(
            a.get("c").map(|n| &n.value),
            Some(&Value::Scalar("x".into(), Style::Quoted))
        );
    }

    #[test]
    fn byte_offsets_account_for_multibyte_chars() {
        let text = "k: \"é\"\nx: y\n";
        let docs = parse(text);
        let x = docs[0].get("x").expect("x");
        assert_eq!(&text[x.span.offset as usize..][..1], "y");
    }

    #[test]
    fn duplicate_keys_are_errors() {
        let err = parse_stream(FileId(0), "a: 1\nb: 2\na: 3\n").expect_err("dup");
        assert!(err.message.contains("duplicate key `a`"), "{}", err.message);
        assert_eq!(err.span.map(|s| s.line), Some(3));
    }

    #[test]
    fn syntax_errors_keep_position() {
        let err = parse_stream(FileId(0), "a: [1, 2\nb: c\n").expect_err("bad");
        assert!(err.message.starts_with("YAML syntax error"));
        assert!(err.span.is_some());
    }

    #[test]
    fn alias_bomb_is_stopped() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let err = parse_stream(FileId(0), &text).expect_err("bomb");
        assert!(err.message.contains("alias bomb"));
    }

    #[test]
    fn deep_nesting_is_stopped() {
        let text = "[".repeat(500) + &"]".repeat(500);
        let err = parse_stream(FileId(0), &text).expect_err("deep");
        assert!(
            err.message.contains("nesting") || err.message.contains("recursion limit"),
            "{}",
            err.message
        );
    }

    #[test]
    fn empty_stream_has_no_documents() {
        assert!(parse("").is_empty());
        assert!(parse("# only a comment\n").is_empty());
    }

    #[test]
    fn strict_plain_typing() {
        assert_eq!(plain_scalar_json("0755"), serde_json::json!("0755"));
        assert_eq!(plain_scalar_json("on"), serde_json::json!("on"));
        assert_eq!(plain_scalar_json("8080"), serde_json::json!(8080));
        assert_eq!(plain_scalar_json("true"), serde_json::json!(true));
        assert_eq!(plain_scalar_json("1.5"), serde_json::json!(1.5));
        assert_eq!(
            plain_scalar_json("2026.144.1443"),
            serde_json::json!("2026.144.1443")
        );
        assert_eq!(plain_scalar_json("~"), serde_json::Value::Null);
    }

    #[test]
    fn binary_and_huge_files_are_rejected() {
        assert!(check_text(b"a\0b").is_err());
        assert!(check_text(&[0xff, 0xfe, 0x41]).is_err());
        assert!(check_text(&vec![b'a'; MAX_FILE_BYTES + 1]).is_err());
        assert_eq!(check_text(b"a: b"), Ok("a: b"));
    }
}
