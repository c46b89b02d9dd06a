//! The messages the picker sends Envoy: headers and body answers (with the pick as a header
//! and as `envoy.lb` dynamic metadata, and the route cache cleared), streamed body chunks of at
//! most [`MAX_CHUNK`] bytes, trailers answers and local replies ([`immediate`]).

use std::collections::BTreeMap;

use prost_types::value::Kind;
use prost_types::{Struct, Value};
use router_proto::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use router_proto::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use router_proto::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse, body_mutation,
    processing_response::Response,
};
use router_proto::envoy::r#type::v3::HttpStatus;

use super::endpoints::{DESTINATION_HEADER, DESTINATION_NAMESPACE, PREFILLER_HEADER};
use super::pick::Routed;
use crate::error::{ApiError, Chain};

/// Largest body chunk sent back in FULL_DUPLEX_STREAMED mode: under Envoy's 64 KiB
/// recommendation with room for the message around it.
pub(crate) const MAX_CHUNK: usize = 62_000;

/// Headers a client may send that only the picker may set: removed from every request.
pub(crate) const PICKER_OWNED_HEADERS: [&str; 2] = [DESTINATION_HEADER, PREFILLER_HEADER];

/// The pick as request header changes: the destination (and the prefill engine of a PD pair),
/// every client-sent picker header removed first.
pub(crate) fn routing_mutation(routed: &Routed) -> HeaderMutation {
    let mut set_headers = vec![overwrite(DESTINATION_HEADER, &routed.destination)];
    if let Some(prefiller) = &routed.prefiller {
        set_headers.push(overwrite(PREFILLER_HEADER, prefiller));
    }
    HeaderMutation { set_headers, remove_headers: removals() }
}

/// Only the client's picker headers removed.
pub(crate) fn strip_mutation() -> HeaderMutation {
    HeaderMutation { set_headers: Vec::new(), remove_headers: removals() }
}

fn removals() -> Vec<String> {
    PICKER_OWNED_HEADERS.iter().map(|h| (*h).to_owned()).collect()
}

/// A header set to `value`, replacing any the request had.
pub(crate) fn overwrite(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        }),
        append: None,
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        keep_empty_value: false,
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": destination}}`.
pub(crate) fn destination_metadata(destination: &str) -> Struct {
    let string = |s: &str| Value { kind: Some(Kind::StringValue(s.to_owned())) };
    let inner =
        Struct { fields: BTreeMap::from([(DESTINATION_HEADER.to_owned(), string(destination))]) };
    let outer = Value { kind: Some(Kind::StructValue(inner)) };
    Struct { fields: BTreeMap::from([(DESTINATION_NAMESPACE.to_owned(), outer)]) }
}

/// The request headers answer that carries the pick.
pub(crate) fn routed_headers(routed: &Routed) -> ProcessingResponse {
    let common = CommonResponse {
        header_mutation: Some(routing_mutation(routed)),
        clear_route_cache: true,
        ..CommonResponse::default()
    };
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse { response: Some(common) })),
        dynamic_metadata: Some(destination_metadata(&routed.destination)),
        ..ProcessingResponse::default()
    }
}

/// The request headers answer before the pick (BUFFERED: the body comes only after it).
pub(crate) fn unrouted_headers() -> ProcessingResponse {
    let common =
        CommonResponse { header_mutation: Some(strip_mutation()), ..CommonResponse::default() };
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse { response: Some(common) })),
        ..ProcessingResponse::default()
    }
}

/// The BUFFERED request body answer that carries the pick; `replaced` is the new body when
/// preparation changed it (router-owned fields removed), with its content length.
pub(crate) fn routed_buffered_body(routed: &Routed, replaced: Option<&[u8]>) -> ProcessingResponse {
    let mut mutation = routing_mutation(routed);
    let body_mutation = replaced.map(|body| {
        mutation.set_headers.push(overwrite("content-length", &body.len().to_string()));
        BodyMutation { mutation: Some(body_mutation::Mutation::Body(body.to_vec())) }
    });
    let common = CommonResponse {
        header_mutation: Some(mutation),
        body_mutation,
        clear_route_cache: true,
        ..CommonResponse::default()
    };
    ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse { response: Some(common) })),
        dynamic_metadata: Some(destination_metadata(&routed.destination)),
        ..ProcessingResponse::default()
    }
}

