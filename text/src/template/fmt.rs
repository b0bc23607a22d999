//! Printing values the way Go's `fmt` and `strconv` do: `%v` (what an
//! action prints), `Sprint`, `Sprintf` with the verbs templates use,
//! `Quote` and `FormatFloat`.

use super::exec::Val;
use serde_json::Value as Json;
use std::fmt::Write as _;

/// The Go type a JSON value stands for (`<nil>` for nil).
pub(super) fn type_name(j: Option<&Json>) -> &'static str {
    match j {
        None | Some(Json::Null) => "<nil>",
        Some(Json::Bool(_)) => "bool",
        Some(Json::Number(n)) if n.as_i64().is_some() => "int",
        Some(Json::Number(n)) if n.as_u64().is_some() => "uint64",
        Some(Json::Number(_)) => "float64",
        Some(Json::String(_)) => "string",
        Some(Json::Array(_)) => "[]interface {}",
        Some(Json::Object(_)) => "map[string]interface {}",
    }
}

fn sorted_entries(m: &serde_json::Map<String, Json>) -> Vec<(&String, &Json)> {
    let mut v: Vec<(&String, &Json)> = m.iter().collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    v
}

/// `%v` of a value.
pub(super) fn fmt_v(j: &Json, out: &mut String) {
    match j {
        Json::Null => out.push_str("<nil>"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else {
                out.push_str(&go_float(n.as_f64().unwrap_or(0.0), 'g', None));
            }
        }
        Json::String(s) => out.push_str(s),
        Json::Array(a) => {
            out.push('[');
            for (i, e) in a.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                fmt_v(e, out);
            }
            out.push(']');
        }
        Json::Object(m) => {
            out.push_str("map[");
            for (i, (k, v)) in sorted_entries(m).into_iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(k);
                out.push(':');
                fmt_v(v, out);
            }
            out.push(']');
        }
    }
}

/// `%v` of a function argument (nil and no value print `<nil>`).
pub(super) fn fmt_arg_v(v: &Val<'_>, out: &mut String) {
    match v.non_nil() {
        None => out.push_str("<nil>"),
        Some(j) => fmt_v(j, out),
    }
}

/// `fmt.Sprint`: spaces between operands when neither is a string.
pub(super) fn sprint(args: &[Val<'_>]) -> String {
    let mut out = String::new();
    let mut prev_string = false;
    for (i, a) in args.iter().enumerate() {
        let is_string = matches!(a.non_nil(), Some(Json::String(_)));
        if i > 0 && !is_string && !prev_string {
            out.push(' ');
        }
        fmt_arg_v(a, &mut out);
        prev_string = is_string;
    }
    out
}

/// Go's `unicode.IsPrint`, approximated: every assigned graphic character
/// and the ASCII space. Controls, other spaces, format characters, private
/// use and non-characters are not printable.
pub(super) fn is_go_print(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    let u = u32::from(c);
    let format = matches!(u,
        0xAD | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x890..=0x891 | 0x8E2 | 0x180E
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F
        | 0xFEFF | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F
        | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F);
    let private = matches!(u, 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD);
    let nonchar = (0xFDD0..=0xFDEF).contains(&u) || (u & 0xFFFE) == 0xFFFE;
    !(format || private || nonchar)
}

/// Go's `strconv.Quote` (or `QuoteRune` with `'`).
fn go_quote(s: &str, q: char) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            _ if c == q || c == '\\' => {
                out.push('\\');
                out.push(c);
            }
            _ if is_go_print(c) => out.push(c),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            _ => {
                let u = u32::from(c);
                if u < 0x20 || u == 0x7F {
                    let _ = write!(out, "\\x{u:02x}");
                } else if u < 0x10000 {
                    let _ = write!(out, "\\u{u:04x}");
                } else {
                    let _ = write!(out, "\\U{u:08x}");
                }
            }
        }
    }
    out.push(q);
    out
}

#[derive(Default, Clone, Copy)]
struct Spec {
    minus: bool,
    plus: bool,
    sharp: bool,
    zero: bool,
    space: bool,
    width: Option<usize>,
    prec: Option<usize>,
}

fn parse_num(b: &[u8], i: &mut usize) -> Option<usize> {
    let start = *i;
    let mut n: usize = 0;
    while *i < b.len() && b[*i].is_ascii_digit() {
        n = n
            .saturating_mul(10)
            .saturating_add(usize::from(b[*i] - b'0'));
        *i += 1;
    }
    (*i > start).then_some(n.min(1 << 20))
}

