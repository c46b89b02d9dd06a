//! The client side's bytes: a request head written in one buffer, an answer's head parsed by
//! httparse, and the answer's body framing (a length, chunked transfer coding, or the end of
//! the connection) decoded from the connection's read buffer.
//!
//! Everything here works on bytes alone: the connections and their pool are [`crate::client`]'s.

use std::mem::MaybeUninit;
use std::ops::Range;

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{
    CACHE_CONTROL, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, TRANSFER_ENCODING,
};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use smallvec::SmallVec;

use crate::text::{content_length_list, decimal, field, has_token};

/// Largest answer head accepted from an engine.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Most header fields in an answer head (hyper's default too).
const MAX_HEADERS: usize = 100;

/// Longest chunk-size line (the size, any chunk extensions) or trailer field line.
const MAX_LINE_BYTES: usize = 4096;

/// Most bytes of trailer fields after the last chunk (they are read and dropped).
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// What went wrong on an engine connection.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Reading or writing the connection failed.
    #[error("engine connection: {0}")]
    Io(#[from] std::io::Error),
    /// The engine closed the connection before the answer was complete.
    #[error("the engine closed the connection before the end of its answer {0}")]
    Closed(&'static str),
    /// Bytes that are not HTTP/1.1, or HTTP/1.1 this client refuses (named).
    #[error("the engine's answer is malformed: {0}")]
    Malformed(&'static str),
    /// The answer head did not end within [`MAX_HEAD_BYTES`].
    #[error("the engine's answer head is larger than {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
}

/// A request head under construction: the request line, then one field per call.
pub struct RequestHead(Vec<u8>);

impl RequestHead {
    /// `method target HTTP/1.1`, `target` in origin form (`/v1/chat/completions`).
    pub fn new(method: &str, target: &str) -> Self {
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(method.as_bytes());
        head.push(b' ');
        head.extend_from_slice(target.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\n");
        Self(head)
    }

    /// Adds one field; the name and value are valid already (`http`'s types check them).
    pub fn field(&mut self, name: &HeaderName, value: &HeaderValue) {
        field(&mut self.0, name.as_str().as_bytes(), value.as_bytes());
    }

    /// Adds one field whose value is the number `n`.
    pub fn decimal_field(&mut self, name: &HeaderName, n: u64) {
        let mut digits = [0; 20];
        field(&mut self.0, name.as_str().as_bytes(), decimal(n, &mut digits));
    }

    /// Ends the head of a request whose body has `length` bytes.
    pub fn finish(mut self, length: usize) -> Vec<u8> {
        self.decimal_field(&CONTENT_LENGTH, length as u64);
        self.0.extend_from_slice(b"\r\n");
        self.0
    }
}

/// The fields of an answer that are kept: those a router reads or passes on to its client (the
/// body's type and caching, an overloaded engine's `Retry-After`); the rest (framing and
/// connection fields aside) are read past, never made into a header map.
pub const KEPT_FIELDS: [HeaderName; 3] = [CONTENT_TYPE, CACHE_CONTROL, RETRY_AFTER];

/// Fields a router adds when an answer's map becomes its client's (a request id, the engine,
/// its rank, the bucket): room for them from the start, so the map never grows.
const ROOM_FOR_ROUTER_FIELDS: usize = 4;

/// An answer's head, as parsed.
#[derive(Debug)]
pub struct AnswerHead {
    /// The status code.
    pub status: StatusCode,
    /// Of its fields, those of [`KEPT_FIELDS`].
    pub headers: HeaderMap,
    /// How its body ends.
    pub framing: Framing,
    /// Whether the connection may carry another request once this answer is read.
    pub reusable: bool,
}

/// How an answer's body ends.
#[derive(Debug, PartialEq, Eq)]
pub enum Framing {
    /// After this many bytes (0: no body at all).
    Length(u64),
    /// With the last chunk of the chunked transfer coding.
    Chunked,
    /// When the engine closes the connection.
    UntilClose,
}

/// Parses an answer head at the start of `buf` and takes it off: the head once it is all
/// there, `None` while more bytes are needed. An informational (1xx) head comes back like any
/// other; the caller skips it.
pub fn parse_answer_head(buf: &mut BytesMut) -> Result<Option<AnswerHead>, WireError> {
    // Left uninitialized: writing 100 empty fields first would cost more than the parse.
    let mut fields = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut answer = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut answer,
        buf,
        &mut fields,
    );
    let length = match parsed {
        // The limit holds however the head arrived: whole, or a piece at a time.
        Ok(httparse::Status::Complete(length)) if length > MAX_HEAD_BYTES => {
            return Err(WireError::HeadTooLarge);
        }
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => {
            return Err(WireError::HeadTooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(WireError::Malformed("more than 100 header fields"));
        }
        Err(_) => return Err(WireError::Malformed("not an HTTP/1.1 response head")),
    };
    let code = answer.code.ok_or(WireError::Malformed("no status code"))?;
    let status = StatusCode::from_u16(code)
        .map_err(|_| WireError::Malformed("a status code out of range"))?;
    let mut reusable = answer.version == Some(1);
    let (mut length_field, mut chunked, mut coded) = (None, false, false);
    // Each value as a range of the head, which becomes shared bytes once it is taken off; on
    // the stack for the kept fields an answer usually has.
    let start = buf.as_ptr() as usize;
    let mut named: SmallVec<[(HeaderName, Range<usize>); 4]> = SmallVec::new();
    for field in answer.headers.iter() {
        let (name, value) = (field.name.as_bytes(), field.value);
        if name.eq_ignore_ascii_case(CONTENT_LENGTH.as_str().as_bytes()) {
            let parsed = content_length_list(value)
                .ok_or(WireError::Malformed("a Content-Length that is not a number"))?;
            if length_field.is_some_and(|earlier| earlier != parsed) {
                return Err(WireError::Malformed("two different Content-Length fields"));
            }
            length_field = Some(parsed);
        } else if name.eq_ignore_ascii_case(TRANSFER_ENCODING.as_str().as_bytes()) {
            coded = true;
            // Chunked only when it is the final coding (RFC 9112 §6.3).
            chunked = value
                .rsplit(|byte| *byte == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(CONNECTION.as_str().as_bytes()) {
            reusable &= !has_token(value, b"close");
        } else if let Some(kept) =
            KEPT_FIELDS.iter().find(|kept| name.eq_ignore_ascii_case(kept.as_str().as_bytes()))
        {
            let at = value.as_ptr() as usize - start;
            named.push((kept.clone(), at..at + value.len()));
        }
    }
    let head = buf.split_to(length).freeze();
    let mut headers = HeaderMap::with_capacity(named.len() + ROOM_FOR_ROUTER_FIELDS);
    for (name, range) in named {
        let value = HeaderValue::from_maybe_shared(head.slice(range))
            .map_err(|_| WireError::Malformed("a header field value"))?;
        headers.append(name, value);
    }
    let framing = if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Framing::Length(0)
    } else if coded {
        // Transfer-Encoding overrides any Content-Length; a coding other than chunked at the
        // end runs until the engine closes.
        if chunked { Framing::Chunked } else { Framing::UntilClose }
    } else {
        length_field.map_or(Framing::UntilClose, Framing::Length)
    };
    // Both framings at once is how requests are smuggled: answered, but never reused.
    if framing == Framing::UntilClose || (coded && length_field.is_some()) {
        reusable = false;
    }
    Ok(Some(AnswerHead { status, headers, framing, reusable }))
}

/// What the decoder made of the bytes at hand.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body data, taken off the front of the buffer.
    Data(Bytes),
    /// More bytes must be read first.
    More,
    /// The body is complete: whatever the buffer holds after it is not this answer's.
    End,
}

/// Where a chunked body is.
#[derive(Debug)]
pub enum Chunked {
    /// Before a chunk-size line.
    Size,
    /// Within a chunk, this many bytes of it to go.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last chunk, reading trailer fields (this many bytes of them so far).
    Trailers(usize),
    /// After the blank line that ends the trailers.
    Done,
}

impl Chunked {
    /// Decodes from the front of `buf`, taking off what it used: the data of every chunk the
    /// buffer holds comes back as one piece (uncopied when it is a single chunk's), so that an
    /// engine's burst of events is passed on in one write.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        let mut data = Gathered::None;
        let stopped = loop {
            match self {
                Chunked::Size => {
                    let Some(line) = line_end(buf, "a chunk size line")? else {
                        break Decoded::More;
                    };
                    let Some(sized) = buf[..line].strip_suffix(b"\r") else {
                        return Err(WireError::Malformed("a chunk size line without its CR"));
                    };
                    let size = chunk_size(sized)?;
                    buf.advance(line + 1);
                    *self = if size == 0 { Chunked::Trailers(0) } else { Chunked::Data(size) };
                }
                Chunked::Data(left) => {
                    if buf.is_empty() {
                        break Decoded::More;
                    }
                    let take = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                    *left -= take as u64;
                    if *left == 0 {
                        *self = Chunked::DataEnd;
                    }
                    data.take(buf, take);
                }
                Chunked::DataEnd => {
                    if buf.len() < 2 {
                        break Decoded::More;
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(WireError::Malformed("a chunk longer than its size"));
                    }
                    buf.advance(2);
                    *self = Chunked::Size;
                }
                Chunked::Trailers(read) => {
                    let Some(line) = line_end(buf, "a trailer field")? else {
                        break Decoded::More;
                    };
                    let blank = trim_cr(&buf[..line]).is_empty();
                    *read += line + 1;
                    buf.advance(line + 1);
                    if blank {
                        *self = Chunked::Done;
                        break Decoded::End;
                    }
                    if *read > MAX_TRAILER_BYTES {
                        return Err(WireError::Malformed("trailer fields over 16 KiB"));
                    }
                }
                Chunked::Done => break Decoded::End,
            }
        };
        // Data first: an end after it comes back on the next call.
        Ok(data.into_bytes().map_or(stopped, Decoded::Data))
    }
}

/// The data of the chunks decoded in one call.
enum Gathered {
    None,
    /// One chunk's, split off the buffer.
    One(Bytes),
    /// Several chunks', copied together.
    Joined(BytesMut),
}

impl Gathered {
    /// Takes `n` bytes of data off the front of `buf`.
    fn take(&mut self, buf: &mut BytesMut, n: usize) {
        match self {
            Gathered::None => *self = Gathered::One(buf.split_to(n).freeze()),
            Gathered::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + buf.len());
                joined.extend_from_slice(first);
                joined.extend_from_slice(&buf[..n]);
                buf.advance(n);
                *self = Gathered::Joined(joined);
            }
            Gathered::Joined(joined) => {
                joined.extend_from_slice(&buf[..n]);
                buf.advance(n);
            }
        }
    }

    fn into_bytes(self) -> Option<Bytes> {
        match self {
            Gathered::None => None,
            Gathered::One(data) => Some(data),
            Gathered::Joined(data) => Some(data.freeze()),
        }
    }
}

