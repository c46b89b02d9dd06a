//! HTTP handlers.

pub(crate) mod admin;
mod body;
pub(crate) mod chat;
pub(crate) mod ops;
