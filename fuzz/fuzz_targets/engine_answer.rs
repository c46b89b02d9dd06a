//! Fuzz target `engine_answer`: an engine's HTTP/1.1 answer as the router's engine connections
//! decode it (head, informational heads, Content-Length, chunked or read-until-close bodies).
//!
//! The first byte is the size of the pieces the rest arrives in (0 counts as 1). Beyond "never
//! panics": the answer decodes to the same status and body, or is refused alike, whether it
//! arrives in those pieces or whole, so what a connection makes of an engine's bytes never
//! depends on how the network split them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use router_http1::answer::decode_answer;

/// The status and body, or why the answer was refused.
fn decoded(answer: &[u8], piece: usize) -> Result<(u16, Vec<u8>), String> {
    decode_answer(answer, piece)
        .map(|(status, body)| (status.as_u16(), body))
        .map_err(|err| err.to_string())
}

fuzz_target!(|data: &[u8]| {
    let Some((&piece, answer)) = data.split_first() else { return };
    let in_pieces = decoded(answer, usize::from(piece));
    let whole = decoded(answer, answer.len());
    match (&in_pieces, &whole) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "decoded differently in pieces of {piece}"),
        (Err(_), Err(_)) => {}
        _ => panic!("pieces of {piece}: {in_pieces:?}; whole: {whole:?}"),
    }
});