/// Where the line at the front of `buf` ends (its `\n`), `None` until it is all there.
fn line_end(buf: &[u8], what: &'static str) -> Result<Option<usize>, WireError> {
    match memchr::memchr(b'\n', buf) {
        Some(end) if end <= MAX_LINE_BYTES => Ok(Some(end)),
        None if buf.len() <= MAX_LINE_BYTES => Ok(None),
        _ => Err(WireError::Malformed(what)),
    }
}

/// `line` without the `\r` of its CRLF.
fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The size of a chunk-size line, its extensions (`;name=value`, after optional blanks)
/// ignored; anything else after the digits is refused, as hyper refuses it.
fn chunk_size(line: &[u8]) -> Result<u64, WireError> {
    let digits = line.iter().take_while(|byte| byte.is_ascii_hexdigit()).count();
    let rest = line[digits..].trim_ascii_start();
    if digits == 0 || digits > 15 || !matches!(rest.first(), None | Some(b';')) {
        return Err(WireError::Malformed("a chunk size that is not a hexadecimal number"));
    }
    // Folded by hand: a stream of one event per token has a size line per event, and going
    // through `str` and `from_str_radix` was a third of what decoding its body cost. Fifteen
    // digits are 60 bits, so the fold cannot overflow.
    Ok(line[..digits].iter().fold(0, |size, &digit| size << 4 | u64::from(hex_value(digit))))
}

