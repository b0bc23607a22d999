//! Canonical JSON written straight from `Serialize`: byte for byte what
//! `serde_json::to_string(&serde_json::to_value(v)?)` writes — compact,
//! every object's members (struct fields and map entries alike) sorted by
//! name, a duplicate name keeping its last value — without building the
//! `Value` tree. Keys hash canonical JSON of every candy's compiled steps:
//! at 10,000 candies × 1,000 boxes, building and dropping those trees was
//! ~120 ms of CPU per run.
//!
//! Leaves are written by `serde_json` itself (strings escaped, numbers
//! formatted as it does); only the nesting is done here. An object's
//! members are written to one buffer each, then sorted.

use serde::Serialize;
use serde::ser::{self, Error as _};
use serde_json::Error;

/// The canonical JSON of `v`.
pub fn to_string<T: Serialize + ?Sized>(v: &T) -> Result<String, Error> {
    let mut out = String::new();
    v.serialize(Writer::new(&mut out))?;
    Ok(out)
}

/// The canonical JSON of the object `v` with its member `name` written as
/// `json` (canonical JSON already), whatever `v` holds there: objects
/// that share a large member serialize it once.
pub fn to_string_with<T: Serialize + ?Sized>(
    v: &T,
    name: &str,
    json: &str,
) -> Result<String, Error> {
    let mut out = String::with_capacity(json.len() + 512);
    v.serialize(Writer {
        out: &mut out,
        splice: Some((name, json)),
    })?;
    Ok(out)
}

/// Writes one value at the end of `out`.
struct Writer<'a> {
    out: &'a mut String,
    /// A member written as given, when the value is an object.
    splice: Option<(&'a str, &'a str)>,
}

impl<'a> Writer<'a> {
    fn new(out: &'a mut String) -> Self {
        Writer { out, splice: None }
    }

    /// A leaf as `serde_json` writes it.
    fn leaf<T: Serialize + ?Sized>(self, v: &T) -> Result<(), Error> {
        let s = serde_json::to_string(v)?;
        self.out.push_str(&s);
        Ok(())
    }
}

/// Writes `{"variant":` before a variant's content; the caller closes it.
fn open_variant(out: &mut String, variant: &str) -> Result<(), Error> {
    out.push('{');
    out.push_str(&serde_json::to_string(variant)?);
    out.push(':');
    Ok(())
}

impl<'a> ser::Serializer for Writer<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Object<'a>;
    type SerializeStructVariant = Object<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_i16(self, v: i16) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_i32(self, v: i32) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_i64(self, v: i64) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        // A `Value` holds 64-bit numbers only.
        match i64::try_from(v) {
            Ok(v) => self.leaf(&v),
            Err(_) => match u64::try_from(v) {
                Ok(v) => self.leaf(&v),
                Err(_) => Err(Error::custom("number out of range")),
            },
        }
    }
    fn serialize_u8(self, v: u8) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_u16(self, v: u16) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_u32(self, v: u32) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_u64(self, v: u64) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        match u64::try_from(v) {
            Ok(v) => self.leaf(&v),
            Err(_) => Err(Error::custom("number out of range")),
        }
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        // A `Value` widens an f32 to f64 (1.1 is 1.100000023841858).
        self.serialize_f64(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        // Not finite: a `Value` holds null.
        self.leaf(&v)
    }
    fn serialize_char(self, v: char) -> Result<(), Error> {
        self.leaf(&v)
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        self.leaf(v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        // A `Value` holds bytes as an array of numbers.
        self.leaf(v)
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<(), Error> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push_str("null");
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        self.leaf(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        v: &T,
    ) -> Result<(), Error> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<(), Error> {
        open_variant(self.out, variant)?;
        v.serialize(Writer::new(self.out))?;
        self.out.push('}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>, Error> {
        self.out.push('[');
        Ok(Seq {
            out: self.out,
            first: true,
            variant: false,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Seq<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Seq<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, Error> {
        open_variant(self.out, variant)?;
        self.out.push('[');
        Ok(Seq {
            out: self.out,
            first: true,
            variant: true,
        })
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Object<'a>, Error> {
        Ok(Object::new(self.out, false, self.splice))
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Object<'a>, Error> {
        Ok(Object::new(self.out, false, self.splice))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Object<'a>, Error> {
        open_variant(self.out, variant)?;
        Ok(Object::new(self.out, true, None))
    }
}

/// An array being written (in a `{"variant":…}` when `variant`).
struct Seq<'a> {
    out: &'a mut String,
    first: bool,
    variant: bool,
}

impl Seq<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        v.serialize(Writer::new(self.out))
    }

    fn close(self) -> Result<(), Error> {
        self.out.push(']');
        if self.variant {
            self.out.push('}');
        }
        Ok(())
    }
}

/// The four array-like serializer traits, all writing elements of a [`Seq`].
macro_rules! seq_traits {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for Seq<'_> {
            type Ok = ();
            type Error = Error;
            fn $method<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
                self.element(v)
            }
            fn end(self) -> Result<(), Error> {
                self.close()
            }
        }
    )*};
}

