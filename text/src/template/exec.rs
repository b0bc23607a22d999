//! The executor (Go: `text/template/exec.go`): values, truth, pipelines,
//! control structures and `range`.
//!
//! # Data model and Go semantics
//!
//! JSON objects are Go `map[string]any`, arrays `[]any`, integers `int`
//! (printed `1000`, never `1000.0`), other numbers `float64` (printed as Go's
//! `%v` does: `1.5`, `1e+06`), `null` a nil interface. As in Go:
//!
//! * a missing key is "no value": falsy, ranging over it runs nothing (or the
//!   `else`), a field of it is again no value, and printing it gives the
//!   literal `<no value>` (Go's own output; templates guard such fields with
//!   `if`, `with` or `default`);
//! * a `null` behaves like a missing key, except that taking a field of it is
//!   an error (Go: "nil pointer evaluating interface {}.X"); passed to a
//!   function, either one is a nil (`fmt` prints `<nil>`);
//! * truth is Go's: `false`, `0`, `0.0`, `""`, empty list or map, nil and no
//!   value are false; everything else is true;
//! * `range` over a map visits keys in sorted order; over an integer `n` it
//!   visits `0..n`.

use super::fmt::{fmt_v, type_name};
use super::parse::{Arg, Cmd, Ctl, Node, Parsed, Pipe, Span};
use super::{MAX_DEPTH, call_func, location};
use serde_json::Value as Json;
use std::rc::Rc;

/// A value during execution: no value (Go's invalid `reflect.Value`), a
/// borrow of the data or of a constant, or a computed value.
#[derive(Clone, Debug)]
pub(super) enum Val<'a> {
    Missing,
    Ref(&'a Json),
    Own(Rc<Json>),
}

impl<'a> Val<'a> {
    pub(super) fn own(j: Json) -> Self {
        Val::Own(Rc::new(j))
    }

    pub(super) fn json(&self) -> Option<&Json> {
        match self {
            Val::Missing => None,
            Val::Ref(j) => Some(j),
            Val::Own(j) => Some(j),
        }
    }

    /// The value unless it is missing or null (Go: a nil interface).
    pub(super) fn non_nil(&self) -> Option<&Json> {
        self.json().filter(|j| !j.is_null())
    }

    /// Go digs a pipeline result out of its `interface{}`: a nil becomes no
    /// value.
    fn dig(self) -> Self {
        if matches!(self.json(), Some(Json::Null)) {
            Val::Missing
        } else {
            self
        }
    }

    fn field(&self, name: &str) -> Result<Val<'a>, String> {
        let get = |j: &Json| -> Result<Option<Json>, String> {
            match j {
                Json::Object(m) => Ok(m.get(name).cloned()),
                Json::Null => Err(format!("nil pointer evaluating interface {{}}.{name}")),
                other => Err(format!(
                    "can't evaluate field {name} in type {}",
                    type_name(Some(other))
                )),
            }
        };
        match *self {
            Val::Missing => Ok(Val::Missing),
            Val::Ref(Json::Object(m)) => Ok(m.get(name).map_or(Val::Missing, Val::Ref)),
            Val::Ref(other) => get(other).map(|o| o.map_or(Val::Missing, Val::own)),
            Val::Own(ref j) => get(j).map(|o| o.map_or(Val::Missing, Val::own)),
        }
    }
}

/// Go's truth: false, 0, "", empty collections, nil and no value are false.
pub(super) fn truth(v: &Val<'_>) -> bool {
    match v.json() {
        None | Some(Json::Null) => false,
        Some(Json::Bool(b)) => *b,
        Some(Json::Number(n)) => n
            .as_i64()
            .map(|i| i != 0)
            .or_else(|| n.as_u64().map(|u| u != 0))
            .unwrap_or_else(|| n.as_f64().is_some_and(|f| f != 0.0)),
        Some(Json::String(s)) => !s.is_empty(),
        Some(Json::Array(a)) => !a.is_empty(),
        Some(Json::Object(m)) => !m.is_empty(),
    }
}

enum Flow {
    Break,
    Continue,
    Fail(Span, String),
}

type X<T> = Result<T, Flow>;

fn fail<T>(span: Span, msg: impl Into<String>) -> X<T> {
    Err(Flow::Fail(span, msg.into()))
}

