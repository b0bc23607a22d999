//! The parser and its tree (Go: `text/template/parse/parse.go`).
//!
//! # Supported language
//!
//! Text and actions with `{{-`/`-}}` trim markers (they eat the adjacent
//! spaces, tabs and newlines), comments `{{/* */}}`, pipelines with `|`,
//! parenthesised pipelines, `.A.B.C` field chains, `$`, `$x`, `$x.A`,
//! `(pipe).A`, variable declaration (`:=`) and assignment (`=`), `if` /
//! `else if` / `else`, `with` / `else with` / `else`, `range` (arrays, maps in
//! sorted key order, integers, `$i, $v :=`, `else`, `break`, `continue`),
//! `define` / `template` / `block`, string (with Go escapes), raw string,
//! character, integer, float, bool and `nil` constants. Parse-time checks are
//! Go's: an undefined function or variable, a missing `{{end}}`, a stray
//! `{{else}}`, an empty command, a constant in a later pipeline stage.
//! Not supported (a parse error, never a silent difference): complex numbers,
//! the `call` builtin, custom delimiters, `%[n]` argument indexes in `printf`.

use super::lex::{Kw, SPACE_CHARS, T, Tok, lex};
use super::{MAX_DEPTH, is_func, location};
use serde_json::Value as Json;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Span {
    pub(super) pos: usize,
    pub(super) end: usize,
}

#[derive(Debug)]
pub(super) enum Node {
    Text(String),
    Action(Pipe),
    If(Box<Ctl>),
    With(Box<Ctl>),
    Range(Box<Ctl>),
    Template {
        span: Span,
        name: String,
        pipe: Option<Pipe>,
    },
    Break,
    Continue,
}

/// The parts of an `if`, `with` or `range`.
#[derive(Debug)]
pub(super) struct Ctl {
    pub(super) pipe: Pipe,
    pub(super) list: Vec<Node>,
    pub(super) else_list: Option<Vec<Node>>,
}

#[derive(Debug)]
pub(super) struct Pipe {
    pub(super) span: Span,
    pub(super) is_assign: bool,
    pub(super) decl: Vec<String>,
    pub(super) cmds: Vec<Cmd>,
}

#[derive(Debug)]
pub(super) struct Cmd {
    pub(super) span: Span,
    pub(super) args: Vec<Arg>,
}

#[derive(Debug)]
pub(super) enum Arg {
    Dot(Span),
    Nil(Span),
    Lit(Json, Span),
    Field(Vec<String>, Span),
    Var(Vec<String>, Span),
    Ident(String, Span),
    Pipe(Box<Pipe>),
    Chain(Box<Arg>, Vec<String>, Span),
}

impl Arg {
    fn span(&self) -> Span {
        match self {
            Arg::Dot(s)
            | Arg::Nil(s)
            | Arg::Lit(_, s)
            | Arg::Field(_, s)
            | Arg::Var(_, s)
            | Arg::Ident(_, s)
            | Arg::Chain(_, _, s) => *s,
            Arg::Pipe(p) => p.span,
        }
    }
}

/// A parsed template: the main tree and the `define`d ones.
#[derive(Debug)]
pub(super) struct Parsed {
    pub(super) text: String,
    pub(super) root: Vec<Node>,
    pub(super) defs: HashMap<String, Vec<Node>>,
}

/// What `text_or_action` found.
enum Item {
    Node(Node),
    End,
    Else(usize),
}

type PResult<T> = Result<T, (usize, String)>;

pub(super) fn parse(text: &str) -> Result<Parsed, String> {
    let toks = lex(text).map_err(|(pos, msg)| format!("{}: {msg}", location(text, pos)))?;
    let mut p = Parser {
        src: text,
        toks,
        i: 0,
        vars: vec!["$".to_string()],
        range_depth: 0,
        depth: 0,
        defs: HashMap::new(),
    };
    let root = p
        .parse_root()
        .map_err(|(pos, msg)| format!("{}: {msg}", location(text, pos)))?;
    Ok(Parsed {
        text: text.to_string(),
        root,
        defs: p.defs,
    })
}

