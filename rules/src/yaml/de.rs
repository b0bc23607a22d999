//! A serde `Deserializer` over the spanned node tree.
//!
//! Why not a YAML serde crate directly: charly needs three things none of them
//! give together. (1) Every error points at the exact node, even errors serde's
//! derive raises ("missing field", "invalid type"): the innermost node that
//! sees an error without a position stamps its own on it. (2) A key that no
//! schema knows is a *warning* with file:line:col and the nearest known field
//! (the field list comes from serde's `deserialize_struct`), and the key is
//! skipped, so files written for newer charly versions still load.
//! (3) Scalars are typed against the schema, strictly: a `String` field gets
//! the text as written (`0755`, `NO`), a `bool` field accepts only true/false.
//!
//! [`Spanned<T>`] attaches the position to any value; [`Yaml`] captures a
//! subtree as-is (with spans) for fields the engine keeps but does not type.

use super::node::{Node, Style, Value, is_null_text, parse_float, parse_int};
use crate::diag::{Diagnostic, nearest};
use crate::source::{FileId, Span};
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};
use std::cell::RefCell;
use std::fmt;

/// A deserialization error with the place it happened.
#[derive(Debug, Clone)]
pub struct DeError {
    /// What went wrong.
    pub message: String,
    /// Where, once known.
    pub span: Option<Span>,
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError {
            message: msg.to_string(),
            // A nested decode (see [`nested`]) leaves its exact position here.
            span: PENDING_SPAN.with(std::cell::Cell::take),
        }
    }
}

impl DeError {
    fn at(mut self, span: Span) -> Self {
        if self.span.is_none() {
            self.span = Some(span);
        }
        self
    }

    /// Converts to a diagnostic.
    pub fn into_diagnostic(self) -> Diagnostic {
        Diagnostic::error(self.span, self.message)
    }
}

thread_local! {
    /// Warnings of the decode running on this thread.
    static SINK: RefCell<Vec<Diagnostic>> = const { RefCell::new(Vec::new()) };
    /// Position of an error raised by a nested decode, picked up by `custom`.
    static PENDING_SPAN: std::cell::Cell<Option<Span>> = const { std::cell::Cell::new(None) };
}

/// Deserializes a node, collecting warnings (unknown fields) into `warnings`.
pub fn from_node<T: DeserializeOwned>(
    node: &Node,
    warnings: &mut Vec<Diagnostic>,
) -> Result<T, Diagnostic> {
    let outer = SINK.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let result =
        T::deserialize(NodeDe { node }).map_err(|e: DeError| e.at(node.span).into_diagnostic());
    let mine = SINK.with(|s| std::mem::replace(&mut *s.borrow_mut(), outer));
    warnings.extend(mine);
    PENDING_SPAN.with(|p| p.set(None));
    result
}

/// Decodes a captured subtree from inside a `Deserialize` impl (for shapes
/// that are "a scalar or a mapping"). Warnings go to the running decode and
/// an error keeps its exact position.
pub fn nested<T: DeserializeOwned, E: de::Error>(node: &Node) -> Result<T, E> {
    T::deserialize(NodeDe { node }).map_err(|e: DeError| {
        let e = e.at(node.span);
        PENDING_SPAN.with(|p| p.set(e.span));
        E::custom(e.message)
    })
}

/// A value together with the place it was written.
#[derive(Clone, Debug, Default)]
pub struct Spanned<T> {
    /// Where the value is.
    pub span: Span,
    /// The value.
    pub value: T,
}

impl<T> Spanned<T> {
    /// Wraps a value with a span.
    pub fn new(span: Span, value: T) -> Self {
        Self { span, value }
    }
}

impl<T: PartialEq> PartialEq for Spanned<T> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}
impl<T: Eq> Eq for Spanned<T> {}
impl<T: PartialOrd> PartialOrd for Spanned<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.value.partial_cmp(&other.value)
    }
}
impl<T: Ord> Ord for Spanned<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.value.cmp(&other.value)
    }
}
impl<T: std::hash::Hash> std::hash::Hash for Spanned<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value.hash(state);
    }
}
impl<T> std::ops::Deref for Spanned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: serde::Serialize> serde::Serialize for Spanned<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(s)
    }
}

const SPANNED_NAME: &str = "$charly::Spanned";
const SPANNED_SPAN: &str = "$span";
const SPANNED_VALUE: &str = "$value";
const YAML_NAME: &str = "$charly::Yaml";