/// Which side of the exchange a message answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The client's request.
    Request,
    /// The engine's response.
    Response,
}

/// A body answer that changes nothing (or, with `mutation`, replaces or clears the chunk).
pub(crate) fn body_continue(side: Side, mutation: Option<BodyMutation>) -> ProcessingResponse {
    let body = BodyResponse {
        response: Some(CommonResponse { body_mutation: mutation, ..CommonResponse::default() }),
    };
    let response = match side {
        Side::Request => Response::RequestBody(body),
        Side::Response => Response::ResponseBody(body),
    };
    ProcessingResponse { response: Some(response), ..ProcessingResponse::default() }
}

/// `body` as FULL_DUPLEX_STREAMED answers of at most [`MAX_CHUNK`] bytes, `end_of_stream` on
/// the last when `ends`. An empty body that ends is one empty chunk; one that does not end is
/// no message at all.
pub(crate) fn streamed_chunks(side: Side, body: &[u8], ends: bool) -> Vec<ProcessingResponse> {
    let chunk = |bytes: &[u8], end_of_stream| {
        let streamed = StreamedBodyResponse { body: bytes.to_vec(), end_of_stream };
        body_continue(
            side,
            Some(BodyMutation {
                mutation: Some(body_mutation::Mutation::StreamedResponse(streamed)),
            }),
        )
    };
    if body.is_empty() {
        return if ends { vec![chunk(&[], true)] } else { Vec::new() };
    }
    let count = body.len().div_ceil(MAX_CHUNK);
    body.chunks(MAX_CHUNK)
        .enumerate()
        .map(|(i, bytes)| chunk(bytes, ends && i + 1 == count))
        .collect()
}

/// The response headers answer: the engine's headers pass, with `x-router-engine` and
/// `x-router-bucket` added as the HTTP front adds them.
pub(crate) fn response_headers(routed: Option<&Routed>) -> ProcessingResponse {
    let header_mutation = routed.map(|routed| HeaderMutation {
        set_headers: vec![
            overwrite("x-router-engine", routed.engine.as_str()),
            overwrite("x-router-bucket", routed.labels.bucket()),
        ],
        remove_headers: Vec::new(),
    });
    let common = CommonResponse { header_mutation, ..CommonResponse::default() };
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse { response: Some(common) })),
        ..ProcessingResponse::default()
    }
}

/// A trailers answer that changes nothing.
pub(crate) fn trailers(side: Side) -> ProcessingResponse {
    let trailers = TrailersResponse::default();
    let response = match side {
        Side::Request => Response::RequestTrailers(trailers),
        Side::Response => Response::ResponseTrailers(trailers),
    };
    ProcessingResponse { response: Some(response), ..ProcessingResponse::default() }
}

/// A local reply for `err`: its picker status ([`ApiError::picker_status`]) and OpenAI-shaped
/// JSON body, `retry-after: 1` on 429 and 503, and the error code in Envoy's response details.
pub(crate) fn immediate(err: &ApiError) -> (u16, ProcessingResponse) {
    let status = err.picker_status().as_u16();
    let mut set_headers = vec![overwrite("content-type", "application/json")];
    if matches!(status, 429 | 503) {
        set_headers.push(overwrite("retry-after", "1"));
    }
    let body = serde_json::to_vec(&err.body()).expect("a JSON value serialises");
    let reply = ImmediateResponse {
        status: Some(HttpStatus { code: i32::from(status) }),
        headers: Some(HeaderMutation { set_headers, remove_headers: Vec::new() }),
        body,
        grpc_status: None,
        details: format!("router_epp_{}", err.kind().1),
    };
    tracing::debug!(status, error = %Chain(err), "answering locally");
    (
        status,
        ProcessingResponse {
            response: Some(Response::ImmediateResponse(reply)),
            ..ProcessingResponse::default()
        },
    )
}