struct Parser<'s> {
    src: &'s str,
    toks: Vec<Tok>,
    i: usize,
    vars: Vec<String>,
    range_depth: usize,
    depth: usize,
    defs: HashMap<String, Vec<Node>>,
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        let last = self.toks.len().saturating_sub(1);
        &self.toks[self.i.min(last)]
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if self.i + 1 < self.toks.len() {
            self.i += 1;
        }
        t
    }

    /// Skips spaces and returns (without consuming) the next token.
    fn peek_non_space(&mut self) -> Tok {
        while matches!(self.peek().t, T::Space) {
            self.i += 1;
        }
        self.peek().clone()
    }

    fn next_non_space(&mut self) -> Tok {
        self.peek_non_space();
        self.next()
    }

    fn describe(&self, tok: &Tok) -> String {
        match &tok.t {
            T::Eof => "EOF".into(),
            T::Kw(_) => format!("<{}>", &self.src[tok.pos..tok.end]),
            T::Text(_) => "text".into(),
            _ => {
                let s = &self.src[tok.pos..tok.end];
                if s.chars().count() > 10 {
                    let short: String = s.chars().take(10).collect();
                    format!("{short:?}...")
                } else {
                    format!("{s:?}")
                }
            }
        }
    }

    fn unexpected<X>(&self, tok: &Tok, context: &str) -> PResult<X> {
        Err((
            tok.pos,
            format!("unexpected {} in {context}", self.describe(tok)),
        ))
    }

    fn expect_right(&mut self, context: &str) -> PResult<()> {
        let tok = self.next_non_space();
        if tok.t == T::Right {
            Ok(())
        } else {
            self.unexpected(&tok, context)
        }
    }

    fn enter(&mut self, pos: usize) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err((pos, "max expression depth exceeded".into()));
        }
        Ok(())
    }

    fn parse_root(&mut self) -> PResult<Vec<Node>> {
        let mut root = Vec::new();
        while self.peek().t != T::Eof {
            if self.peek().t == T::Left {
                let save = self.i;
                self.next();
                if self.next_non_space().t == T::Kw(Kw::Define) {
                    self.parse_definition()?;
                    continue;
                }
                self.i = save;
            }
            let pos = self.peek().pos;
            match self.text_or_action()? {
                Item::Node(n) => root.push(n),
                Item::End => return Err((pos, "unexpected {{end}}".into())),
                Item::Else(_) => return Err((pos, "unexpected {{else}}".into())),
            }
        }
        Ok(root)
    }

    fn template_name(&mut self, context: &str) -> PResult<String> {
        let tok = self.next_non_space();
        match &tok.t {
            T::Str(raw) => unquote(raw).map_err(|e| (tok.pos, e)),
            T::RawStr(s) => Ok(s.clone()),
            _ => self.unexpected(&tok, context),
        }
    }

    fn parse_definition(&mut self) -> PResult<()> {
        let context = "define clause";
        let pos = self.peek_non_space().pos;
        let name = self.template_name(context)?;
        self.expect_right(context)?;
        let saved = std::mem::replace(&mut self.vars, vec!["$".to_string()]);
        let saved_range = std::mem::take(&mut self.range_depth);
        let r = self.item_list();
        self.vars = saved;
        self.range_depth = saved_range;
        let (list, end) = r?;
        if let Item::Else(p) = end {
            return Err((p, format!("unexpected {{{{else}}}} in {context}")));
        }
        self.add_def(pos, name, list)
    }

    fn add_def(&mut self, pos: usize, name: String, list: Vec<Node>) -> PResult<()> {
        match self.defs.get(&name) {
            Some(old) if !is_empty_tree(old) => {
                if is_empty_tree(&list) {
                    Ok(())
                } else {
                    Err((
                        pos,
                        format!("template: multiple definition of template {name:?}"),
                    ))
                }
            }
            _ => {
                self.defs.insert(name, list);
                Ok(())
            }
        }
    }

    fn text_or_action(&mut self) -> PResult<Item> {
        let tok = self.next_non_space();
        match tok.t {
            T::Text(s) => Ok(Item::Node(Node::Text(s))),
            T::Left => {
                self.enter(tok.pos)?;
                let r = self.action();
                self.depth -= 1;
                r
            }
            _ => self.unexpected(&tok, "input"),
        }
    }

    fn action(&mut self) -> PResult<Item> {
        let save = self.i;
        let tok = self.next_non_space();
        let node = match tok.t {
            T::Kw(Kw::Block) => self.block_control(tok.pos)?,
            T::Kw(Kw::Break) | T::Kw(Kw::Continue) => {
                let is_break = tok.t == T::Kw(Kw::Break);
                let what = if is_break {
                    "{{break}}"
                } else {
                    "{{continue}}"
                };
                let next = self.next_non_space();
                if next.t != T::Right {
                    return self.unexpected(&next, what);
                }
                if self.range_depth == 0 {
                    return Err((tok.pos, format!("{what} outside {{{{range}}}}")));
                }
                if is_break {
                    Node::Break
                } else {
                    Node::Continue
                }
            }
            T::Kw(Kw::Else) => {
                let peek = self.peek_non_space();
                if matches!(peek.t, T::Kw(Kw::If) | T::Kw(Kw::With)) {
                    // `{{else if …}}` is `{{else}}{{if …}}` with one shared end.
                    return Ok(Item::Else(tok.pos));
                }
                self.expect_right("else")?;
                return Ok(Item::Else(tok.pos));
            }
            T::Kw(Kw::End) => {
                self.expect_right("end")?;
                return Ok(Item::End);
            }
            T::Kw(Kw::If) => Node::If(self.control("if")?),
            T::Kw(Kw::Range) => Node::Range(self.control("range")?),
            T::Kw(Kw::With) => Node::With(self.control("with")?),
            T::Kw(Kw::Template) => {
                let context = "template clause";
                let name = self.template_name(context)?;
                let (pipe, end) = if self.peek_non_space().t == T::Right {
                    (None, self.next().pos)
                } else {
                    // Variables declared here persist until the enclosing end.
                    let p = self.pipeline(context, false)?;
                    let end = p.span.end;
                    (Some(p), end)
                };
                Node::Template {
                    span: Span { pos: tok.pos, end },
                    name,
                    pipe,
                }
            }
            _ => {
                self.i = save;
                Node::Action(self.pipeline("command", false)?)
            }
        };
        Ok(Item::Node(node))
    }

    fn block_control(&mut self, start: usize) -> PResult<Node> {
        let context = "block clause";
        let name = self.template_name(context)?;
        let pipe = self.pipeline(context, false)?;
        let saved = std::mem::replace(&mut self.vars, vec!["$".to_string()]);
        let saved_range = std::mem::take(&mut self.range_depth);
        let r = self.item_list();
        self.vars = saved;
        self.range_depth = saved_range;
        let (list, end) = r?;
        if let Item::Else(p) = end {
            return Err((p, format!("unexpected {{{{else}}}} in {context}")));
        }
        self.add_def(start, name.clone(), list)?;
        Ok(Node::Template {
            span: Span {
                pos: start,
                end: pipe.span.end,
            },
            name,
            pipe: Some(pipe),
        })
    }

    /// `if`, `range`, `with`: pipeline, list, optional else list, end.
    fn control(&mut self, context: &'static str) -> PResult<Box<Ctl>> {
        let nvars = self.vars.len();
        let r = self.control_inner(context);
        self.vars.truncate(nvars);
        r
    }

    fn control_inner(&mut self, context: &'static str) -> PResult<Box<Ctl>> {
        let pipe = self.pipeline(context, false)?;
        let is_range = context == "range";
        if is_range {
            self.range_depth += 1;
        }
        let r = self.item_list();
        if is_range {
            self.range_depth -= 1;
        }
        let (list, next) = r?;
        let else_list = match next {
            Item::Else(pos) => {
                let peek = self.peek().t.clone();
                if context == "if" && peek == T::Kw(Kw::If) {
                    self.next();
                    Some(vec![Node::If(self.control("if")?)])
                } else if context == "with" && peek == T::Kw(Kw::With) {
                    self.next();
                    Some(vec![Node::With(self.control("with")?)])
                } else {
                    let (l, n) = self.item_list()?;
                    if !matches!(n, Item::End) {
                        return Err((pos, "expected end; found {{else}}".into()));
                    }
                    Some(l)
                }
            }
            _ => None,
        };
        Ok(Box::new(Ctl {
            pipe,
            list,
            else_list,
        }))
    }

    /// Nodes up to an `{{end}}` or `{{else}}`, which is returned too.
    fn item_list(&mut self) -> PResult<(Vec<Node>, Item)> {
        let mut list = Vec::new();
        while self.peek_non_space().t != T::Eof {
            match self.text_or_action()? {
                Item::Node(n) => list.push(n),
                other => return Ok((list, other)),
            }
        }
        Err((self.peek().pos, "unexpected EOF".into()))
    }

    fn pipeline(&mut self, context: &str, in_paren: bool) -> PResult<Pipe> {
        let pos = self.peek_non_space().pos;
        self.enter(pos)?;
        let r = self.pipeline_inner(context, in_paren, pos);
        self.depth -= 1;
        r
    }

    fn pipeline_inner(&mut self, context: &str, in_paren: bool, pos: usize) -> PResult<Pipe> {
        let mut pipe = Pipe {
            span: Span { pos, end: pos },
            is_assign: false,
            decl: Vec::new(),
            cmds: Vec::new(),
        };
        // Declarations: `$x :=`, `$x =`, `$i, $v :=` (range only).
        while let T::Var(name) = self.peek_non_space().t {
            let var_at = self.i;
            self.next();
            let next = self.peek_non_space();
            match next.t {
                T::Assign | T::Declare => {
                    pipe.is_assign = next.t == T::Assign;
                    self.next();
                    pipe.decl.push(name.clone());
                    self.vars.push(name);
                }
                T::Char(',') => {
                    self.next();
                    pipe.decl.push(name.clone());
                    self.vars.push(name);
                    if context == "range" && pipe.decl.len() < 2 {
                        match self.peek_non_space().t {
                            T::Var(_) | T::Right | T::RParen => continue,
                            _ => {
                                return Err((
                                    next.pos,
                                    "range can only initialize variables".into(),
                                ));
                            }
                        }
                    }
                    return Err((next.pos, format!("too many declarations in {context}")));
                }
                _ => self.i = var_at,
            }
            break;
        }
        loop {
            let save = self.i;
            let tok = self.next_non_space();
            match tok.t {
                T::Right if !in_paren => {
                    pipe.span.end = tok.pos;
                    self.check_pipeline(&pipe, context, pos)?;
                    return Ok(pipe);
                }
                T::RParen if in_paren => {
                    pipe.span.end = tok.end;
                    self.check_pipeline(&pipe, context, pos)?;
                    return Ok(pipe);
                }
                T::Bool(_)
                | T::CharConst(_)
                | T::Dot
                | T::Field(_)
                | T::Ident(_)
                | T::Num(_)
                | T::Nil
                | T::RawStr(_)
                | T::Str(_)
                | T::Var(_)
                | T::LParen => {
                    self.i = save;
                    pipe.cmds.push(self.command()?);
                }
                _ => return self.unexpected(&tok, context),
            }
        }
    }

    fn check_pipeline(&self, pipe: &Pipe, context: &str, pos: usize) -> PResult<()> {
        if pipe.cmds.is_empty() {
            return Err((pos, format!("missing value for {context}")));
        }
        for (i, c) in pipe.cmds.iter().enumerate().skip(1) {
            if let Some(Arg::Lit(..) | Arg::Dot(_) | Arg::Nil(_)) = c.args.first() {
                return Err((
                    c.args[0].span().pos,
                    format!("non executable command in pipeline stage {}", i + 1),
                ));
            }
        }
        Ok(())
    }

    fn command(&mut self) -> PResult<Cmd> {
        let pos = self.peek_non_space().pos;
        let mut args = Vec::new();
        loop {
            self.peek_non_space();
            if let Some(op) = self.operand()? {
                args.push(op);
            }
            let save = self.i;
            let tok = self.next();
            match tok.t {
                T::Space => continue,
                T::Right | T::RParen => self.i = save,
                T::Pipe => {}
                _ => return self.unexpected(&tok, "operand"),
            }
            break;
        }
        let (Some(first), Some(last)) = (args.first(), args.last()) else {
            return Err((pos, "empty command".into()));
        };
        let span = Span {
            pos: first.span().pos,
            end: last.span().end,
        };
        Ok(Cmd { span, args })
    }

    fn operand(&mut self) -> PResult<Option<Arg>> {
        let Some(node) = self.term()? else {
            return Ok(None);
        };
        if !matches!(self.peek().t, T::Field(_)) {
            return Ok(Some(node));
        }
        let start = node.span().pos;
        let mut fields = Vec::new();
        let mut end = start;
        while let T::Field(f) = &self.peek().t {
            fields.push(f.clone());
            end = self.peek().end;
            self.next();
        }
        let span = Span { pos: start, end };
        Ok(Some(match node {
            Arg::Field(mut idents, _) => {
                idents.extend(fields);
                Arg::Field(idents, span)
            }
            Arg::Var(mut idents, _) => {
                idents.extend(fields);
                Arg::Var(idents, span)
            }
            Arg::Lit(_, s) | Arg::Nil(s) | Arg::Dot(s) => {
                return Err((
                    s.pos,
                    format!("unexpected . after term {:?}", &self.src[s.pos..s.end]),
                ));
            }
            other => Arg::Chain(Box::new(other), fields, span),
        }))
    }

    fn term(&mut self) -> PResult<Option<Arg>> {
        self.peek_non_space();
        let save = self.i;
        let tok = self.next();
        let sp = Span {
            pos: tok.pos,
            end: tok.end,
        };
        let arg = match tok.t {
            T::Ident(name) => {
                if !is_func(&name) {
                    return Err((tok.pos, format!("function {name:?} not defined")));
                }
                Arg::Ident(name, sp)
            }
            T::Dot => Arg::Dot(sp),
            T::Nil => Arg::Nil(sp),
            T::Var(name) => {
                if !self.vars.contains(&name) {
                    return Err((tok.pos, format!("undefined variable {name:?}")));
                }
                Arg::Var(vec![name], sp)
            }
            T::Field(f) => Arg::Field(vec![f], sp),
            T::Bool(b) => Arg::Lit(Json::Bool(b), sp),
            T::Num(text) => Arg::Lit(parse_number(&text).map_err(|e| (tok.pos, e))?, sp),
            T::CharConst(raw) => Arg::Lit(char_constant(&raw).map_err(|e| (tok.pos, e))?, sp),
            T::Str(raw) => Arg::Lit(Json::String(unquote(&raw).map_err(|e| (tok.pos, e))?), sp),
            T::RawStr(s) => Arg::Lit(Json::String(s), sp),
            T::LParen => {
                let mut p = self.pipeline("parenthesized pipeline", true)?;
                p.span.pos = tok.pos;
                Arg::Pipe(Box::new(p))
            }
            _ => {
                self.i = save;
                return Ok(None);
            }
        };
        Ok(Some(arg))
    }
}