impl<'de, T: de::Deserialize<'de>> de::Deserialize<'de> for Spanned<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: de::Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Spanned<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a value with a position")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut span = None;
                let mut value = None;
                while let Some(k) = map.next_key::<String>()? {
                    if k == SPANNED_SPAN {
                        let (file, offset, len, line, col): (u32, u32, u32, u32, u32) =
                            map.next_value()?;
                        span = Some(Span {
                            file: FileId(file),
                            offset,
                            len,
                            line,
                            col,
                        });
                    } else {
                        value = Some(map.next_value()?);
                    }
                }
                Ok(Spanned {
                    span: span.unwrap_or_default(),
                    value: value.ok_or_else(|| de::Error::custom("Spanned needs a value"))?,
                })
            }
        }
        d.deserialize_struct(
            SPANNED_NAME,
            &[SPANNED_SPAN, SPANNED_VALUE],
            V(std::marker::PhantomData),
        )
    }
}

/// A YAML subtree kept as written (with positions), for fields charly keeps
/// but does not interpret, and for fields whose shape varies.
#[derive(Clone, Debug, PartialEq)]
pub struct Yaml(pub Node);

impl Yaml {
    /// The JSON form (see [`Node::to_json`]).
    pub fn to_json(&self) -> serde_json::Value {
        self.0.to_json()
    }
}

thread_local! {
    static STASH: RefCell<Option<Node>> = const { RefCell::new(None) };
}

impl<'de> de::Deserialize<'de> for Yaml {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Yaml;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Yaml, E> {
                STASH
                    .with(|s| s.borrow_mut().take())
                    .map(Yaml)
                    .ok_or_else(|| E::custom("Yaml can only be read from a charly YAML node"))
            }
        }
        d.deserialize_struct(YAML_NAME, &[], V)
    }
}

impl serde::Serialize for Yaml {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

/// A map that keeps document order and the position of each key.
#[derive(Clone, Debug, PartialEq)]
pub struct OrderedMap<V>(pub Vec<(Spanned<String>, V)>);

impl<V> Default for OrderedMap<V> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<V> OrderedMap<V> {
    /// Value under a key.
    pub fn get(&self, key: &str) -> Option<&V> {
        self.0.iter().find(|(k, _)| k.value == key).map(|(_, v)| v)
    }
    /// Entries in document order.
    pub fn iter(&self) -> impl Iterator<Item = (&Spanned<String>, &V)> {
        self.0.iter().map(|(k, v)| (k, v))
    }
    /// Keys in document order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.value.as_str())
    }
    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl<'de, V: de::Deserialize<'de>> de::Deserialize<'de> for OrderedMap<V> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Vis<V>(std::marker::PhantomData<V>);
        impl<'de, V: de::Deserialize<'de>> Visitor<'de> for Vis<V> {
            type Value = OrderedMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<Spanned<String>>()? {
                    let v = map.next_value()?;
                    out.push((k, v));
                }
                Ok(OrderedMap(out))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(OrderedMap(Vec::new()))
            }
        }
        d.deserialize_map(Vis(std::marker::PhantomData))
    }
}

impl<V: serde::Serialize> serde::Serialize for OrderedMap<V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(&k.value, v)?;
        }
        m.end()
    }
}

/// One value or a list of them (`build: rpm` and `build: [rpm, aur]`).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct OneOrMany<T>(pub Vec<T>);

impl<'de, T: DeserializeOwned> de::Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let y = Yaml::deserialize(d)?;
        match &y.0.value {
            Value::Seq(_) => nested::<Vec<T>, D::Error>(&y.0).map(OneOrMany),
            _ if y.0.is_null() => Ok(OneOrMany(Vec::new())),
            _ => nested::<T, D::Error>(&y.0).map(|v| OneOrMany(vec![v])),
        }
    }
}

impl<T: serde::Serialize> serde::Serialize for OneOrMany<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

#[derive(Clone, Copy)]
struct NodeDe<'a> {
    node: &'a Node,
}