seq_traits!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// An object being collected: its members' names and values (written),
/// sorted when it ends (in a `{"variant":…}` when `variant`).
struct Object<'a> {
    out: &'a mut String,
    members: Vec<(String, String)>,
    /// The name given by `serialize_key`, until its value comes.
    key: Option<String>,
    variant: bool,
    splice: Option<(&'a str, &'a str)>,
}

impl<'a> Object<'a> {
    fn new(out: &'a mut String, variant: bool, splice: Option<(&'a str, &'a str)>) -> Self {
        Object {
            out,
            members: Vec::new(),
            key: None,
            variant,
            splice,
        }
    }

    fn member<T: Serialize + ?Sized>(&mut self, name: String, v: &T) -> Result<(), Error> {
        let value = match self.splice {
            Some((spliced, json)) if spliced == name => json.to_string(),
            _ => {
                let mut value = String::new();
                v.serialize(Writer::new(&mut value))?;
                value
            }
        };
        self.members.push((name, value));
        Ok(())
    }

    fn close(mut self) -> Result<(), Error> {
        // Sorted by name; of equal names the last one written stays (a
        // `Value`'s map replaces the value on a second insert).
        self.members.sort_by(|a, b| a.0.cmp(&b.0));
        let n = self.members.len();
        self.out.push('{');
        let mut first = true;
        for i in 0..n {
            if i + 1 < n && self.members[i].0 == self.members[i + 1].0 {
                continue;
            }
            if !first {
                self.out.push(',');
            }
            first = false;
            let (name, value) = &self.members[i];
            self.out.push_str(&serde_json::to_string(name)?);
            self.out.push(':');
            self.out.push_str(value);
        }
        self.out.push('}');
        if self.variant {
            self.out.push('}');
        }
        Ok(())
    }
}

/// A map key as a `Value`'s map holds it: a string, or a number or bool
/// written as one.
fn key_name<T: Serialize + ?Sized>(key: &T) -> Result<String, Error> {
    match serde_json::to_value(key)? {
        serde_json::Value::String(s) => Ok(s),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        serde_json::Value::Bool(b) => Ok(b.to_string()),
        _ => Err(Error::custom("key must be a string")),
    }
}

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.key = Some(key_name(key)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        let name = self
            .key
            .take()
            .ok_or_else(|| Error::custom("map value without a key"))?;
        self.member(name, v)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

/// The two struct-like serializer traits, both collecting named members.
macro_rules! struct_traits {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Object<'_> {
            type Ok = ();
            type Error = Error;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                name: &'static str,
                v: &T,
            ) -> Result<(), Error> {
                self.member(name.to_string(), v)
            }
            fn end(self) -> Result<(), Error> {
                self.close()
            }
        }
    )*};
}

