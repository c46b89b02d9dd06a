//! The ZeroMQ multipart messages around an event batch.
//!
//! - Live (PUB/SUB): `[topic, seq (8 bytes, big-endian), payload]`.
//! - Replay request (DEALER to the engine's ROUTER): `["", start_seq (8 bytes, big-endian)]`.
//! - Replay reply: `["", topic, seq, payload]` (vLLM >= 0.26, SGLang >= 0.5.22) or
//!   `["", seq, payload]` (older). A reply whose seq is all ones with an empty payload ends the
//!   replay.

use bytes::Bytes;

use crate::FrameError;

/// The sequence number that marks the end of a replay.
pub const END_OF_REPLAY: u64 = u64::MAX;

/// A live or replayed batch, still encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The topic, when the message carried one (old replay replies do not).
    pub topic: Option<Bytes>,
    /// Publisher sequence number.
    pub seq: u64,
    /// msgpack `EventBatch`.
    pub payload: Bytes,
}

/// A replay reply: one batch, or the end marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplayReply {
    /// A replayed batch.
    Batch(Frame),
    /// The end of the replay.
    End,
}

fn seq_of(frame: &[u8]) -> Result<u64, FrameError> {
    let bytes: [u8; 8] =
        frame.try_into().map_err(|_| FrameError::BadSeqLength { len: frame.len() })?;
    Ok(u64::from_be_bytes(bytes))
}

/// Parses a live message: exactly `[topic, seq, payload]`.
pub fn parse_live(frames: &[Bytes]) -> Result<Frame, FrameError> {
    let [topic, seq, payload] = frames else {
        return Err(FrameError::FrameCount { got: frames.len(), expected: "3" });
    };
    Ok(Frame { topic: Some(topic.clone()), seq: seq_of(seq)?, payload: payload.clone() })
}

/// Parses a replay reply of 3 or 4 frames, the first one empty.
pub fn parse_replay(frames: &[Bytes]) -> Result<ReplayReply, FrameError> {
    let (delimiter, topic, seq, payload) = match frames {
        [delimiter, seq, payload] => (delimiter, None, seq, payload),
        [delimiter, topic, seq, payload] => (delimiter, Some(topic.clone()), seq, payload),
        _ => return Err(FrameError::FrameCount { got: frames.len(), expected: "3 or 4" }),
    };
    if !delimiter.is_empty() {
        return Err(FrameError::MissingDelimiter);
    }
    let seq = seq_of(seq)?;
    if seq == END_OF_REPLAY {
        return Ok(ReplayReply::End);
    }
    Ok(ReplayReply::Batch(Frame { topic, seq, payload: payload.clone() }))
}

/// The frames of a replay request starting at `start`.
pub fn replay_request(start: u64) -> Vec<Bytes> {
    vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(v: &[u8]) -> Bytes {
        Bytes::copy_from_slice(v)
    }

    #[test]
    fn live_needs_three_frames_and_an_eight_byte_seq() {
        let seq = 7u64.to_be_bytes();
        let frame = parse_live(&[b(b"kv@a"), b(&seq), b(b"\x90")]).expect("valid");
        assert_eq!(frame.seq, 7);
        assert_eq!(frame.topic.as_deref(), Some(&b"kv@a"[..]));
        assert_eq!(
            parse_live(&[b(&seq), b(b"x")]),
            Err(FrameError::FrameCount { got: 2, expected: "3" })
        );
        assert_eq!(
            parse_live(&[b(b""), b(&[0, 1, 2]), b(b"x")]),
            Err(FrameError::BadSeqLength { len: 3 })
        );
    }

    #[test]
    fn replay_accepts_both_reply_shapes_and_the_end_marker() {
        let seq = 3u64.to_be_bytes();
        let old = parse_replay(&[b(b""), b(&seq), b(b"p")]).expect("3 frames");
        assert_eq!(old, ReplayReply::Batch(Frame { topic: None, seq: 3, payload: b(b"p") }));
        let new = parse_replay(&[b(b""), b(b"t"), b(&seq), b(b"p")]).expect("4 frames");
        assert_eq!(
            new,
            ReplayReply::Batch(Frame { topic: Some(b(b"t")), seq: 3, payload: b(b"p") })
        );
        let end = parse_replay(&[b(b""), b(&[0xff; 8]), b(b"")]).expect("end");
        assert_eq!(end, ReplayReply::End);
        assert_eq!(parse_replay(&[b(b"x"), b(&seq), b(b"p")]), Err(FrameError::MissingDelimiter));
        assert!(parse_replay(&[b(b"")]).is_err());
        assert_eq!(replay_request(258), vec![b(b""), b(&[0, 0, 0, 0, 0, 0, 1, 2])]);
    }
}