impl<'a> NodeDe<'a> {
    fn child(&self, node: &'a Node) -> NodeDe<'a> {
        NodeDe { node }
    }

    fn err(&self, msg: impl Into<String>) -> DeError {
        DeError {
            message: msg.into(),
            span: Some(self.node.span),
        }
    }

    fn expected(&self, what: &str) -> DeError {
        self.err(format!("expected {what}, found {}", self.describe()))
    }

    fn describe(&self) -> String {
        match &self.node.value {
            Value::Scalar(s, _) if self.node.is_null() => {
                if s.is_empty() {
                    "nothing".into()
                } else {
                    format!("`{s}` (null)")
                }
            }
            Value::Scalar(s, _) => {
                let short: String = s.chars().take(40).collect();
                format!("`{short}`")
            }
            Value::Seq(_) => "a list".into(),
            Value::Map(_) => "a mapping".into(),
        }
    }

    fn scalar(&self) -> Option<(&'a str, Style)> {
        match &self.node.value {
            Value::Scalar(s, st) => Some((s.as_str(), *st)),
            _ => None,
        }
    }

    fn int<T: TryFrom<i64>>(&self, what: &str) -> Result<T, DeError> {
        let (s, _) = self.scalar().ok_or_else(|| self.expected(what))?;
        let t = s.trim();
        let n = parse_int(t)
            .or_else(|| {
                t.strip_prefix("0o")
                    .and_then(|o| i64::from_str_radix(o, 8).ok())
            })
            .ok_or_else(|| self.expected(what))?;
        T::try_from(n).map_err(|_| self.err(format!("{n} is out of range for {what}")))
    }

    fn float(&self) -> Result<f64, DeError> {
        let (s, _) = self.scalar().ok_or_else(|| self.expected("a number"))?;
        parse_int(s)
            .map(|i| i as f64)
            .or_else(|| parse_float(s))
            .ok_or_else(|| self.expected("a number"))
    }
}

macro_rules! de_int {
    ($($method:ident $visit:ident $t:ty, $what:literal;)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
                let v: $t = self.int($what)?;
                visitor.$visit(v).map_err(|e: DeError| e.at(self.node.span))
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for NodeDe<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let span = self.node.span;
        let r = match &self.node.value {
            Value::Scalar(s, Style::Plain) => {
                if is_null_text(s) {
                    visitor.visit_unit()
                } else if matches!(s.as_str(), "true" | "True" | "TRUE") {
                    visitor.visit_bool(true)
                } else if matches!(s.as_str(), "false" | "False" | "FALSE") {
                    visitor.visit_bool(false)
                } else if let Some(i) = parse_int(s) {
                    visitor.visit_i64(i)
                } else if let Some(f) = parse_float(s) {
                    visitor.visit_f64(f)
                } else {
                    visitor.visit_str(s)
                }
            }
            Value::Scalar(s, _) => visitor.visit_str(s),
            Value::Seq(items) => visitor.visit_seq(SeqAcc {
                de: self,
                items: items.iter(),
            }),
            Value::Map(entries) => visitor.visit_map(MapAcc {
                de: self,
                entries: entries.iter(),
                value: None,
                fields: None,
                struct_name: "",
            }),
        };
        r.map_err(|e: DeError| e.at(span))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let b = match self.scalar() {
            Some(("true" | "True" | "TRUE", _)) => true,
            Some(("false" | "False" | "FALSE", _)) => false,
            _ => {
                return Err(self.expected("true or false").at(self.node.span));
            }
        };
        visitor
            .visit_bool(b)
            .map_err(|e: DeError| e.at(self.node.span))
    }

    de_int! {
        deserialize_i8 visit_i8 i8, "a small integer";
        deserialize_i16 visit_i16 i16, "an integer";
        deserialize_i32 visit_i32 i32, "an integer";
        deserialize_i64 visit_i64 i64, "an integer";
        deserialize_u8 visit_u8 u8, "a small non-negative integer";
        deserialize_u16 visit_u16 u16, "a non-negative integer (0-65535)";
        deserialize_u32 visit_u32 u32, "a non-negative integer";
        deserialize_u64 visit_u64 u64, "a non-negative integer";
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let f = self.float()?;
        visitor
            .visit_f32(f as f32)
            .map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let f = self.float()?;
        visitor
            .visit_f64(f)
            .map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.scalar() {
            Some((s, Style::Plain)) if is_null_text(s) => visitor.visit_str(""),
            Some((s, _)) => visitor.visit_str(s),
            None => Err(self.expected("text")),
        }
        .map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        if self.node.is_null() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
        .map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor
            .visit_unit()
            .map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor
            .visit_newtype_struct(self)
            .map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            Value::Seq(items) => visitor.visit_seq(SeqAcc {
                de: self,
                items: items.iter(),
            }),
            _ if self.node.is_null() => visitor.visit_seq(SeqAcc {
                de: self,
                items: [].iter(),
            }),
            _ => Err(self.expected("a list")),
        }
        .map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            Value::Map(entries) => visitor.visit_map(MapAcc {
                de: self,
                entries: entries.iter(),
                value: None,
                fields: None,
                struct_name: "",
            }),
            _ if self.node.is_null() => visitor.visit_map(MapAcc {
                de: self,
                entries: [].iter(),
                value: None,
                fields: None,
                struct_name: "",
            }),
            _ => Err(self.expected("a mapping")),
        }
        .map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if name == SPANNED_NAME {
            return visitor
                .visit_map(SpannedAcc { de: self, state: 0 })
                .map_err(|e: DeError| e.at(self.node.span));
        }
        if name == YAML_NAME {
            STASH.with(|s| *s.borrow_mut() = Some(self.node.clone()));
            let r = visitor.visit_unit();
            STASH.with(|s| s.borrow_mut().take());
            return r.map_err(|e: DeError| e.at(self.node.span));
        }
        match &self.node.value {
            Value::Map(entries) => visitor.visit_map(MapAcc {
                de: self,
                entries: entries.iter(),
                value: None,
                fields: Some(fields),
                struct_name: name,
            }),
            _ if self.node.is_null() => visitor.visit_map(MapAcc {
                de: self,
                entries: [].iter(),
                value: None,
                fields: Some(fields),
                struct_name: name,
            }),
            _ => Err(self.expected(&format!("a mapping ({name})"))),
        }
        .map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match &self.node.value {
            Value::Scalar(s, _) => {
                if !variants.contains(&s.as_str()) {
                    let mut msg = format!(
                        "unknown {name} `{s}`; expected one of: {}",
                        variants.join(", ")
                    );
                    if let Some(n) = nearest(s, variants.iter().copied()) {
                        msg.push_str(&format!(" (did you mean `{n}`?)"));
                    }
                    return Err(self.err(msg));
                }
                let d: de::value::StrDeserializer<'_, DeError> = s.as_str().into_deserializer();
                visitor.visit_enum(d)
            }
            Value::Map(entries) if entries.len() == 1 => visitor.visit_enum(EnumAcc {
                de: self,
                key: &entries[0].0,
                value: &entries[0].1,
            }),
            _ => Err(self.expected(&format!("a {name}"))),
        }
        .map_err(|e: DeError| e.at(self.node.span))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
}

