//! charly-text: text in the syntaxes charly writes, with nothing of a
//! project in it. A leaf crate: the model (`charly-rules`, which names
//! these modules as its own) and the REAPI stage interpreter
//! (`charly-reapi`, below the model) both use it. Where it sits among the
//! crates: `docs/architecture.md`.
//!
//! * [`sh`]: shell words quoted for sh (always, or only when needed), the
//!   one quoting every script, Containerfile and remote command uses;
//! * [`template`]: Go `text/template`, as the build vocabulary's templates
//!   need it (byte-identical to the original Go tool).

pub mod sh;
pub mod template;
