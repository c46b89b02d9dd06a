//! The msgpack event decoder: the golden payloads, map and array forms, hash and token-pair
//! normalisation, malformed and absurd input as errors (never panics), and fuzz-like proptests.

use proptest::prelude::*;
use rmpv::Value;

use super::*;
use crate::DecodeError;

fn enc(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).expect("encode to a vec");
    out
}

fn s(text: &str) -> Value {
    Value::from(text)
}

fn ints(values: &[u64]) -> Value {
    Value::Array(values.iter().map(|v| Value::from(*v)).collect())
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (s(k), v)).collect())
}

fn batch(events: Vec<Value>, rank: Value) -> Value {
    Value::Array(vec![Value::F64(1.5), Value::Array(events), rank])
}

fn decode(value: &Value) -> Result<EventBatch, DecodeError> {
    decode_batch(&enc(value), &DecodeLimits::default())
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digit pair"))
        .collect()
}

fn stored(hashes: Vec<u64>, tokens: Vec<u32>) -> BlockStored {
    BlockStored {
        block_hashes: hashes,
        token_ids: tokens,
        block_size: Some(2),
        medium: Some(MediumField::Known(Medium::Gpu)),
        ..BlockStored::default()
    }
}

fn removed(hashes: Vec<u64>) -> BlockRemoved {
    BlockRemoved {
        block_hashes: hashes,
        medium: Some(MediumField::Known(Medium::Gpu)),
        ..BlockRemoved::default()
    }
}

fn one(event: Event, dp_rank: Option<i64>) -> EventBatch {
    EventBatch { ts: 1.0, events: vec![event], dp_rank }
}

/// The decoded form of every payload in testdata/golden.txt, by its label.
fn golden_expectation(label: &str) -> Option<EventBatch> {
    let bytes_hash = 0x1819_1a1b_1c1d_1e1f;
    let minus_two = u64::MAX - 1;
    Some(match label {
        "[vllm-0.33.0] BlockStored" | "[vllm-0.23.0] BlockStored" => one(
            Event::Stored(BlockStored {
                extra_keys: Some(vec![None, None]),
                group_idx: Some(0),
                ..stored(vec![1, u64::MAX], vec![1, 2, 3, 4])
            }),
            Some(0),
        ),
        "[vllm-0.33.0] BlockStored bytes-hash" | "[vllm-0.23.0] BlockStored bytes-hash" => {
            one(Event::Stored(stored(vec![bytes_hash], vec![1, 2])), Some(0))
        }
        "[vllm-0.33.0] BlockRemoved" | "[vllm-0.23.0] BlockRemoved" => {
            one(Event::Removed(removed(vec![u64::MAX])), Some(0))
        }
        "[sglang-0.5.23] BlockStored" | "[sglang-0.5.15] BlockStored" => {
            one(Event::Stored(stored(vec![1, minus_two], vec![1, 2, 3, 4])), Some(0))
        }
        "[sglang-0.5.23] BlockRemoved" | "[sglang-0.5.15] BlockRemoved" => {
            one(Event::Removed(removed(vec![minus_two])), Some(0))
        }
        "[vllm-0.33.0] AllBlocksCleared (no dp rank -> omitted)"
        | "[vllm-0.23.0] AllBlocksCleared (no dp rank -> omitted)"
        | "[sglang-0.5.23] AllBlocksCleared (attn_dp_rank None)"
        | "[sglang-0.5.15] AllBlocksCleared (attn_dp_rank None)" => one(Event::AllCleared, None),
        _ => return None,
    })
}

#[test]
fn every_golden_payload_decodes_to_its_expected_shape() {
    let text = include_str!("../../testdata/golden.txt");
    let mut label = None;
    let mut checked = 0;
    for line in text.lines() {
        if line.starts_with('[') {
            label = Some(line.trim());
        } else if let Some(hex_text) = line.trim().strip_prefix("hex  = ") {
            let label = label.take().expect("a label precedes every hex line");
            let expected = golden_expectation(label)
                .unwrap_or_else(|| panic!("no expectation for golden entry {label}"));
            let decoded = decode_batch(&hex(hex_text), &DecodeLimits::default())
                .unwrap_or_else(|e| panic!("{label}: {e}"));
            assert_eq!(decoded, expected, "{label}");
            checked += 1;
        }
    }
    assert_eq!(checked, 14, "every golden entry is checked");
}

