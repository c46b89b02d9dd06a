//! Snapshot capture and per-engine reads over a table of 256 engines.
fn main() {}
