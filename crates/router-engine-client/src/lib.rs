#![doc = include_str!("../README.md")]

pub mod cards;
mod client;
pub mod engines;
pub mod error;
pub mod tls;
pub mod trace;

pub use cards::ModelCards;
pub use client::{EngineBody, ForwardConfig, Forwarder, Probe};
pub use engines::EngineLearner;
pub use error::{BoxError, SendError};

use http::HeaderName;

/// The header that carries a request's id: read from the client (or made up), sent to the
/// engine, and answered back.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");
