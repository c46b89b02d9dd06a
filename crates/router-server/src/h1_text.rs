//! HTTP/1.1 text that both of the router's own HTTP/1.1 sides read and write: the client's
//! ([`crate::server`]'s own loop) and the engines' (`forward/client/h1/wire.rs`).

/// Whether the comma-separated field value `value` lists `token` (any case), as
/// `Connection: keep-alive, close` lists `close`.
pub(crate) fn has_token(value: &[u8], token: &[u8]) -> bool {
    value.split(|byte| *byte == b',').any(|item| item.trim_ascii().eq_ignore_ascii_case(token))
}

/// Adds the field `name: value` and its line end to the head being written in `head`.
pub(crate) fn field(head: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    head.extend_from_slice(name);
    head.extend_from_slice(b": ");
    head.extend_from_slice(value);
    head.extend_from_slice(b"\r\n");
}

/// The decimal digits of `n`, written at the end of `digits`.
pub(crate) fn decimal(mut n: u64, digits: &mut [u8; 20]) -> &[u8] {
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
}
