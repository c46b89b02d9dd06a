//! HTTP handlers.

pub(crate) mod admin;
mod body;
pub(crate) mod fleet;
pub(crate) mod inference;
pub(crate) mod ops;
