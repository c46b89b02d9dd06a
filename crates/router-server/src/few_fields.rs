//! Looking a field up among a request's header fields, which are few: clients send a handful
//! to a dozen, and an inference request's way through the router looks up about ten (its id,
//! the trace context, the affinity keys, the data-parallel rank, the body's length). A
//! `HeaderMap::get` hashes the name and probes the map's index; comparing the names of a few
//! fields one by one finds the same value for fewer instructions (a fast path:
//! docs/benchmarks.md, Fast paths).

use http::{HeaderMap, HeaderName, HeaderValue};

/// Maps with up to this many names are scanned; larger ones are looked up by hash.
const SCANNED_NAMES: usize = 16;

/// A header map's first value of a field, found by scanning a small map.
pub(crate) trait FewFields {
    /// The first value of field `name`, as `HeaderMap::get` finds it.
    fn field(&self, name: &HeaderName) -> Option<&HeaderValue>;
}

impl FewFields for HeaderMap {
    fn field(&self, name: &HeaderName) -> Option<&HeaderValue> {
        if self.keys_len() > SCANNED_NAMES {
            return self.get(name);
        }
        // A name's values come one after another, its first value first, as `get` has it.
        self.iter().find_map(|(field, value)| (field == name).then_some(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::{CONTENT_LENGTH, HOST};

    #[test]
    fn finds_what_get_finds_in_maps_small_and_large() {
        let request_id = HeaderName::from_static("x-request-id");
        for filler in [0, 3, SCANNED_NAMES + 4] {
            let mut headers = HeaderMap::new();
            for i in 0..filler {
                let name = HeaderName::try_from(format!("x-filler-{i}")).expect("a name");
                headers.insert(name, HeaderValue::from(i));
            }
            headers.append(&request_id, HeaderValue::from_static("first"));
            headers.append(HOST, HeaderValue::from_static("router"));
            headers.append(&request_id, HeaderValue::from_static("second"));
            for name in [&request_id, &HOST, &CONTENT_LENGTH] {
                assert_eq!(headers.field(name), headers.get(name), "{name} among {filler}");
            }
            assert_eq!(headers.field(&request_id).map(HeaderValue::as_bytes), Some(&b"first"[..]));
            assert_eq!(headers.field(&CONTENT_LENGTH), None);
        }
    }
}
