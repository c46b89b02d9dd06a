//! Session and routing keys as the inference handlers read them from headers.

use axum::http::{HeaderMap, HeaderValue};

use super::affinity_key;
use crate::error::ApiError;

#[test]
fn affinity_keys_are_read_checked_and_named_in_errors() {
    let mut headers = HeaderMap::new();
    headers.insert("x-session-id", HeaderValue::from_static("abc"));
    headers.insert("x-long", HeaderValue::from_str(&"k".repeat(257)).expect("ascii"));
    headers.insert("x-limit", HeaderValue::from_str(&"k".repeat(256)).expect("ascii"));
    headers.insert("x-binary", HeaderValue::from_bytes(b"caf\xc3\xa9").expect("opaque"));

    assert_eq!(affinity_key(&headers, "x-session-id").expect("valid"), Some("abc"));
    assert_eq!(affinity_key(&headers, "x-absent").expect("valid"), None);
    assert_eq!(affinity_key(&headers, "x-limit").expect("valid").map(str::len), Some(256));
    for (name, says) in
        [("x-long", "257 bytes exceeds the limit of 256"), ("x-binary", "visible ASCII")]
    {
        let err = affinity_key(&headers, name).expect_err(name);
        assert_eq!(err.status().as_u16(), 400, "{name}");
        let ApiError::InvalidRequest { message, param } = &err else { panic!("{err:?}") };
        assert_eq!(param.as_deref(), Some(name));
        assert!(message.contains(name) && message.contains(says), "{message}");
    }
}