/// Go's `IsEmptyTree`: only whitespace text.
fn is_empty_tree(list: &[Node]) -> bool {
    list.iter().all(|n| match n {
        Node::Text(t) => t.trim_matches(SPACE_CHARS).is_empty(),
        _ => false,
    })
}

/// Parses a number constant the way Go's `idealConstant` types it: integer
/// syntax gives an `int`, a `.`/exponent gives a `float64`.
fn parse_number(text: &str) -> Result<Json, String> {
    if text.ends_with('i') {
        return Err(format!("complex numbers are not supported: {text:?}"));
    }
    let clean: String = text.chars().filter(|&c| c != '_').collect();
    let (neg, body) = match clean.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, clean.strip_prefix('+').unwrap_or(&clean)),
    };
    let lower = body.to_ascii_lowercase();
    let digits_only = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
    let int = if let Some(h) = lower.strip_prefix("0x") {
        if h.contains('p') || h.contains('.') {
            return Err(format!("hexadecimal floats are not supported: {text:?}"));
        }
        u64::from_str_radix(h, 16).ok()
    } else if let Some(o) = lower.strip_prefix("0o") {
        u64::from_str_radix(o, 8).ok()
    } else if let Some(b) = lower.strip_prefix("0b") {
        u64::from_str_radix(b, 2).ok()
    } else if lower.len() > 1 && lower.starts_with('0') && digits_only(&lower) {
        u64::from_str_radix(&lower[1..], 8).ok()
    } else if digits_only(&lower) {
        lower.parse::<u64>().ok()
    } else {
        None
    };
    if let Some(u) = int {
        let v = if neg { -i128::from(u) } else { i128::from(u) };
        return i64::try_from(v)
            .map(Json::from)
            .map_err(|_| format!("{text} overflows int"));
    }
    let f: f64 = body
        .parse()
        .map_err(|_| format!("illegal number syntax: {text:?}"))?;
    let f = if neg { -f } else { f };
    let floaty = lower.contains(['.', 'e']);
    if !floaty && f.fract() == 0.0 && f.abs() < 9.2e18 {
        // `089`: not octal, but integral; Go makes it an int.
        #[allow(clippy::cast_possible_truncation)]
        return Ok(Json::from(f as i64));
    }
    serde_json::Number::from_f64(f)
        .map(Json::Number)
        .ok_or_else(|| format!("illegal number syntax: {text:?}"))
}