struct_traits!(SerializeStruct, SerializeStructVariant);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashMap};

    /// What the canonical form was defined as.
    fn by_value<T: Serialize + ?Sized>(v: &T) -> Result<String, Error> {
        serde_json::to_string(&serde_json::to_value(v)?)
    }

    fn same<T: Serialize + ?Sized>(v: &T) {
        let want = by_value(v).expect("by value");
        assert_eq!(to_string(v).expect("canonical"), want);
    }

    #[derive(Serialize)]
    struct Fields {
        zeta: u8,
        alpha: Option<String>,
        #[serde(rename = "Mid")]
        mid: Vec<f32>,
        #[serde(flatten)]
        extra: BTreeMap<String, i64>,
        nested: Kind,
        unit: (),
        pair: (bool, char),
        bytes: serde_bytes_like::Bytes,
    }

    mod serde_bytes_like {
        /// Serialized with `serialize_bytes`.
        pub struct Bytes(pub Vec<u8>);
        impl serde::Serialize for Bytes {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0)
            }
        }
    }

    #[derive(Serialize)]
    #[serde(tag = "kind", rename_all = "kebab-case")]
    enum Tagged {
        Copy { to: String, from: String },
        Run { cmd: Vec<String> },
    }

    #[derive(Serialize)]
    enum Kind {
        Unit,
        New(u64),
        Tuple(i8, String),
        Struct { b: u8, a: u8 },
    }

    #[test]
    fn every_serde_shape_writes_as_through_a_value() {
        for nested in [
            Kind::Unit,
            Kind::New(7),
            Kind::Tuple(-3, "x\"y".into()),
            Kind::Struct { b: 1, a: 2 },
        ] {
            same(&Fields {
                zeta: 1,
                alpha: None,
                mid: vec![1.1, f32::NAN, -0.0],
                // `zeta` again: the flattened entry comes last and wins.
                extra: BTreeMap::from([("beta".into(), -1), ("zeta".into(), 9)]),
                nested,
                unit: (),
                pair: (true, 'é'),
                bytes: serde_bytes_like::Bytes(vec![0, 255]),
            });
        }
        same(&vec![
            Tagged::Copy {
                to: "/b".into(),
                from: "/a".into(),
            },
            Tagged::Run {
                cmd: vec!["echo \u{1}\n".into()],
            },
        ]);
        same(&HashMap::from([(3u32, "c"), (10, "a"), (2, "b")]));
        same(&BTreeMap::from([(true, 1), (false, 2)]));
        same(&(u64::MAX, i64::MIN, 1e300, f64::INFINITY, 0.1 + 0.2));
        same(&[i128::from(i64::MIN), i128::from(u64::MAX)]);
    }

    #[test]
    fn a_spliced_member_is_written_as_given_and_sorted_as_its_name() {
        #[derive(Serialize)]
        struct Plan<'a> {
            z: u8,
            steps: &'a [Kind],
            a: Vec<BTreeMap<String, u8>>,
        }
        let steps = [Kind::New(1), Kind::Struct { b: 2, a: 3 }];
        let full = Plan {
            z: 1,
            steps: &steps,
            a: vec![BTreeMap::from([("steps".into(), 4)])],
        };
        let want = to_string(&full).expect("canonical");
        assert_eq!(want, by_value(&full).expect("by value"));
        let steps_json = to_string(&steps[..]).expect("steps");
        let header = Plan { steps: &[], ..full };
        // Only the top-level member is replaced.
        assert_eq!(
            to_string_with(&header, "steps", &steps_json).expect("spliced"),
            want
        );
    }

    #[test]
    fn what_a_value_refuses_is_refused() {
        assert!(by_value(&u128::MAX).is_err());
        assert!(to_string(&u128::MAX).is_err());
        let tuple_keys = BTreeMap::from([((1, 2), "x")]);
        assert!(by_value(&tuple_keys).is_err());
        assert!(to_string(&tuple_keys).is_err());
    }

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            ".{0,12}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::Array),
                prop::collection::vec(("[a-d\"\\\\é]{0,3}", inner), 0..8)
                    .prop_map(|kv| { serde_json::Value::Object(kv.into_iter().collect()) }),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_json_writes_as_through_a_value(v in json()) {
            prop_assert_eq!(to_string(&v).expect("canonical"), by_value(&v).expect("by value"));
        }
    }
}
