use thiserror::Error;

/// Represents an error when encoding/decoding raw byte buffers and frames
#[non_exhaustive]
#[derive(Error, Debug)]
pub enum CodecError {
    #[error("{0}")]
    Command(&'static str),
    #[error("{0}")]
    Greeting(&'static str),
    #[error("{0}")]
    Mechanism(&'static str),
    #[error("{0}")]
    Decode(&'static str),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Other(&'static str),
    /// An inbound frame would take its message past `SocketOptions::max_message_size`.
    /// `size` is the message's length with that frame, as its header announced it.
    #[error("inbound message of {size} bytes exceeds the limit of {limit} bytes")]
    MessageTooLarge { size: u64, limit: usize },
    /// An inbound message has more frames than `SocketOptions::max_message_frames`.
    #[error("inbound message exceeds the limit of {limit} frames")]
    TooManyFrames { limit: usize },
}

pub(crate) type CodecResult<T> = Result<T, CodecError>;