/// Go's `fmt.Sprintf` for the verbs templates use: `%v %s %q %d %t %x %X %o
/// %O %b %c %U %e %E %f %F %g %G %T %%`, flags `+ - # 0` and space, width and
/// precision (also `*`). Mismatches print Go's `%!verb(type=value)` forms.
pub(super) fn sprintf(format: &str, args: &[Val<'_>]) -> String {
    let b = format.as_bytes();
    let mut out = String::new();
    let mut argn = 0;
    let mut i = 0;
    let star = |argn: &mut usize| -> Option<i64> {
        let v = args
            .get(*argn)
            .and_then(|a| a.non_nil())
            .and_then(Json::as_i64);
        *argn += 1;
        v
    };
    while i < b.len() {
        let start = i;
        while i < b.len() && b[i] != b'%' {
            i += 1;
        }
        out.push_str(&format[start..i]);
        if i >= b.len() {
            break;
        }
        i += 1;
        let mut sp = Spec::default();
        while i < b.len() {
            match b[i] {
                b'#' => sp.sharp = true,
                b'0' => sp.zero = !sp.minus,
                b'+' => sp.plus = true,
                b'-' => {
                    sp.minus = true;
                    sp.zero = false;
                }
                b' ' => sp.space = true,
                _ => break,
            }
            i += 1;
        }
        if i < b.len() && b[i] == b'*' {
            i += 1;
            match star(&mut argn) {
                Some(w) => {
                    if w < 0 {
                        sp.minus = true;
                        sp.zero = false;
                    }
                    sp.width = usize::try_from(w.unsigned_abs())
                        .ok()
                        .map(|w| w.min(1 << 20));
                }
                None => out.push_str("%!(BADWIDTH)"),
            }
        } else {
            sp.width = parse_num(b, &mut i);
        }
        if i < b.len() && b[i] == b'.' {
            i += 1;
            if i < b.len() && b[i] == b'*' {
                i += 1;
                match star(&mut argn).and_then(|p| usize::try_from(p).ok()) {
                    Some(p) => sp.prec = Some(p.min(1 << 20)),
                    None => out.push_str("%!(BADPREC)"),
                }
            } else {
                sp.prec = Some(parse_num(b, &mut i).unwrap_or(0));
            }
        }
        let Some(verb) = format[i..].chars().next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        i += verb.len_utf8();
        if verb == '%' {
            out.push('%');
            continue;
        }
        match args.get(argn) {
            None => {
                let _ = write!(out, "%!{verb}(MISSING)");
            }
            Some(a) => {
                fmt_arg(&mut out, a.non_nil(), verb, &sp);
                argn += 1;
            }
        }
    }
    if argn < args.len() {
        out.push_str("%!(EXTRA ");
        for (k, a) in args[argn..].iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            match a.non_nil() {
                None => out.push_str("<nil>"),
                Some(j) => {
                    out.push_str(type_name(Some(j)));
                    out.push('=');
                    fmt_v(j, &mut out);
                }
            }
        }
        out.push(')');
    }
    out
}

fn pad(out: &mut String, s: &str, sp: &Spec) {
    let n = s.chars().count();
    let fill = sp.width.unwrap_or(0).saturating_sub(n);
    if sp.minus {
        out.push_str(s);
        out.extend(std::iter::repeat_n(' ', fill));
    } else {
        let c = if sp.zero { '0' } else { ' ' };
        out.extend(std::iter::repeat_n(c, fill));
        out.push_str(s);
    }
}

fn bad_verb(out: &mut String, j: Option<&Json>, verb: char) {
    let _ = write!(out, "%!{verb}(");
    match j {
        None => out.push_str("<nil>"),
        Some(j) => {
            out.push_str(type_name(Some(j)));
            out.push('=');
            fmt_v(j, out);
        }
    }
    out.push(')');
}