fn char_constant(raw: &str) -> Result<Json, String> {
    let bytes = unquote_bytes(raw)?;
    let s = String::from_utf8_lossy(&bytes);
    let mut it = s.chars();
    match (it.next(), it.next()) {
        (Some(c), None) if bytes.len() == c.len_utf8() => Ok(Json::from(u32::from(c))),
        _ if bytes.len() == 1 => Ok(Json::from(bytes[0])),
        _ => Err(format!("malformed character constant: {raw}")),
    }
}

/// Go's `strconv.Unquote` for `"…"` (the lexer guarantees the quotes).
fn unquote(raw: &str) -> Result<String, String> {
    let bytes = unquote_bytes(raw)?;
    Ok(String::from_utf8(bytes)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

fn unquote_bytes(raw: &str) -> Result<Vec<u8>, String> {
    let bad = || format!("invalid syntax: {raw}");
    let q = raw.chars().next().ok_or_else(bad)?;
    let inner = raw
        .get(1..raw.len().saturating_sub(1))
        .filter(|_| raw.len() >= 2 && raw.ends_with(q))
        .ok_or_else(bad)?;
    let mut out = Vec::with_capacity(inner.len());
    let mut it = inner.chars().peekable();
    let hex = |it: &mut std::iter::Peekable<std::str::Chars<'_>>, n: usize| -> Option<u32> {
        let mut v = 0u32;
        for _ in 0..n {
            v = v * 16 + it.next()?.to_digit(16)?;
        }
        Some(v)
    };
    while let Some(c) = it.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        let e = it.next().ok_or_else(bad)?;
        let ch = match e {
            'a' => '\u{7}',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'v' => '\u{b}',
            '\\' => '\\',
            '"' if q == '"' => '"',
            '\'' if q == '\'' => '\'',
            'x' => {
                let v = hex(&mut it, 2).ok_or_else(bad)?;
                out.push(u8::try_from(v).map_err(|_| bad())?);
                continue;
            }
            '0'..='7' => {
                let mut v = e.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    v = v * 8 + it.next().and_then(|d| d.to_digit(8)).ok_or_else(bad)?;
                }
                out.push(u8::try_from(v).map_err(|_| bad())?);
                continue;
            }
            'u' => char::from_u32(hex(&mut it, 4).ok_or_else(bad)?).ok_or_else(bad)?,
            'U' => char::from_u32(hex(&mut it, 8).ok_or_else(bad)?).ok_or_else(bad)?,
            _ => return Err(bad()),
        };
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
    }
    Ok(out)
}
