#![doc = include_str!("../README.md")]
//!
//! # Crate map
//! - [`engine`]: one simulated engine ([`engine::serve`] with an [`engine::EngineConfig`]), with
//!   its optional gRPC load reporter (router-state-load's engine-side service), API key
//!   ([`engine::ApiKey`]) and TLS ([`engine::TlsError`] for unusable files).
//! - [`load`]: the workload generator ([`load::run`] with a [`load::LoadgenConfig`]), including
//!   trace replay and its oracles ([`load::trace_oracle`]).
//! - [`tokens`]: the engine's request preparation: chat-template rendering (router-chat-template,
//!   which the router renders with too) and tokenization.
//! - [`assets`]: paths of the shipped byte-level tokenizer and ChatML template.
//!
//! It encodes KV events with its own code, never router-state-kv's, so that a wire bug cannot
//! hide on both sides; from router-state-load it uses only the engine-side load reporter. Does not
//! own: anything the router does.

#![forbid(unsafe_code)]

pub mod assets;
pub mod engine;
pub mod load;
pub mod tokens;
