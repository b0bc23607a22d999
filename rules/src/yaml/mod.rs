//! YAML reading: a spanned node tree (`node`) and a serde Deserializer over it (`de`).

pub mod cache;
pub mod de;
pub mod node;

pub use cache::{TreeCache, TreeKey, parse_cached};
pub use de::{DeError, OneOrMany, OrderedMap, Spanned, Yaml, from_node};
pub use node::{Node, Style, Value, check_text, parse_stream};
