use super::*;

fn codec(max_size: usize, max_frames: usize) -> ZmqCodec {
    let mut options = SocketOptions::default();
    options
        .max_message_size(max_size)
        .max_message_frames(max_frames);
    let mut codec = ZmqCodec::with_options(&options);
    codec.state = DecoderState::FrameHeader;
    codec.waiting_for = 1;
    codec
}

#[test]
fn a_frame_announcing_more_than_the_limit_is_refused_at_its_header() {
    let mut codec = codec(1024, 16);
    let mut input = BytesMut::from(&[0b0000_0010][..]);
    input.extend_from_slice(&(1u64 << 60).to_be_bytes());
    match codec.decode(&mut input) {
        Err(CodecError::MessageTooLarge { size, limit }) => {
            assert_eq!((size, limit), (1 << 60, 1024));
        }
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    // Nothing was reserved for the announced frame.
    assert!(input.capacity() < 1024);
    assert!(codec.limit_exceeded());
}

#[test]
fn a_multipart_message_is_bounded_in_bytes_and_frames_while_it_accumulates() {
    // 3 + 3 + 3 bytes fit in 10; a fourth 3-byte frame would not.
    let mut codec = codec(10, 16);
    let mut input = BytesMut::from([1, 3, b'a', b'b', b'c'].repeat(4).as_slice());
    assert!(matches!(
        codec.decode(&mut input),
        Err(CodecError::MessageTooLarge {
            size: 12,
            limit: 10
        })
    ));
    assert!(
        codec.buffered_message.is_none(),
        "the partial message is released"
    );

    let mut codec = codec_frames(4);
    let mut input = BytesMut::from([1, 0].repeat(5).as_slice());
    assert!(matches!(
        codec.decode(&mut input),
        Err(CodecError::TooManyFrames { limit: 4 })
    ));
}

fn codec_frames(max_frames: usize) -> ZmqCodec {
    codec(usize::MAX, max_frames)
}

#[test]
fn messages_at_the_limits_decode() {
    let mut codec = codec(6, 3);
    let mut input = BytesMut::from(&[1, 2, b'a', b'b', 1, 2, b'c', b'd', 0, 2, b'e', b'f'][..]);
    let Message::Message(message) = codec.decode(&mut input).unwrap().unwrap() else {
        panic!("expected a message");
    };
    assert_eq!(message.len(), 3);
    // The next message starts from zero.
    input.extend_from_slice(&[0, 6, b'1', b'2', b'3', b'4', b'5', b'6']);
    let Message::Message(message) = codec.decode(&mut input).unwrap().unwrap() else {
        panic!("expected a message");
    };
    assert_eq!(message.len(), 1);
    assert!(!codec.limit_exceeded());
}
