//! HTTP handlers.

pub mod admin;
mod body;
pub mod chat;
pub mod ops;
