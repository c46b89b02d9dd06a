//! HTTP handlers.

pub(crate) mod admin;
pub(crate) mod fleet;
pub(crate) mod inference;
pub(crate) mod ops;
