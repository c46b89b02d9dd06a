//! HTTP handlers.

pub mod admin;
pub mod chat;
pub mod ops;
