//! HTTP/1.1 text both sides read and write: field lines, connection tokens, decimal numbers,
//! and the one Content-Length parser (RFC 9110 §8.6, as hyper reads it), with the list of
//! equal values an answer may carry read on top of it.

/// Whether the comma-separated field value `value` lists `token` (any case), as
/// `Connection: keep-alive, close` lists `close`.
#[inline]
pub fn has_token(value: &[u8], token: &[u8]) -> bool {
    value.split(|byte| *byte == b',').any(|item| item.trim_ascii().eq_ignore_ascii_case(token))
}

/// Adds the field `name: value` and its line end to the head being written in `head`.
#[inline]
pub fn field(head: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    head.extend_from_slice(name);
    head.extend_from_slice(b": ");
    head.extend_from_slice(value);
    head.extend_from_slice(b"\r\n");
}

/// The decimal digits of `n`, written at the end of `digits`.
#[inline]
pub fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[at..];
        }
    }
}

/// A request's Content-Length value as hyper's server reads it: decimal digits only (no sign,
/// no blank inside, at most 19 of them) between optional blanks; `None` otherwise, a list of
/// values included (hyper refuses `5, 5` in a request: the `client_head` fuzz target found it).
#[inline]
pub fn content_length(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// An answer's Content-Length value as hyper's client reads it: one value as
/// [`content_length`] reads it, or a comma-separated list of equal ones (RFC 9110 §8.6 lets a
/// recipient take those as one).
pub fn content_length_list(value: &[u8]) -> Option<u64> {
    let mut length = None;
    for item in value.split(|b| *b == b',') {
        let parsed = content_length(item)?;
        if length.is_some_and(|earlier| earlier != parsed) {
            return None;
        }
        length = Some(parsed);
    }
    length
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_found_among_others_in_any_case_and_spacing() {
        assert!(has_token(b"keep-alive, Close", b"close"));
        assert!(has_token(b"close", b"close"));
        assert!(!has_token(b"closed, keep-alive", b"close"));
        assert!(!has_token(b"", b"close"));
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        for n in [0, 7, 10, 4096, u64::MAX] {
            let mut digits = [0; 20];
            assert_eq!(decimal(n, &mut digits), n.to_string().as_bytes());
        }
    }

    #[test]
    fn a_content_length_is_digits_and_an_answers_may_be_a_list_of_equal_ones() {
        assert_eq!(content_length(b"0"), Some(0));
        assert_eq!(content_length(b" 42 "), Some(42));
        assert_eq!(content_length(b"9999999999999999999"), Some(9_999_999_999_999_999_999));
        for refused in [&b""[..], b"+1", b"-1", b"1 2", b"0x10", b"42, 42", b"12345678901234567890"]
        {
            assert_eq!(content_length(refused), None, "{}", String::from_utf8_lossy(refused));
        }
        assert_eq!(content_length_list(b"42, 42"), Some(42));
        assert_eq!(content_length_list(b"42"), Some(42));
        for refused in [&b"42, 43"[..], b"42,", b",", b"+1, +1"] {
            assert_eq!(content_length_list(refused), None, "{}", String::from_utf8_lossy(refused));
        }
    }
}
