//! YAML reading: a spanned node tree (`node`) and a serde Deserializer over it (`de`).

pub mod de;
pub mod node;

pub use de::{DeError, OneOrMany, OrderedMap, Spanned, Yaml, from_node};
pub use node::{Node, Style, Value, check_text, parse_stream};