pub(super) fn run(t: &Parsed, data: &Json) -> Result<String, String> {
    let dot = if data.is_null() {
        Val::Missing
    } else {
        Val::Ref(data)
    };
    let mut ex = Exec {
        t,
        out: String::new(),
        vars: vec![("$", dot.clone())],
        depth: 0,
    };
    match ex.walk_list(&dot, &t.root) {
        Ok(()) => Ok(ex.out),
        Err(Flow::Fail(span, msg)) => {
            let ctx: String = t
                .text
                .get(span.pos..span.end)
                .unwrap_or("")
                .trim()
                .chars()
                .take(80)
                .collect();
            Err(format!(
                "{}: executing at <{ctx}>: {msg}",
                location(&t.text, span.pos)
            ))
        }
        Err(Flow::Break | Flow::Continue) => Err("break or continue outside range".into()),
    }
}

struct Exec<'a> {
    t: &'a Parsed,
    out: String,
    vars: Vec<(&'a str, Val<'a>)>,
    depth: usize,
}

impl<'a> Exec<'a> {
    fn walk_list(&mut self, dot: &Val<'a>, list: &'a [Node]) -> X<()> {
        for n in list {
            self.walk(dot, n)?;
        }
        Ok(())
    }

    fn walk(&mut self, dot: &Val<'a>, node: &'a Node) -> X<()> {
        match node {
            Node::Text(s) => {
                self.out.push_str(s);
                Ok(())
            }
            Node::Action(p) => {
                // Declared variables persist until the enclosing end.
                let v = self.eval_pipeline(dot, p)?;
                if p.decl.is_empty() {
                    match v.json() {
                        None => self.out.push_str("<no value>"),
                        Some(j) => fmt_v(j, &mut self.out),
                    }
                }
                Ok(())
            }
            Node::If(c) => self.walk_if_with(dot, c, false),
            Node::With(c) => self.walk_if_with(dot, c, true),
            Node::Range(c) => self.walk_range(dot, c),
            Node::Template { span, name, pipe } => {
                self.walk_template(dot, *span, name, pipe.as_ref())
            }
            Node::Break => Err(Flow::Break),
            Node::Continue => Err(Flow::Continue),
        }
    }