/// The value of the hexadecimal digit `digit` (one of `0-9`, `a-f`, `A-F`).
fn hex_value(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        _ => digit - b'A' + 10,
    }
}

/// How much of an answer's body is left, and how it ends.
#[derive(Debug)]
pub enum Reading {
    /// This many bytes.
    Length(u64),
    /// Chunked transfer coding, where it is.
    Chunked(Chunked),
    /// Everything until the engine closes.
    UntilClose,
}

impl From<Framing> for Reading {
    fn from(framing: Framing) -> Self {
        match framing {
            Framing::Length(length) => Reading::Length(length),
            Framing::Chunked => Reading::Chunked(Chunked::Size),
            Framing::UntilClose => Reading::UntilClose,
        }
    }
}

impl Reading {
    /// Takes what the buffer holds of the body off its front.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, WireError> {
        Ok(match self {
            Reading::Length(0) => Decoded::End,
            Reading::Length(_) | Reading::UntilClose if buf.is_empty() => Decoded::More,
            Reading::Length(left) => {
                let take = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
                *left -= take as u64;
                Decoded::Data(buf.split_to(take).freeze())
            }
            Reading::UntilClose => Decoded::Data(buf.split().freeze()),
            Reading::Chunked(chunked) => chunked.decode(buf)?,
        })
    }
}