fn fmt_arg(out: &mut String, j: Option<&Json>, verb: char, sp: &Spec) {
    let Some(j) = j else {
        match verb {
            'v' | 'T' => pad(out, "<nil>", sp),
            _ => bad_verb(out, None, verb),
        }
        return;
    };
    if verb == 'T' {
        pad(out, type_name(Some(j)), sp);
        return;
    }
    match j {
        Json::Null => pad(out, "<nil>", sp),
        Json::Bool(v) => match verb {
            't' | 'v' => pad(out, if *v { "true" } else { "false" }, sp),
            _ => bad_verb(out, Some(j), verb),
        },
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                fmt_integer(out, i128::from(i), verb, sp, j);
            } else if let Some(u) = n.as_u64() {
                fmt_integer(out, i128::from(u), verb, sp, j);
            } else {
                fmt_float(out, n.as_f64().unwrap_or(0.0), verb, sp, j);
            }
        }
        Json::String(s) => match verb {
            'v' | 's' => {
                let t: String = match sp.prec {
                    Some(p) => s.chars().take(p).collect(),
                    None => s.clone(),
                };
                pad(out, &t, sp);
            }
            'q' => pad(out, &go_quote(s, '"'), sp),
            'x' | 'X' => {
                let mut h = String::new();
                for byte in s.bytes() {
                    if verb == 'x' {
                        let _ = write!(h, "{byte:02x}");
                    } else {
                        let _ = write!(h, "{byte:02X}");
                    }
                }
                pad(out, &h, sp);
            }
            _ => bad_verb(out, Some(j), verb),
        },
        Json::Array(a) => {
            out.push('[');
            for (k, e) in a.iter().enumerate() {
                if k > 0 {
                    out.push(' ');
                }
                fmt_arg(out, Some(e), verb, sp);
            }
            out.push(']');
        }
        Json::Object(m) => {
            out.push_str("map[");
            for (k, (key, v)) in sorted_entries(m).into_iter().enumerate() {
                if k > 0 {
                    out.push(' ');
                }
                fmt_arg(out, Some(&Json::String(key.clone())), verb, sp);
                out.push(':');
                fmt_arg(out, Some(v), verb, sp);
            }
            out.push(']');
        }
    }
}

fn fmt_integer(out: &mut String, v: i128, verb: char, sp: &Spec, j: &Json) {
    let (base, upper) = match verb {
        'v' | 'd' => (10, false),
        'b' => (2, false),
        'o' | 'O' => (8, false),
        'x' => (16, false),
        'X' => (16, true),
        'c' => {
            let c = u32::try_from(v)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or('\u{FFFD}');
            pad(out, c.encode_utf8(&mut [0u8; 4]), sp);
            return;
        }
        'q' => {
            let c = u32::try_from(v)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or('\u{FFFD}');
            pad(out, &go_quote(c.encode_utf8(&mut [0u8; 4]), '\''), sp);
            return;
        }
        'U' => {
            pad(out, &format!("U+{v:04X}"), sp);
            return;
        }
        _ => {
            bad_verb(out, Some(j), verb);
            return;
        }
    };
    let neg = v < 0;
    let abs = v.unsigned_abs();
    let mut digits = match (base, upper) {
        (2, _) => format!("{abs:b}"),
        (8, _) => format!("{abs:o}"),
        (16, false) => format!("{abs:x}"),
        (16, true) => format!("{abs:X}"),
        _ => format!("{abs}"),
    };
    let mut prec = sp.prec;
    if prec == Some(0) && v == 0 {
        digits.clear();
    }
    if prec.is_none()
        && sp.zero
        && !sp.minus
        && let Some(w) = sp.width
    {
        let signed = neg || sp.plus || sp.space;
        prec = Some(w.saturating_sub(usize::from(signed)));
    }
    let mut s = String::new();
    if neg {
        s.push('-');
    } else if sp.plus {
        s.push('+');
    } else if sp.space {
        s.push(' ');
    }
    if verb == 'O' {
        s.push_str("0o");
    } else if sp.sharp {
        match base {
            2 => s.push_str("0b"),
            8 if !digits.starts_with('0') => s.push('0'),
            16 => s.push_str(if upper { "0X" } else { "0x" }),
            _ => {}
        }
    }
    if let Some(p) = prec {
        s.extend(std::iter::repeat_n('0', p.saturating_sub(digits.len())));
    }
    s.push_str(&digits);
    let no_zero = Spec { zero: false, ..*sp };
    pad(out, &s, &no_zero);
}

