//! The narrow entry the fuzz targets in `fuzz/` use to reach the HTTP/1.1 decoding of engine
//! connections and of the router's own client loop, which are otherwise crate-private: decode
//! an engine's answer as its connection reads it; read a client's request head as the router's
//! own HTTP/1.1 loop reads it. Hidden from the documentation and not an API: it exposes plain
//! values only. (Request preparation is router-prepare's, fuzzed through its own API.)

/// An engine's HTTP/1.1 answer decoded from `bytes` arriving `piece` bytes at a time, as an
/// engine connection reads it: the status and the body, or why the answer was refused.
pub fn engine_answer(bytes: &[u8], piece: usize) -> Result<(u16, Vec<u8>), String> {
    crate::forward::decode_answer(bytes, piece)
        .map(|(status, body)| (status.as_u16(), body))
        .map_err(|err| err.to_string())
}

/// The request the router's own HTTP/1.1 loop serves itself from the start of a client
/// connection that sent `bytes` (heads of at most `max_bytes`): its endpoint's path and its
/// Content-Length; `None` when the loop leaves the connection to hyper or the head is not
/// whole. Whatever it serves, hyper must read as the same request.
pub fn client_head(bytes: &[u8], max_bytes: usize) -> Option<(String, u64)> {
    crate::server::served_here(bytes, max_bytes)
}
