//! Tests of router-buckets through its public API, against a real `WorkerRegistry`.

mod design_example;
mod group;
mod pairing;
mod pick_engines;
mod resolve;
mod select;
mod slo;
mod support;
mod validation;
