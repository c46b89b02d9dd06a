//! Buckets: length-first resolution and complete plain or PD engine selection.
//!
//! Owns `BucketResolver`, `Bucket`, `BucketGroups`, `EngineGroup` and their validation.
//!
//! Does not own: policies or their state (router-policies), HTTP, or dispatch (router-server).
