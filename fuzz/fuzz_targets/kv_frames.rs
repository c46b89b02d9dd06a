//! Fuzz target `kv_frames`: the ZeroMQ frame reader of the KV-event subscriptions (the patched
//! `zeromq` crate's `ZmqFramedRead` and its decoder, patches/zeromq/PATCH.md), fed what a TCP
//! peer sends after a valid ZMTP greeting, with the inbound limits set as the router sets them.
//!
//! The first byte is the size of the pieces the rest arrives in (0 counts as 1); the rest
//! follows a valid greeting. Beyond "never panics":
//! - every decoded message is within the limits (frames, bytes), every command within the size
//!   limit, and a decoded live or replay message parses as the subscriptions parse it;
//! - a refusal (`MessageTooLarge`, `TooManyFrames`) ends the stream: nothing is read after it;
//! - however large the lengths the bytes announce, the reader never has more than
//!   [`ALLOCATION_BOUND`] bytes allocated at once (a counting global allocator watches every
//!   allocation of the run; a 2^60-byte header that got past the limit would abort the process);
//! - what it decodes, and how it ends, does not depend on how the network split the bytes.
//!
//! Seeds: a live message, a replay reply, a multipart message past the frame limit, a 2^60-byte
//! frame header.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::io::AsyncRead;
use futures::stream::Stream;
use libfuzzer_sys::fuzz_target;
use router_state_kv::wire::frames;
use zeromq::__bench::{Message, zmq_framed_read_with_options};
use zeromq::{CodecError, SocketOptions};

/// `kv.max_message_bytes` of this run: small, so that real bytes reach it too.
const MAX_MESSAGE_BYTES: usize = 4096;
/// `kv.max_frames_per_message` of this run.
const MAX_FRAMES: usize = 8;
/// The most the reader may have allocated at once: a message of the limit, twice over (it may
/// be split over two reads' storage), and the read buffer's largest chunk (64 KiB), twice
/// (growth copies), with room to spare. The input itself is not counted.
const ALLOCATION_BOUND: usize = 4 * MAX_MESSAGE_BYTES + 4 * 65_536;

/// A counting allocator around the system's: bytes live now and the most live at once.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only the sizes are counted. This is
// the one unsafe block of the fuzz targets: a global allocator is an unsafe trait, and the
// bound on allocations cannot be observed any other way.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `System.alloc`; the caller upholds its contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `System.alloc_zeroed`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `System.realloc`; `ptr` came from `System` with `layout`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A peer's bytes, handed out at most `piece` at a time.
struct Peer {
    bytes: Vec<u8>,
    at: usize,
    piece: usize,
}

impl AsyncRead for Peer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        let n = buf.len().min(self.piece).min(self.bytes.len() - self.at);
        buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Poll::Ready(Ok(n))
    }
}

/// The 64-byte ZMTP 3.0 greeting of a NULL-mechanism peer.
fn greeting() -> [u8; 64] {
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[12..16].copy_from_slice(b"NULL");
    greeting
}

/// How a stream ended.
#[derive(Debug, PartialEq)]
enum End {
    /// The peer's bytes ran out.
    Closed,
    /// A frame header past `max_message_size`.
    TooLarge,
    /// A frame past `max_message_frames`.
    TooManyFrames,
    /// Anything else the decoder refused (the text of its error).
    Refused(String),
}

/// Reads the greeting and `rest` in pieces of `piece` bytes, until the stream ends or fails.
/// The messages are kept as copies, as the subscriptions keep them: a decoded frame shares the
/// reader's storage, which would otherwise stay allocated for as long as the message.
fn read(rest: &[u8], piece: usize) -> (Vec<Vec<Vec<u8>>>, End) {
    let mut bytes = greeting().to_vec();
    bytes.extend_from_slice(rest);
    let mut options = SocketOptions::default();
    options.max_message_size(MAX_MESSAGE_BYTES).max_message_frames(MAX_FRAMES);
    let mut reader =
        Box::pin(zmq_framed_read_with_options(Peer { bytes, at: 0, piece }, Arc::new(options)));
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    let mut messages = Vec::new();
    loop {
        // The peer never blocks, so the reader is never pending.
        let Poll::Ready(item) = reader.as_mut().poll_next(&mut cx) else {
            panic!("the frame reader waits on a peer that never blocks");
        };
        let end = match item {
            None => End::Closed,
            Some(Ok(Message::Greeting(_))) => continue,
            Some(Ok(Message::Command(_))) => continue,
            Some(Ok(Message::Message(message))) => {
                let frames = message.into_vec();
                assert!(frames.len() <= MAX_FRAMES, "a message of {} frames", frames.len());
                let size: usize = frames.iter().map(Bytes::len).sum();
                assert!(size <= MAX_MESSAGE_BYTES, "a message of {size} bytes");
                if let Ok(frame) = frames::parse_live(&frames) {
                    assert_eq!(frame.payload, frames[2]);
                }
                let _ = frames::parse_replay(&frames);
                messages.push(frames.iter().map(|frame| frame.to_vec()).collect());
                continue;
            }
            Some(Err(CodecError::MessageTooLarge { size, limit })) => {
                assert!(size > limit as u64, "refused {size} bytes under the limit {limit}");
                End::TooLarge
            }
            Some(Err(CodecError::TooManyFrames { limit })) => {
                assert_eq!(limit, MAX_FRAMES);
                End::TooManyFrames
            }
            Some(Err(other)) => End::Refused(other.to_string()),
        };
        if matches!(end, End::TooLarge | End::TooManyFrames) {
            let after = reader.as_mut().poll_next(&mut cx);
            assert!(matches!(after, Poll::Ready(None)), "the stream goes on after a refusal");
        }
        return (messages, end);
    }
}

/// Runs `read`, asserting that it never had more than [`ALLOCATION_BOUND`] bytes allocated at
/// once beyond what was allocated before.
fn bounded<T>(read: impl FnOnce() -> T) -> T {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = read();
    let peak = PEAK.load(Ordering::Relaxed) - base;
    assert!(peak <= ALLOCATION_BOUND, "{peak} bytes allocated at once (bound {ALLOCATION_BOUND})");
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&piece, rest)) = data.split_first() else { return };
    let piece = usize::from(piece).max(1);
    let in_pieces = bounded(|| read(rest, piece));
    let whole = bounded(|| read(rest, rest.len() + 64));
    assert_eq!(in_pieces, whole, "read differently in pieces of {piece}");
});
