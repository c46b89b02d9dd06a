//! The router's own HTTP/1.1, at the byte level and in its two connection drivers.
//!
//! - [`text`]: field lines, connection tokens, decimal numbers and the one Content-Length
//!   parser both sides frame bodies by;
//! - [`request`] and [`response`]: the server side's heads (which requests the own loop reads,
//!   and answer heads written as hyper writes them);
//! - [`server`]: the client-facing connection loop, generic over a [`server::Handler`], which
//!   hands any request it does not serve to a general server with the bytes read so far;
//! - [`answer`] and [`client`]: the engine side (request heads, answer heads, chunked and
//!   length framing) and its pooled connections, one idle list per engine and thread.
//!
//! No routes, application state or web framework live here: the router's assembly
//! (router-server) says which paths are served and by what. Every decoder of untrusted bytes
//! has a fuzz target in `fuzz/` (`client_head` against hyper, `engine_answer` whole against
//! pieces) and property tests beside it.

pub mod answer;
pub mod client;
pub mod request;
pub mod response;
pub mod server;
pub mod text;

/// An error of any kind, as connectors and bodies report them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