struct SeqAcc<'a> {
    de: NodeDe<'a>,
    items: std::slice::Iter<'a, Node>,
}

impl<'de> de::SeqAccess<'de> for SeqAcc<'_> {
    type Error = DeError;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.items.next() {
            Some(n) => seed
                .deserialize(self.de.child(n))
                .map(Some)
                .map_err(|e: DeError| e.at(n.span)),
            None => Ok(None),
        }
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}

struct MapAcc<'a> {
    de: NodeDe<'a>,
    entries: std::slice::Iter<'a, (Node, Node)>,
    value: Option<&'a Node>,
    fields: Option<&'static [&'static str]>,
    struct_name: &'static str,
}

impl<'de> de::MapAccess<'de> for MapAcc<'_> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        for (k, v) in self.entries.by_ref() {
            if let Some(fields) = self.fields {
                let name = k.as_str().unwrap_or("");
                if !fields.contains(&name) {
                    let what = if self.struct_name.is_empty() {
                        String::new()
                    } else {
                        format!(" in {}", self.struct_name)
                    };
                    let mut d =
                        Diagnostic::warning(k.span, format!("unknown field `{name}`{what}"))
                            .with_code(crate::diag::UNKNOWN_FIELD);
                    if let Some(n) = nearest(name, fields.iter().copied()) {
                        d = d.with_hint(format!("did you mean `{n}`?"));
                    } else {
                        d = d.with_hint(format!("known fields: {}", fields.join(", ")));
                    }
                    SINK.with(|s| s.borrow_mut().push(d));
                    continue;
                }
            }
            self.value = Some(v);
            return seed
                .deserialize(self.de.child(k))
                .map(Some)
                .map_err(|e: DeError| e.at(k.span));
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let v = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("value requested before key"))?;
        seed.deserialize(self.de.child(v))
            .map_err(|e: DeError| e.at(v.span))
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

struct SpannedAcc<'a> {
    de: NodeDe<'a>,
    state: u8,
}

impl<'de> de::MapAccess<'de> for SpannedAcc<'_> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let key = match self.state {
            0 => SPANNED_SPAN,
            1 => SPANNED_VALUE,
            _ => return Ok(None),
        };
        seed.deserialize(de::value::BorrowedStrDeserializer::new(key))
            .map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        self.state += 1;
        if self.state == 1 {
            let s = self.de.node.span;
            let tuple = (s.file.0, s.offset, s.len, s.line, s.col);
            seed.deserialize(TupleDe(tuple))
        } else {
            seed.deserialize(self.de)
        }
    }
}

struct TupleDe((u32, u32, u32, u32, u32));

