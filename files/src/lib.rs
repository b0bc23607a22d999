//! charly-files: the file utilities the engine and the deploy walkers
//! share, below both (docs/architecture.md, "The crates").
//!
//! * [`fsroot`]: a directory tree that every path is proven to lie inside
//!   before it is read, written or removed (no `..`, no symlink out).
//! * [`artifact`]: builder artifacts as tars: read into entries, written
//!   back in a canonical order.

pub mod artifact;
pub mod fsroot;
