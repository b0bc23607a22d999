//! Scale-project generator (placeholder target so the suite package builds).
fn main() {}
