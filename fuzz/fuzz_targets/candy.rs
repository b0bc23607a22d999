//! Fuzz target: arbitrary bytes through the candy parser path, the same calls
//! the loader makes for a `candy/<name>/charly.yml`:
//!
//! 1. `yaml::check_text` (size, NUL, UTF-8),
//! 2. `yaml::parse_stream` into spanned documents,
//! 3. `yaml::from_node::<Candy>` of each document, and of its `candy:`
//!    sub-node when the document is a mapping with that key (the loader
//!    decodes the sub-node; decoding the whole document covers flat files).
//!
//! Errors and warnings are expected results; any panic, abort, stack
//! overflow, timeout or out-of-memory is a bug in charly-rules.

#![no_main]

use charly_rules::FileId;
use charly_rules::model::Candy;
use charly_rules::yaml::{check_text, from_node, parse_stream};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = check_text(bytes) else {
        return;
    };
    let Ok(docs) = parse_stream(FileId(0), text) else {
        return;
    };
    // What the loader asks of every document before decoding.
    let _ = docs.iter().all(|d| d.is_null());
    let mut warnings = Vec::new();
    for doc in &docs {
        let _ = doc.kind_name();
        let _ = from_node::<Candy>(doc, &mut warnings);
        if doc.as_map().is_some()
            && let Some(candy) = doc.get("candy")
        {
            let _ = from_node::<Candy>(candy, &mut warnings);
        }
        warnings.clear();
    }
});
