//! charly-reapi: remote execution and the gRPC remote cache, a client of the Remote Execution API v2 (REAPI, the
//! protocol Bazel and buck2 speak to Buildbarn, BuildBuddy, NativeLink,
//! EngFlow, BuildGrid and buildbox-casd) and the mapping of charly's
//! command-running nodes to REAPI actions.
//!
//! * [`client`]: the gRPC client behind a synchronous API (a private tokio
//!   runtime, like the OCI remote cache and the SSH deploy): capabilities,
//!   CAS (FindMissingBlobs, BatchUpdateBlobs, BatchReadBlobs, ByteStream for
//!   blobs larger than the batch limit), ActionCache and Execute with its
//!   long-running operation stream.
//! * [`tree`]: digests and content-addressed input roots built from local
//!   directories (Directory messages, deduplicated blobs).
//! * [`action`]: one command as an Action: upload what the engine is missing,
//!   look it up in the ActionCache, execute, then download and verify every
//!   output's digest before anything is written locally.
//! * [`cache`]: [`GrpcCache`], the engine's CAS and
//!   ActionCache as a shared cache of node records (`--remote grpc://…`),
//!   beside the OCI-registry backend.
//! * [`stage`]: the interpreter of builder-stage Containerfiles as a
//!   sequence of REAPI actions.
//! * [`layer`]: a box layer as one action: its parent's root filesystem
//!   from layer blobs, the steps, and the layer written back by charly from
//!   what the action changed.
//!
//! The engine's `RemoteRunner` (`charly_engine::runners::remote`) maps
//! command nodes onto this crate; this crate depends on `charly-cache` only.
//!
//! The protobuf messages and stubs come pre-generated from the
//! `bazel-remote-apis` crate (no protoc at build time). Where the crate
//! sits: `docs/architecture.md`.

pub mod action;
pub mod cache;
pub mod client;
pub mod layer;
pub mod stage;
pub mod tree;

pub use action::{ActionOutcome, RemoteCommand};
pub use cache::GrpcCache;
pub use client::{Client, DigestFn, RemoteError, RemoteUrl};