#[test]
fn map_and_array_forms_decode_alike_with_every_field() {
    let as_map = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", ints(&[7, 8])),
        ("parent_block_hash", Value::from(6u64)),
        ("token_ids", ints(&[1, 2, 3, 4])),
        ("block_size", Value::from(2)),
        ("lora_id", Value::from(3)),
        ("medium", s("CPU_PINNED")),
        ("lora_name", s("ad")),
        ("extra_keys", Value::Array(vec![Value::Nil, Value::Array(vec![s("ad")])])),
        ("group_idx", Value::from(1)),
        ("kv_cache_spec_kind", s("mla_attention")),
        ("kv_cache_spec_sliding_window", Value::from(128)),
        ("locality", s("REMOTE")),
        ("ownership", s("lmcache")),
        ("session_id", s("sess")),
    ]);
    let as_array = Value::Array(vec![
        s("BlockStored"),
        ints(&[7, 8]),
        Value::from(6u64),
        ints(&[1, 2, 3, 4]),
        Value::from(2),
        Value::from(3),
        s("CPU_PINNED"),
        s("ad"),
        Value::Array(vec![Value::Nil, Value::Array(vec![s("ad")])]),
        Value::from(1),
        s("mla_attention"),
        Value::from(128),
        s("REMOTE"),
        s("lmcache"),
        s("sess"),
        s("a trailing element nobody knows"),
    ]);
    let from_map = decode(&batch(vec![as_map], Value::from(3))).expect("map form");
    let from_array = decode(&batch(vec![as_array], Value::from(3))).expect("array form");
    assert_eq!(from_map, from_array);
    let Event::Stored(event) = &from_map.events[0] else { panic!("stored") };
    assert_eq!(event.parent_block_hash, Some(6));
    assert_eq!(event.lora_id, Some(3));
    assert_eq!(event.medium, Some(MediumField::Known(Medium::CpuPinned)));
    assert_eq!(event.extra_keys, Some(vec![None, Some(vec![ExtraKey::Str("ad".into())])]));
    assert_eq!(event.kv_cache_spec_kind, Some(SpecKind::Full));
    assert_eq!(event.kv_cache_spec_sliding_window, Some(128));
    assert_eq!(event.locality, Some(Locality::Remote));
    assert_eq!(event.ownership.as_deref(), Some("lmcache"));
    assert_eq!(event.session_id.as_deref(), Some("sess"));
    assert_eq!(from_map.dp_rank, Some(3));
}

#[test]
fn newer_map_keys_are_decoded_and_unknown_keys_ignored() {
    let event = map(vec![
        ("type", s("BlockStored")),
        ("brand_new_key", Value::Map(vec![(s("x"), Value::Array(vec![Value::Nil]))])),
        ("block_hashes", ints(&[1])),
        ("parent_block_hash", Value::Nil),
        ("token_ids", ints(&[5, 6])),
        ("block_size", Value::from(2)),
        ("lookahead_token_ids", ints(&[9])),
        ("cache_salt", s("tenant")),
        ("kv_cache_spec_kind", s("sliding_window")),
        ("locality", s("LOCAL")),
        ("medium", s("TAPE")),
    ]);
    let decoded = decode(&batch(vec![event], Value::Nil)).expect("decodes");
    let Event::Stored(event) = &decoded.events[0] else { panic!("stored") };
    assert_eq!(event.lookahead_token_ids, Some(vec![9]));
    assert_eq!(event.cache_salt.as_deref(), Some("tenant"));
    assert_eq!(event.kv_cache_spec_kind, Some(SpecKind::Other));
    assert_eq!(event.locality, Some(Locality::Local));
    assert_eq!(event.medium, Some(MediumField::Unknown));
    assert_eq!(decoded.dp_rank, None);
}

#[test]
fn hashes_normalise_from_u64_i64_and_bytes() {
    let event = map(vec![
        ("type", s("BlockRemoved")),
        (
            "block_hashes",
            Value::Array(vec![
                Value::from(u64::MAX),
                Value::from(-1i64),
                Value::from(-2i64),
                Value::Binary((0u8..16).collect()),
                Value::Binary(vec![1, 2]),
                Value::Binary(vec![]),
            ]),
        ),
    ]);
    let decoded = decode(&batch(vec![event], Value::from(0))).expect("decodes");
    let Event::Removed(event) = &decoded.events[0] else { panic!("removed") };
    assert_eq!(
        event.block_hashes,
        vec![u64::MAX, u64::MAX, u64::MAX - 1, 0x0809_0a0b_0c0d_0e0f, 0x0102, 0]
    );
    assert_eq!(event.medium, None, "a missing medium stays None (GPU when applied)");
}

