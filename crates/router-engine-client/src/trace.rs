//! The W3C trace context an engine is sent: the client's `traceparent` and `tracestate`, kept
//! only when valid and within the bounds the W3C Trace Context asks every vendor to propagate,
//! or the router's own span context when it exports spans (router-server's telemetry).

use http::{HeaderMap, HeaderName, HeaderValue};

/// The W3C trace context headers: `traceparent`
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// and `tracestate`.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Most list members of a `tracestate` passed on (the W3C limit).
pub const MAX_TRACESTATE_MEMBERS: usize = 32;
/// Most bytes of a `tracestate` passed on: the length the W3C asks every vendor to propagate.
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// Whether `value` is a W3C `traceparent`: `version-trace_id-parent_id-flags` in lowercase hex
/// (2-32-16-2 digits), the ids not all zero, the version not `ff`; version `00` exactly 55
/// bytes, a later version at least that, followed by `-` when longer.
fn valid_traceparent(value: &[u8]) -> bool {
    let hex = |field: &[u8]| field.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    let nonzero = |field: &[u8]| field.iter().any(|b| *b != b'0');
    if value.len() < 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return false;
    }
    let (version, trace, parent, flags) =
        (&value[..2], &value[3..35], &value[36..52], &value[53..55]);
    let fields_ok = hex(version) && hex(trace) && hex(parent) && hex(flags);
    let length_ok = match version {
        b"00" => value.len() == 55,
        b"ff" => false,
        _ => value.len() == 55 || value[55] == b'-',
    };
    fields_ok && length_ok && nonzero(trace) && nonzero(parent)
}

/// `value` within the W3C bounds: whole list members from the start while they fit.
fn bounded_tracestate(value: &HeaderValue) -> Option<HeaderValue> {
    let text = value.to_str().ok()?;
    if text.len() <= MAX_TRACESTATE_BYTES
        && text.bytes().filter(|b| *b == b',').count() < MAX_TRACESTATE_MEMBERS
    {
        return Some(value.clone());
    }
    let mut kept = String::new();
    for member in
        text.split(',').map(str::trim).filter(|m| m.contains('=')).take(MAX_TRACESTATE_MEMBERS)
    {
        let extra = if kept.is_empty() { member.len() } else { member.len() + 1 };
        if kept.len() + extra > MAX_TRACESTATE_BYTES {
            break;
        }
        if !kept.is_empty() {
            kept.push(',');
        }
        kept.push_str(member);
    }
    (!kept.is_empty()).then(|| HeaderValue::from_str(&kept).ok()).flatten()
}

/// The W3C trace context headers to send to an engine (none by default).
#[derive(Clone, Debug, Default)]
pub struct TraceHeaders {
    traceparent: Option<HeaderValue>,
    tracestate: Option<HeaderValue>,
}

impl TraceHeaders {
    /// No headers: what an engine is sent when the client sent no trace context.
    pub const fn none() -> Self {
        Self { traceparent: None, tracestate: None }
    }

    /// The client's trace context headers, when valid as the W3C Trace Context says: a
    /// `traceparent` that is not valid is dropped, and `tracestate` with it (it means nothing
    /// without one); a `tracestate` of more than [`MAX_TRACESTATE_MEMBERS`] members or
    /// [`MAX_TRACESTATE_BYTES`] bytes loses members from its end until it fits (whole members,
    /// as the specification allows), and one with no valid member left is dropped.
    pub fn of(headers: &HeaderMap) -> Self {
        let Some(traceparent) =
            headers.get(&TRACEPARENT).filter(|v| valid_traceparent(v.as_bytes()))
        else {
            return Self::default();
        };
        let tracestate = headers.get(&TRACESTATE).and_then(bounded_tracestate);
        Self { traceparent: Some(traceparent.clone()), tracestate }
    }

    /// Calls `field` with each header to send.
    #[inline]
    pub fn each(&self, mut field: impl FnMut(&HeaderName, &HeaderValue)) {
        if let Some(value) = &self.traceparent {
            field(&TRACEPARENT, value);
        }
        if let Some(value) = &self.tracestate {
            field(&TRACESTATE, value);
        }
    }

    /// Adds the headers to an engine request.
    #[inline]
    pub fn apply(&self, headers: &mut HeaderMap) {
        if let Some(value) = &self.traceparent {
            headers.insert(TRACEPARENT, value.clone());
        }
        if let Some(value) = &self.tracestate {
            headers.insert(TRACESTATE, value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found attacking the router: a 20 KB `tracestate` and any `traceparent` reached engines.
    #[test]
    fn only_a_valid_context_within_its_bounds_goes_on() {
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let sent = |traceparent: &str, tracestate: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(TRACEPARENT, HeaderValue::from_str(traceparent).expect("value"));
            headers.insert(TRACESTATE, HeaderValue::from_str(tracestate).expect("value"));
            let trace = TraceHeaders::of(&headers);
            let text =
                |v: &Option<HeaderValue>| v.as_ref().map(|v| v.to_str().expect("text").to_owned());
            (text(&trace.traceparent), text(&trace.tracestate))
        };
        assert_eq!(sent(parent, "a=1"), (Some(parent.into()), Some("a=1".into())));
        for bad in [
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "not a traceparent",
        ] {
            assert_eq!(sent(bad, "a=1"), (None, None), "{bad}");
        }
        let future = format!("01{}-what-comes-next", &parent[2..]);
        assert_eq!(sent(&future, "a=1").0, Some(future.clone()), "a later version may grow");
        let huge = format!("a={}", "x".repeat(20_000));
        assert_eq!(sent(parent, &huge).1, None, "a member past the bound cannot be kept whole");
        let many: Vec<String> = (0..40).map(|i| format!("k{i}=v")).collect();
        let kept = sent(parent, &many.join(",")).1.expect("the first members");
        assert_eq!(kept.split(',').count(), MAX_TRACESTATE_MEMBERS);
        let long: Vec<String> = (0..20).map(|i| format!("k{i}={}", "v".repeat(40))).collect();
        let kept = sent(parent, &long.join(",")).1.expect("the first members");
        assert!(kept.len() <= MAX_TRACESTATE_BYTES && kept.starts_with("k0="), "{kept}");
    }
}
