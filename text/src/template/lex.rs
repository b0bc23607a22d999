//! The lexer (Go: `text/template/parse/lex.go`): text, `{{`/`}}` actions
//! with `{{-`/`-}}` trim markers (they eat the adjacent spaces, tabs and
//! newlines), comments `{{/* */}}`, and the tokens inside actions.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kw {
    Block,
    Break,
    Continue,
    Define,
    Else,
    End,
    If,
    Range,
    Template,
    With,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) enum T {
    Text(String),
    Left,
    Right,
    Space,
    Pipe,
    LParen,
    RParen,
    Assign,
    Declare,
    Char(char),
    /// A quoted string, quotes included.
    Str(String),
    /// A raw string's contents.
    RawStr(String),
    Num(String),
    /// A character constant, quotes included.
    CharConst(String),
    Bool(bool),
    Dot,
    /// A field name without its dot.
    Field(String),
    /// A variable name with its `$`.
    Var(String),
    Ident(String),
    Kw(Kw),
    Nil,
    Eof,
}

#[derive(Clone, Debug)]
pub(super) struct Tok {
    pub(super) t: T,
    pub(super) pos: usize,
    pub(super) end: usize,
}

type LexResult<T> = Result<T, (usize, String)>;

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_alnum(c: char) -> bool {
    c == '_' || c.is_alphabetic() || c.is_numeric()
}

pub(super) const SPACE_CHARS: &[char] = &[' ', '\t', '\r', '\n'];

fn has_left_trim(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 2 && b[0] == b'-' && is_space(char::from(b[1]))
}

fn has_right_trim(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 2 && is_space(char::from(b[0])) && b[1] == b'-'
}

/// Whether a right delimiter starts at `p`, and whether it has a trim marker.
fn at_right_delim(s: &str, p: usize) -> (bool, bool) {
    let rest = &s[p..];
    if has_right_trim(rest) && rest[2..].starts_with("}}") {
        (true, true)
    } else {
        (rest.starts_with("}}"), false)
    }
}

fn left_trim_len(s: &str) -> usize {
    s.len() - s.trim_start_matches(SPACE_CHARS).len()
}

fn at_terminator(s: &str, p: usize) -> bool {
    match s[p..].chars().next() {
        None => true,
        Some(c) if is_space(c) => true,
        Some('.' | ',' | '|' | ':' | ')' | '(') => true,
        _ => s[p..].starts_with("}}"),
    }
}

pub(super) fn lex(s: &str) -> LexResult<Vec<Tok>> {
    let mut toks = Vec::new();
    let mut pos = 0;
    loop {
        let Some(i) = s[pos..].find("{{") else {
            if pos < s.len() {
                toks.push(Tok {
                    t: T::Text(s[pos..].to_string()),
                    pos,
                    end: s.len(),
                });
            }
            toks.push(Tok {
                t: T::Eof,
                pos: s.len(),
                end: s.len(),
            });
            return Ok(toks);
        };
        let delim = pos + i;
        let mut p = delim + 2;
        let trim = has_left_trim(&s[p..]);
        let text_end = if trim {
            pos + s[pos..delim].trim_end_matches(SPACE_CHARS).len()
        } else {
            delim
        };
        if text_end > pos {
            toks.push(Tok {
                t: T::Text(s[pos..text_end].to_string()),
                pos,
                end: text_end,
            });
        }
        if trim {
            p += 2;
        }
        if s[p..].starts_with("/*") {
            let body = p + 2;
            let Some(j) = s[body..].find("*/") else {
                return Err((delim, "unclosed comment".into()));
            };
            p = body + j + 2;
            let (is_delim, trim_after) = at_right_delim(s, p);
            if !is_delim {
                return Err((delim, "comment ends before closing delimiter".into()));
            }
            p += if trim_after { 4 } else { 2 };
            if trim_after {
                p += left_trim_len(&s[p..]);
            }
            pos = p;
            continue;
        }
        toks.push(Tok {
            t: T::Left,
            pos: delim,
            end: p,
        });
        pos = lex_action(s, p, &mut toks)?;
    }
}