    /// Counts one level of execution nesting (control bodies and template
    /// calls together), so recursion through templates is bounded too.
    fn nest(&mut self, span: Span) -> X<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return fail(
                span,
                format!("exceeded maximum template depth ({MAX_DEPTH})"),
            );
        }
        Ok(())
    }

    fn walk_if_with(&mut self, dot: &Val<'a>, c: &'a Ctl, with: bool) -> X<()> {
        self.nest(c.pipe.span)?;
        let r = self.walk_if_with_inner(dot, c, with);
        self.depth -= 1;
        r
    }

    fn walk_if_with_inner(&mut self, dot: &Val<'a>, c: &'a Ctl, with: bool) -> X<()> {
        let mark = self.vars.len();
        let val = self.eval_pipeline(dot, &c.pipe)?;
        let r = if truth(&val) {
            if with {
                self.walk_list(&val, &c.list)
            } else {
                self.walk_list(dot, &c.list)
            }
        } else if let Some(e) = &c.else_list {
            self.walk_list(dot, e)
        } else {
            Ok(())
        };
        self.vars.truncate(mark);
        r
    }

    fn walk_range(&mut self, dot: &Val<'a>, c: &'a Ctl) -> X<()> {
        self.nest(c.pipe.span)?;
        let r = self.walk_range_inner(dot, c);
        self.depth -= 1;
        r
    }

    fn walk_range_inner(&mut self, dot: &Val<'a>, c: &'a Ctl) -> X<()> {
        let mark = self.vars.len();
        let val = self.eval_pipeline(dot, &c.pipe)?;
        let inner = self.vars.len();
        let ndecl = c.pipe.decl.len();
        let (ran, items): (bool, Box<dyn Iterator<Item = (Val<'a>, Val<'a>)>>) =
            match range_items(&val, ndecl).map_err(|m| Flow::Fail(c.pipe.span, m))? {
                Items::List(v) => (!v.is_empty(), Box::new(v.into_iter())),
                // Integers are counted lazily: `range 1000000` allocates nothing.
                Items::Count(n) => (
                    n > 0,
                    Box::new((0..n).map(|i| (Val::Missing, Val::own(Json::from(i))))),
                ),
            };
        for (key, elem) in items {
            if ndecl > 0 {
                if c.pipe.is_assign {
                    let first = if ndecl > 1 { key.clone() } else { elem.clone() };
                    self.set_var(&c.pipe.decl[0], first, c.pipe.span)?;
                } else {
                    self.vars[inner - 1].1 = elem.clone();
                }
            }
            if ndecl > 1 {
                if c.pipe.is_assign {
                    self.set_var(&c.pipe.decl[1], elem.clone(), c.pipe.span)?;
                } else {
                    self.vars[inner - 2].1 = key;
                }
            }
            let r = self.walk_list(&elem, &c.list);
            self.vars.truncate(inner);
            match r {
                Ok(()) | Err(Flow::Continue) => {}
                Err(Flow::Break) => break,
                Err(e) => return Err(e),
            }
        }
        let r = match &c.else_list {
            Some(e) if !ran => self.walk_list(dot, e),
            _ => Ok(()),
        };
        self.vars.truncate(mark);
        r
    }

    fn walk_template(
        &mut self,
        dot: &Val<'a>,
        span: Span,
        name: &str,
        pipe: Option<&'a Pipe>,
    ) -> X<()> {
        let Some(list) = self.t.defs.get(name) else {
            return fail(span, format!("template {name:?} not defined"));
        };
        let new_dot = match pipe {
            Some(p) => self.eval_pipeline(dot, p)?,
            None => Val::Missing,
        };
        self.nest(span)?;
        // No dynamic scoping: the called template sees only `$`.
        let saved = std::mem::replace(&mut self.vars, vec![("$", new_dot.clone())]);
        let r = self.walk_list(&new_dot, list);
        self.depth -= 1;
        self.vars = saved;
        r
    }

    fn var_value(&self, name: &str, span: Span) -> X<Val<'a>> {
        match self.vars.iter().rev().find(|(n, _)| *n == name) {
            Some((_, v)) => Ok(v.clone()),
            None => fail(span, format!("undefined variable: {name}")),
        }
    }

    fn set_var(&mut self, name: &str, v: Val<'a>, span: Span) -> X<()> {
        match self.vars.iter_mut().rev().find(|(n, _)| *n == name) {
            Some(slot) => {
                slot.1 = v;
                Ok(())
            }
            None => fail(span, format!("undefined variable: {name}")),
        }
    }

    fn eval_pipeline(&mut self, dot: &Val<'a>, p: &'a Pipe) -> X<Val<'a>> {
        let mut val: Option<Val<'a>> = None;
        for cmd in &p.cmds {
            let v = self.eval_command(dot, cmd, val.take())?;
            val = Some(v.dig());
        }
        let val = val.unwrap_or(Val::Missing);
        for name in &p.decl {
            if p.is_assign {
                self.set_var(name, val.clone(), p.span)?;
            } else {
                self.vars.push((name.as_str(), val.clone()));
            }
        }
        Ok(val)
    }

    fn eval_command(&mut self, dot: &Val<'a>, cmd: &'a Cmd, fin: Option<Val<'a>>) -> X<Val<'a>> {
        let Some(first) = cmd.args.first() else {
            return fail(Span::default(), "empty command");
        };
        let has_args = cmd.args.len() > 1 || fin.is_some();
        match first {
            Arg::Field(idents, sp) => self.field_chain(dot.clone(), idents, *sp, has_args),
            Arg::Chain(node, fields, sp) => {
                let base = self.chain_base(dot, node)?;
                self.field_chain(base, fields, *sp, has_args)
            }
            Arg::Ident(name, _) => self.eval_call(dot, name, cmd.span, &cmd.args[1..], fin),
            Arg::Var(idents, sp) => {
                let v = self.var_value(&idents[0], *sp)?;
                if idents.len() == 1 {
                    if has_args {
                        return self.not_a_function(*sp);
                    }
                    return Ok(v);
                }
                self.field_chain(v, &idents[1..], *sp, has_args)
            }
            Arg::Pipe(p) => {
                if has_args {
                    return self.not_a_function(p.span);
                }
                self.eval_pipeline(dot, p)
            }
            Arg::Dot(sp) | Arg::Lit(_, sp) | Arg::Nil(sp) if has_args => self.not_a_function(*sp),
            Arg::Dot(_) => Ok(dot.clone()),
            Arg::Lit(j, _) => Ok(Val::Ref(j)),
            Arg::Nil(sp) => fail(*sp, "nil is not a command"),
        }
    }

    fn not_a_function<T>(&self, sp: Span) -> X<T> {
        let what = self.t.text.get(sp.pos..sp.end).unwrap_or("");
        fail(sp, format!("can't give argument to non-function {what}"))
    }

    fn chain_base(&mut self, dot: &Val<'a>, node: &'a Arg) -> X<Val<'a>> {
        if let Arg::Nil(sp) = node {
            return fail(*sp, "indirection through explicit nil");
        }
        self.eval_arg(dot, node)
    }

    fn field_chain(
        &mut self,
        recv: Val<'a>,
        idents: &[String],
        sp: Span,
        has_args: bool,
    ) -> X<Val<'a>> {
        let mut r = recv;
        for (i, id) in idents.iter().enumerate() {
            let last = i + 1 == idents.len();
            if last && has_args && matches!(r.json(), Some(Json::Object(_))) {
                return fail(sp, format!("{id} is not a method but has arguments"));
            }
            r = r.field(id).map_err(|m| Flow::Fail(sp, m))?;
        }
        Ok(r)
    }

    /// Evaluates an argument (Go's `evalArg`: no digging out of interfaces).
    fn eval_arg(&mut self, dot: &Val<'a>, arg: &'a Arg) -> X<Val<'a>> {
        match arg {
            Arg::Dot(_) => Ok(dot.clone()),
            Arg::Nil(_) => Ok(Val::Missing),
            Arg::Lit(j, _) => Ok(Val::Ref(j)),
            Arg::Field(idents, sp) => self.field_chain(dot.clone(), idents, *sp, false),
            Arg::Var(idents, sp) => {
                let v = self.var_value(&idents[0], *sp)?;
                self.field_chain(v, &idents[1..], *sp, false)
            }
            Arg::Pipe(p) => self.eval_pipeline(dot, p),
            Arg::Ident(name, sp) => self.eval_call(dot, name, *sp, &[], None),
            Arg::Chain(node, fields, sp) => {
                let base = self.chain_base(dot, node)?;
                self.field_chain(base, fields, *sp, false)
            }
        }
    }

    fn eval_call(
        &mut self,
        dot: &Val<'a>,
        name: &str,
        sp: Span,
        args: &'a [Arg],
        fin: Option<Val<'a>>,
    ) -> X<Val<'a>> {
        let n = args.len() + usize::from(fin.is_some());
        if name == "and" || name == "or" {
            if n == 0 {
                return fail(
                    sp,
                    format!("wrong number of args for {name}: want at least 1 got 0"),
                );
            }
            // Short-circuit: the deciding value is returned as is.
            let is_or = name == "or";
            let mut v = Val::Missing;
            for a in args {
                v = self.eval_arg(dot, a)?;
                if truth(&v) == is_or {
                    return Ok(v);
                }
            }
            return Ok(fin.unwrap_or(v));
        }
        let mut vals = Vec::with_capacity(n);
        for a in args {
            vals.push(self.eval_arg(dot, a)?);
        }
        vals.extend(fin);
        call_func(name, &vals).map_err(|m| Flow::Fail(sp, m))
    }
}