fn fmt_float(out: &mut String, f: f64, verb: char, sp: &Spec, j: &Json) {
    let body = match verb {
        'v' => go_float(f, 'g', sp.prec),
        'g' | 'G' => go_float(f, verb, sp.prec),
        'e' | 'E' => go_float(f, verb, Some(sp.prec.unwrap_or(6))),
        'f' | 'F' => go_float(f, 'f', Some(sp.prec.unwrap_or(6))),
        _ => {
            bad_verb(out, Some(j), verb);
            return;
        }
    };
    let (sign, digits) = match body.strip_prefix('-') {
        Some(d) => ("-", d.to_string()),
        None if sp.plus => ("+", body),
        None if sp.space => (" ", body),
        None => ("", body),
    };
    if sp.zero
        && !sp.minus
        && let Some(w) = sp.width
    {
        let fill = w.saturating_sub(sign.len() + digits.chars().count());
        out.push_str(sign);
        out.extend(std::iter::repeat_n('0', fill));
        out.push_str(&digits);
        return;
    }
    pad(out, &format!("{sign}{digits}"), sp);
}

/// Decimal digits of a non-negative float: `0.d1d2… × 10^dp`.
struct Decimal {
    digits: Vec<u8>,
    dp: i32,
}

impl Decimal {
    /// From Rust's `{:e}` rendering (shortest when `sig` is `None`, else
    /// rounded to `sig` significant digits), trailing zeros trimmed.
    fn new(a: f64, sig: Option<usize>) -> Decimal {
        let s = match sig {
            None => format!("{a:e}"),
            Some(n) => format!("{a:.*e}", n.saturating_sub(1)),
        };
        let (mant, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let mut digits: Vec<u8> = mant.bytes().filter(u8::is_ascii_digit).collect();
        while digits.last() == Some(&b'0') {
            digits.pop();
        }
        let dp = if digits.is_empty() { 0 } else { exp + 1 };
        Decimal { digits, dp }
    }

    fn nd(&self) -> i32 {
        i32::try_from(self.digits.len()).unwrap_or(i32::MAX)
    }

    fn digit(&self, i: i32) -> char {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.digits.get(i))
            .map_or('0', |d| char::from(*d))
    }

    fn fmt_e(&self, prec: i32, e: char) -> String {
        let mut s = String::new();
        s.push(self.digit(0));
        if prec > 0 {
            s.push('.');
            for i in 1..=prec {
                s.push(self.digit(i));
            }
        }
        s.push(e);
        let exp = if self.digits.is_empty() {
            0
        } else {
            self.dp - 1
        };
        let _ = write!(s, "{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
        s
    }

    fn fmt_f(&self, prec: i32) -> String {
        let mut s = String::new();
        if self.dp > 0 {
            for i in 0..self.dp {
                s.push(self.digit(i));
            }
        } else {
            s.push('0');
        }
        if prec > 0 {
            s.push('.');
            for i in 0..prec {
                s.push(self.digit(self.dp + i));
            }
        }
        s
    }
}

/// Go's `strconv.FormatFloat(f, fmt, prec, 64)` for `e E f g G`; `prec`
/// `None` is the shortest representation (`-1`).
fn go_float(f: f64, fmt: char, prec: Option<usize>) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    let a = f.abs();
    let p = prec.map(|p| i32::try_from(p).unwrap_or(i32::MAX));
    let body = match fmt {
        'f' => format!("{a:.*}", prec.unwrap_or(6)),
        'e' | 'E' => {
            let d = Decimal::new(a, prec.map(|p| p + 1));
            let pr = p.unwrap_or(d.nd() - 1).max(0);
            d.fmt_e(pr, fmt)
        }
        _ => {
            let shortest = prec.is_none();
            let sig = prec.map(|p| p.max(1));
            let d = Decimal::new(a, sig);
            let mut prec = sig.map_or(d.nd(), |s| i32::try_from(s).unwrap_or(i32::MAX));
            let mut eprec = prec;
            if eprec > d.nd() && d.nd() >= d.dp {
                eprec = d.nd();
            }
            if shortest {
                eprec = 6;
            }
            let exp = d.dp - 1;
            let e = if fmt == 'G' { 'E' } else { 'e' };
            if exp < -4 || exp >= eprec {
                if prec > d.nd() {
                    prec = d.nd();
                }
                d.fmt_e((prec - 1).max(0), e)
            } else {
                if prec > d.dp {
                    prec = d.nd();
                }
                d.fmt_f((prec - d.dp).max(0))
            }
        }
    };
    format!("{sign}{body}")
}