/// The answer's final head from the front of `buf` once it is all there, the informational
/// (1xx) heads before it taken off and dropped.
pub fn final_head(buf: &mut BytesMut) -> Result<Option<AnswerHead>, WireError> {
    while !buf.is_empty() {
        let Some(head) = parse_answer_head(buf)? else { break };
        if head.status == http::StatusCode::SWITCHING_PROTOCOLS {
            return Err(WireError::Malformed("a protocol switch nobody asked for"));
        }
        if !head.status.is_informational() {
            return Ok(Some(head));
        }
    }
    Ok(None)
}

/// An engine's whole answer decoded from `bytes` arriving `piece` bytes at a time, as its
/// connection would read it: the status and the body. The `engine_answer` fuzz target's entry,
/// reading the bytes as [`crate::client::H1Answer`] reads its socket.
pub fn decode_answer(bytes: &[u8], piece: usize) -> Result<(http::StatusCode, Vec<u8>), WireError> {
    let mut arriving = bytes.chunks(piece.max(1));
    let mut buf = BytesMut::new();
    let head = loop {
        if let Some(head) = final_head(&mut buf)? {
            break head;
        }
        buf.extend_from_slice(arriving.next().ok_or(WireError::Closed("head"))?);
    };
    let mut reading = Reading::from(head.framing);
    let mut body = Vec::new();
    loop {
        match reading.decode(&mut buf)? {
            Decoded::Data(data) => body.extend_from_slice(&data),
            Decoded::End => return Ok((head.status, body)),
            Decoded::More => match arriving.next() {
                Some(more) => buf.extend_from_slice(more),
                None if matches!(reading, Reading::UntilClose) => return Ok((head.status, body)),
                None => return Err(WireError::Closed("body")),
            },
        }
    }
}

#[cfg(test)]
mod tests;
