//! In-flight guard acquire and release.
fn main() {}