/// Lexes the inside of an action starting at `p`; returns the position after
/// its right delimiter (and the spaces a trim marker eats).
fn lex_action(s: &str, mut p: usize, toks: &mut Vec<Tok>) -> LexResult<usize> {
    let mut paren = 0i32;
    loop {
        let (is_delim, trim) = at_right_delim(s, p);
        if is_delim {
            if paren != 0 {
                return Err((p, "unclosed left paren".into()));
            }
            let start = p;
            p += if trim { 4 } else { 2 };
            toks.push(Tok {
                t: T::Right,
                pos: start,
                end: p,
            });
            if trim {
                p += left_trim_len(&s[p..]);
            }
            return Ok(p);
        }
        let rest = &s[p..];
        let Some(c) = rest.chars().next() else {
            return Err((p, "unclosed action".into()));
        };
        let start = p;
        let t = match c {
            _ if is_space(c) => {
                let mut n = 0;
                while s[p..].starts_with(SPACE_CHARS) {
                    p += 1;
                    n += 1;
                }
                // " -}}": the last space belongs to the trim marker.
                if s[p..].starts_with("-}}") {
                    p -= 1;
                    if n == 1 {
                        continue;
                    }
                }
                T::Space
            }
            '=' => {
                p += 1;
                T::Assign
            }
            ':' => {
                if !rest.starts_with(":=") {
                    return Err((p, "expected :=".into()));
                }
                p += 2;
                T::Declare
            }
            '|' => {
                p += 1;
                T::Pipe
            }
            '"' => {
                p = scan_quoted(s, p, '"')?;
                T::Str(s[start..p].to_string())
            }
            '\'' => {
                p = scan_quoted(s, p, '\'')?;
                T::CharConst(s[start..p].to_string())
            }
            '`' => match s[p + 1..].find('`') {
                Some(j) => {
                    p += j + 2;
                    T::RawStr(s[start + 1..p - 1].to_string())
                }
                None => return Err((p, "unterminated raw quoted string".into())),
            },
            '$' => {
                p = scan_word(s, p + 1)?;
                T::Var(s[start..p].to_string())
            }
            '.' if rest[1..]
                .chars()
                .next()
                .is_some_and(|n| !n.is_ascii_digit()) =>
            {
                if at_terminator(s, p + 1) {
                    p += 1;
                    T::Dot
                } else {
                    p = scan_word(s, p + 1)?;
                    T::Field(s[start + 1..p].to_string())
                }
            }
            '.' | '+' | '-' | '0'..='9' => {
                p = scan_number(s, p)?;
                T::Num(s[start..p].to_string())
            }
            _ if is_alnum(c) => {
                p = scan_word(s, p)?;
                match &s[start..p] {
                    "block" => T::Kw(Kw::Block),
                    "break" => T::Kw(Kw::Break),
                    "continue" => T::Kw(Kw::Continue),
                    "define" => T::Kw(Kw::Define),
                    "else" => T::Kw(Kw::Else),
                    "end" => T::Kw(Kw::End),
                    "if" => T::Kw(Kw::If),
                    "range" => T::Kw(Kw::Range),
                    "template" => T::Kw(Kw::Template),
                    "with" => T::Kw(Kw::With),
                    "nil" => T::Nil,
                    "true" => T::Bool(true),
                    "false" => T::Bool(false),
                    w => T::Ident(w.to_string()),
                }
            }
            '(' => {
                paren += 1;
                p += 1;
                T::LParen
            }
            ')' => {
                paren -= 1;
                if paren < 0 {
                    return Err((p, "unexpected right paren".into()));
                }
                p += 1;
                T::RParen
            }
            _ if c.is_ascii() && !c.is_ascii_control() => {
                p += 1;
                T::Char(c)
            }
            _ => return Err((p, format!("unrecognized character in action: {c:?}"))),
        };
        toks.push(Tok {
            t,
            pos: start,
            end: p,
        });
    }
}

/// Consumes an alphanumeric run from `p`, which must end at a terminator.
fn scan_word(s: &str, mut p: usize) -> LexResult<usize> {
    while let Some(c) = s[p..].chars().next() {
        if !is_alnum(c) {
            break;
        }
        p += c.len_utf8();
    }
    if !at_terminator(s, p) {
        let c = s[p..].chars().next().unwrap_or(' ');
        return Err((p, format!("bad character {c:?}")));
    }
    Ok(p)
}

fn scan_quoted(s: &str, p: usize, q: char) -> LexResult<usize> {
    let what = if q == '"' {
        "unterminated quoted string"
    } else {
        "unterminated character constant"
    };
    let mut it = s[p + 1..].char_indices();
    while let Some((i, c)) = it.next() {
        match c {
            '\\' => match it.next() {
                Some((_, n)) if n != '\n' => {}
                _ => return Err((p, what.into())),
            },
            '\n' => return Err((p, what.into())),
            _ if c == q => return Ok(p + 1 + i + 1),
            _ => {}
        }
    }
    Err((p, what.into()))
}

fn scan_number(s: &str, start: usize) -> LexResult<usize> {
    let b = s.as_bytes();
    let mut p = start;
    let accept = |p: &mut usize, set: &str| -> bool {
        if *p < b.len() && set.as_bytes().contains(&b[*p]) {
            *p += 1;
            true
        } else {
            false
        }
    };
    let accept_run = |p: &mut usize, set: &str| {
        while *p < b.len() && set.as_bytes().contains(&b[*p]) {
            *p += 1;
        }
    };
    accept(&mut p, "+-");
    let mut digits = "0123456789_";
    if accept(&mut p, "0") {
        if accept(&mut p, "xX") {
            digits = "0123456789abcdefABCDEF_";
        } else if accept(&mut p, "oO") {
            digits = "01234567_";
        } else if accept(&mut p, "bB") {
            digits = "01_";
        }
    }
    accept_run(&mut p, digits);
    if accept(&mut p, ".") {
        accept_run(&mut p, digits);
    }
    if digits.len() == 11 && accept(&mut p, "eE") {
        accept(&mut p, "+-");
        accept_run(&mut p, "0123456789_");
    }
    if digits.len() == 23 && accept(&mut p, "pP") {
        accept(&mut p, "+-");
        accept_run(&mut p, "0123456789_");
    }
    accept(&mut p, "i");
    match s[p..].chars().next() {
        Some(c) if is_alnum(c) || c == '+' || c == '-' => {
            let end = p + c.len_utf8();
            Err((start, format!("bad number syntax: {:?}", &s[start..end])))
        }
        _ => Ok(p),
    }
}