impl<'de> de::Deserializer<'de> for TupleDe {
    type Error = DeError;
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let (a, b, c, d, e) = self.0;
        let items = [a, b, c, d, e];
        visitor.visit_seq(de::value::SeqDeserializer::new(items.into_iter()))
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

struct EnumAcc<'a> {
    de: NodeDe<'a>,
    key: &'a Node,
    value: &'a Node,
}

impl<'de, 'a> de::EnumAccess<'de> for EnumAcc<'a> {
    type Error = DeError;
    type Variant = NodeDe<'a>;
    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, NodeDe<'a>), DeError> {
        let v = seed.deserialize(self.de.child(self.key))?;
        Ok((v, self.de.child(self.value)))
    }
}

impl<'de> de::VariantAccess<'de> for NodeDe<'_> {
    type Error = DeError;
    fn unit_variant(self) -> Result<(), DeError> {
        Ok(())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self)
    }
    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_seq(self, visitor)
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_struct(self, "variant", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::node::parse_stream;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    #[serde(rename = "task")]
    #[allow(dead_code)]
    struct Task {
        cmd: Option<String>,
        mode: Option<String>,
        user: Option<Spanned<String>>,
        #[serde(default)]
        n: u16,
        #[serde(default)]
        flag: bool,
        #[serde(default)]
        list: Vec<String>,
    }

    fn load<T: DeserializeOwned>(text: &str) -> (Result<T, Diagnostic>, Vec<Diagnostic>) {
        let docs = parse_stream(FileId(0), text).expect("yaml");
        let mut w = Vec::new();
        let r = from_node(&docs[0], &mut w);
        (r, w)
    }

    #[test]
    fn strings_keep_text_and_spans_are_exact() {
        let (t, w) = load::<Task>("cmd: echo hi\nmode: 0755\nuser: \"${USER}\"\n");
        let t = t.expect("ok");
        assert!(w.is_empty());
        assert_eq!(t.mode.as_deref(), Some("0755"));
        let user = t.user.expect("user");
        assert_eq!(user.value, "${USER}");
        assert_eq!((user.span.line, user.span.col), (3, 7));
    }

    #[test]
    fn unknown_fields_warn_with_nearest_name() {
        let (t, w) = load::<Task>("cmd: x\nusr: root\n");
        assert!(t.is_ok());
        assert_eq!(w.len(), 1);
        assert!(w[0].message.contains("unknown field `usr` in task"));
        assert_eq!(w[0].hint.as_deref(), Some("did you mean `user`?"));
        assert_eq!(w[0].span.map(|s| (s.line, s.col)), Some((2, 1)));
    }

    #[test]
    fn type_errors_point_at_the_value() {
        let (t, _) = load::<Task>("cmd: x\nn: lots\n");
        let e = t.expect_err("bad int");
        assert!(
            e.message.contains("expected a non-negative integer"),
            "{}",
            e.message
        );
        assert_eq!(e.span.map(|s| (s.line, s.col)), Some((2, 4)));

        let (t, _) = load::<Task>("flag: yes\n");
        let e = t.expect_err("strict bool");
        assert!(e.message.contains("true or false"), "{}", e.message);

        let (t, _) = load::<Task>("list: {a: 1}\n");
        let e = t.expect_err("list");
        assert!(e.message.contains("expected a list"), "{}", e.message);
        assert_eq!(e.span.map(|s| s.line), Some(1));
    }

    #[test]
    fn yaml_capture_keeps_subtree() {
        #[derive(Deserialize)]
        struct W {
            eval: Yaml,
        }
        let (w, _) = load::<W>("eval:\n  - id: x\n    file: /a\n");
        let w = w.expect("ok");
        assert_eq!(w.eval.0.span.line, 2);
        assert_eq!(
            w.eval.to_json(),
            serde_json::json!([{"id": "x", "file": "/a"}])
        );
    }

    #[test]
    fn ordered_map_keeps_order_and_key_spans() {
        let (m, _) = load::<OrderedMap<Vec<String>>>("b: [x]\na: [y]\n");
        let m = m.expect("ok");
        assert_eq!(m.keys().collect::<Vec<_>>(), vec!["b", "a"]);
        assert_eq!(m.0[1].0.span.line, 2);
    }

    #[test]
    fn one_or_many_accepts_both() {
        let (a, _) = load::<std::collections::BTreeMap<String, OneOrMany<String>>>(
            "a: rpm\nb: [deb, pac]\n",
        );
        let a = a.expect("ok");
        assert_eq!(a["a"].0, vec!["rpm"]);
        assert_eq!(a["b"].0, vec!["deb", "pac"]);
    }
}
