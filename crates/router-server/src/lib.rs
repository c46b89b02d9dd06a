//! The router: configuration, request preparation, bucket dispatch and operations.
//!
//! Owns the assembly of every other crate into the `router-server` binary.
//!
//! Does not own: selection (router-policies, router-buckets) or state (the state crates).