#[test]
fn token_pairs_reduce_to_their_first_element() {
    let pairs = Value::Array(vec![
        Value::Array(vec![Value::from(10), Value::from(11)]),
        Value::Array(vec![Value::from(11), Value::from(12)]),
    ]);
    let event = Value::Array(vec![
        s("BlockStored"),
        ints(&[1]),
        Value::Nil,
        pairs,
        Value::from(2),
        Value::Nil,
        Value::Nil,
    ]);
    let decoded = decode(&batch(vec![event], Value::from(0))).expect("decodes");
    let Event::Stored(event) = &decoded.events[0] else { panic!("stored") };
    assert_eq!(event.token_ids, vec![10, 11]);
    assert!(event.token_pairs);
    let nested = Value::Array(vec![Value::Array(vec![Value::Array(vec![Value::from(1)])])]);
    let bad = Value::Array(vec![s("BlockStored"), ints(&[1]), Value::Nil, nested]);
    assert!(decode(&batch(vec![bad], Value::Nil)).is_err(), "pairs nest one level only");
}

#[test]
fn batches_of_two_or_more_elements_and_odd_events_are_accepted() {
    let two =
        Value::Array(vec![Value::from(3), Value::Array(vec![s("AllBlocksCleared").into_array()])]);
    let decoded = decode(&two).expect("a two-element batch");
    assert_eq!(decoded.events, vec![Event::AllCleared]);
    assert_eq!(decoded.ts, 3.0);
    let four = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(vec![
            map(vec![("type", s("SomethingNew")), ("x", Value::from(1))]),
            Value::Array(vec![s("AnotherNew"), Value::from(1)]),
            map(vec![("type", s("BlockStored")), ("token_ids", ints(&[]))]),
            map(vec![("type", s("BlockRemoved"))]),
            map(vec![("block_hashes", ints(&[1]))]),
        ]),
        Value::from(1),
        s("extra"),
    ]);
    let decoded = decode(&four).expect("a four-element batch");
    assert_eq!(
        decoded.events,
        vec![
            Event::Unknown,
            Event::Unknown,
            Event::Invalid { event: "BlockStored", missing: "block_hashes" },
            Event::Invalid { event: "BlockRemoved", missing: "block_hashes" },
            Event::Unknown,
        ]
    );
}

trait IntoArray {
    fn into_array(self) -> Value;
}

impl IntoArray for Value {
    fn into_array(self) -> Value {
        Value::Array(vec![self])
    }
}

#[test]
fn malformed_input_is_an_error_never_a_panic() {
    let limits = DecodeLimits::default();
    let good = enc(&batch(vec![s("AllBlocksCleared").into_array()], Value::from(0)));
    assert!(matches!(decode_batch(&good[..good.len() - 1], &limits), Err(DecodeError::Msgpack(_))));
    let mut trailing = good;
    trailing.push(0xc0);
    assert!(matches!(
        decode_batch(&trailing, &limits),
        Err(DecodeError::TrailingBytes { extra: 1 })
    ));
    assert!(matches!(decode(&Value::Array(vec![Value::F64(1.0)])), Err(DecodeError::ShortBatch)));
    assert!(decode(&map(vec![("ts", Value::from(1))])).is_err(), "a map is not a batch");
    assert!(decode_batch(&[], &limits).is_err());
    assert!(decode_batch(&[0xc1], &limits).is_err(), "reserved marker");
    let float_hash = map(vec![
        ("type", s("BlockRemoved")),
        ("block_hashes", Value::Array(vec![Value::F64(1.0)])),
    ]);
    assert!(decode(&batch(vec![float_hash], Value::Nil)).is_err());
    let big_token = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", ints(&[1])),
        ("token_ids", ints(&[u64::from(u32::MAX) + 1])),
    ]);
    assert!(decode(&batch(vec![big_token], Value::Nil)).is_err());
}