/// What a `range` visits: (key, element) pairs, or the integers `0..n`.
enum Items<'a> {
    List(Vec<(Val<'a>, Val<'a>)>),
    Count(i64),
}

fn range_items<'a>(val: &Val<'a>, ndecl: usize) -> Result<Items<'a>, String> {
    let idx = |i: usize| Val::own(Json::from(i));
    Ok(Items::List(match *val {
        Val::Missing => Vec::new(),
        Val::Ref(Json::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, e)| (idx(i), Val::Ref(e)))
            .collect(),
        Val::Ref(Json::Object(m)) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            keys.into_iter()
                .filter_map(|k| {
                    m.get(k)
                        .map(|v| (Val::own(Json::String(k.clone())), Val::Ref(v)))
                })
                .collect()
        }
        Val::Own(ref j) => match &**j {
            Json::Array(a) => a
                .iter()
                .enumerate()
                .map(|(i, e)| (idx(i), Val::own(e.clone())))
                .collect(),
            Json::Object(m) => {
                let mut pairs: Vec<(&String, &Json)> = m.iter().collect();
                pairs.sort_by(|a, b| a.0.cmp(b.0));
                pairs
                    .into_iter()
                    .map(|(k, v)| (Val::own(Json::String(k.clone())), Val::own(v.clone())))
                    .collect()
            }
            other => return range_number(other, ndecl),
        },
        Val::Ref(other) => return range_number(other, ndecl),
    }))
}

fn range_number<'a>(j: &Json, ndecl: usize) -> Result<Items<'a>, String> {
    let mut s = String::new();
    fmt_v(j, &mut s);
    match j {
        Json::Null => Ok(Items::List(Vec::new())),
        Json::Number(n) if n.as_i64().is_some() || n.as_u64().is_some() => {
            if ndecl > 1 {
                return Err(format!(
                    "can't use {s} to iterate over more than one variable"
                ));
            }
            Ok(Items::Count(n.as_i64().unwrap_or(i64::MAX)))
        }
        _ => Err(format!("range can't iterate over {s}")),
    }
}
