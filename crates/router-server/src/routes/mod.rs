//! HTTP handlers.

pub(crate) mod admin;
pub(crate) mod body;
pub(crate) use body::REQUEST_ID_HEADER;
pub(crate) mod fleet;
pub(crate) mod inference;
pub(crate) mod ops;