#[test]
fn absurd_declared_lengths_fail_on_the_limit_before_allocating() {
    let limits = DecodeLimits::default();
    // [1.0, array32(0xffffffff) ...]: four billion events announced, none present.
    let mut payload = vec![0x93, 0xcb];
    payload.extend_from_slice(&1.0f64.to_be_bytes());
    payload.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
    let err = decode_batch(&payload, &limits).expect_err("too many events");
    assert!(
        matches!(err, DecodeError::TooLarge { what: "events", len: 4_294_967_295, .. }),
        "{err}"
    );
    // A token array announcing 2^32-1 elements inside a valid event.
    let mut payload = vec![0x93, 0x00, 0x91, 0x84];
    payload.extend_from_slice(&enc(&s("type")));
    payload.extend_from_slice(&enc(&s("BlockStored")));
    payload.extend_from_slice(&enc(&s("block_hashes")));
    payload.extend_from_slice(&enc(&ints(&[1])));
    payload.extend_from_slice(&enc(&s("token_ids")));
    payload.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
    let err = decode_batch(&payload, &limits).expect_err("too many tokens");
    assert!(matches!(err, DecodeError::TooLarge { what: "token_ids", .. }), "{err}");
    // A 4 GiB string length prefix.
    let mut payload = vec![0x93, 0x00, 0x91, 0x82];
    payload.extend_from_slice(&enc(&s("type")));
    payload.extend_from_slice(&enc(&s("BlockStored")));
    payload.extend_from_slice(&enc(&s("lora_name")));
    payload.extend_from_slice(&[0xdb, 0xff, 0xff, 0xff, 0xff, b'x']);
    assert!(decode_batch(&payload, &limits).is_err());
    let tight = DecodeLimits { max_payload_bytes: 8, ..DecodeLimits::default() };
    assert!(matches!(
        decode_batch(&[0x90; 9], &tight),
        Err(DecodeError::PayloadTooLarge { size: 9, limit: 8 })
    ));
    let few = DecodeLimits { max_blocks_per_event: 2, ..DecodeLimits::default() };
    let three = map(vec![("type", s("BlockRemoved")), ("block_hashes", ints(&[1, 2, 3]))]);
    let err = decode_batch(&enc(&batch(vec![three], Value::Nil)), &few).expect_err("limit");
    assert!(matches!(err, DecodeError::TooLarge { what: "block_hashes", len: 3, limit: 2 }));
}

#[test]
fn deep_nesting_is_cut_off_at_the_depth_limit() {
    let mut deep = Value::Nil;
    for _ in 0..10_000 {
        deep = Value::Array(vec![deep]);
    }
    let event = map(vec![("type", s("AllBlocksCleared")), ("junk", deep)]);
    // Encoded by hand so the encoder does not recurse 10k deep either: 10k fixarray(1) markers.
    let mut payload = vec![0x93, 0x00, 0x91, 0x82];
    payload.extend_from_slice(&enc(&s("type")));
    payload.extend_from_slice(&enc(&s("AllBlocksCleared")));
    payload.extend_from_slice(&enc(&s("junk")));
    payload.extend(std::iter::repeat_n(0x91, 100_000));
    payload.push(0xc0);
    payload.push(0xc0);
    assert!(decode_batch(&payload, &DecodeLimits::default()).is_err());
    drop(event);
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[A-Za-z_]{0,12}".prop_map(|t| Value::from(t.as_str())),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Binary),
        Just(s("BlockStored")),
        Just(s("BlockRemoved")),
        Just(s("block_hashes")),
        Just(s("token_ids")),
        Just(s("type")),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::vec((inner.clone(), inner), 0..6).prop_map(Value::Map),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_batch(&bytes, &DecodeLimits::default());
    }

    #[test]
    fn mutated_golden_payloads_never_panic(
        entry in 0usize..14,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let text = include_str!("../../testdata/golden.txt");
        let payloads: Vec<Vec<u8>> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("hex  = ").map(hex))
            .collect();
        let mut bytes = payloads[entry].clone();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let len = cut.index(bytes.len() + 1);
        let _ = decode_batch(&bytes[..len], &DecodeLimits::default());
    }

    #[test]
    fn arbitrary_msgpack_shapes_never_panic(events in proptest::collection::vec(arb_value(), 0..6)) {
        let _ = decode(&batch(events, Value::from(0)));
    }
}
