//! Protobuf and gRPC code generated from the `.proto` files in `proto/`.
//!
//! Owns nothing but generated code: `src/gen/` is written by `cargo xtask codegen` and checked
//! in, so building needs neither `protoc` nor a build script, and `cargo xtask codegen --check`
//! (also a test in xtask) fails when it is stale. Modules follow the protobuf package path, for
//! example `router_proto::router::load::v1`; `router_proto::envoy::service::ext_proc::v3` is
//! the wire-compatible subset of Envoy's external processing API that the endpoint picker
//! speaks (`proto/envoy/README.md`). Does not own any behaviour around the messages.

#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    reason = "generated code: whether a lint fires depends on the protos"
)]
mod generated {
    include!("gen/mod.rs");
}

pub use generated::*;
