//! The encoder against the engines' own payloads (hex copied from `docs/design/wire/golden.txt`),
//! and a decode-back check of a realistic batch with rmpv.

use rmpv::Value;

use super::super::{KvEvent, KvFormat};
use super::encode_batch;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

/// `[vllm/sglang] BlockStored`: hashes [1, -1 or -2], parent None, tokens 1..=4, block size 2.
fn golden_stored(second: u64) -> KvEvent {
    KvEvent::Stored { hashes: vec![1, second], parent: None, token_ids: vec![1, 2, 3, 4] }
}

#[test]
fn matches_golden_payloads_byte_for_byte() {
    let minus_two = (-2i64) as u64;
    let cases: [(KvFormat, KvEvent, Option<u32>, &str); 12] = [
        (
            KvFormat::Vllm,
            golden_stored(u64::MAX),
            Some(0),
            "93cb3ff000000000000091de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f686173\
             6865739201cfffffffffffffffffb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964\
             739401020304aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72\
             615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f6964780000",
        ),
        (
            KvFormat::Vllm,
            KvEvent::Removed { hashes: vec![u64::MAX] },
            Some(0),
            "93cb3ff00000000000009183a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573\
             91cfffffffffffffffffa66d656469756da347505500",
        ),
        (
            KvFormat::Vllm,
            KvEvent::Cleared,
            None,
            "93cb3ff00000000000009181a474797065b0416c6c426c6f636b73436c6561726564c0",
        ),
        (
            KvFormat::VllmLegacy,
            golden_stored(u64::MAX),
            Some(0),
            "93cb3ff0000000000000919cab426c6f636b53746f7265649201cfffffffffffffffffc0940102030402c0\
             a3475055c092c0c000c0c000",
        ),
        (
            KvFormat::VllmLegacy,
            KvEvent::Removed { hashes: vec![u64::MAX] },
            Some(0),
            "93cb3ff00000000000009194ac426c6f636b52656d6f76656491cfffffffffffffffffa3475055c000",
        ),
        (
            KvFormat::VllmLegacy,
            KvEvent::Cleared,
            None,
            "93cb3ff00000000000009191b0416c6c426c6f636b73436c6561726564c0",
        ),
        (
            KvFormat::Sglang,
            golden_stored(minus_two),
            Some(0),
            "93cb3ff00000000000009187a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392\
             01feb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b\
             5f73697a6502a76c6f72615f6964c0a66d656469756da347505500",
        ),
        (
            KvFormat::Sglang,
            KvEvent::Removed { hashes: vec![minus_two] },
            Some(0),
            "93cb3ff00000000000009183a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573\
             91fea66d656469756da347505500",
        ),
        (
            KvFormat::Sglang,
            KvEvent::Cleared,
            None,
            "93cb3ff00000000000009181a474797065b0416c6c426c6f636b73436c6561726564c0",
        ),
        (
            KvFormat::SglangLegacy,
            golden_stored(minus_two),
            Some(0),
            "93cb3ff00000000000009197ab426c6f636b53746f7265649201fec0940102030402c0a347505500",
        ),
        (
            KvFormat::SglangLegacy,
            KvEvent::Removed { hashes: vec![minus_two] },
            Some(0),
            "93cb3ff00000000000009193ac426c6f636b52656d6f76656491fea347505500",
        ),
        (
            KvFormat::SglangLegacy,
            KvEvent::Cleared,
            None,
            "93cb3ff00000000000009191b0416c6c426c6f636b73436c6561726564c0",
        ),
    ];
    for (format, event, rank, expected) in cases {
        let got = encode_batch(format, 1.0, std::slice::from_ref(&event), 2, rank);
        assert_eq!(got, hex(expected), "{format} {event:?}");
    }
}

fn field<'a>(map: &'a Value, key: &str) -> &'a Value {
    map.as_map()
        .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no field {key} in {map}"))
}

#[test]
fn realistic_batch_decodes_to_the_golden_shapes() {
    let parent = 0x8000_0000_0000_0001u64;
    let tokens: Vec<u32> = (0..32).map(|t| t * 1000).collect();
    let events = [
        KvEvent::Removed { hashes: vec![7, u64::MAX - 3] },
        KvEvent::Stored {
            hashes: vec![11, 0xdead_beef_cafe],
            parent: Some(parent),
            token_ids: tokens.clone(),
        },
    ];
    for format in KvFormat::ALL {
        let bytes = encode_batch(format, 1_700_000_000.25, &events, 16, Some(0));
        let batch = rmpv::decode::read_value(&mut bytes.as_slice()).expect("valid msgpack");
        let batch = batch.as_array().expect("batch is an array");
        assert_eq!(batch.len(), 3);
        assert_eq!(batch[0].as_f64(), Some(1_700_000_000.25));
        assert_eq!(batch[2].as_u64(), Some(0));
        let decoded = batch[1].as_array().expect("events");
        assert_eq!(decoded.len(), 2);
        let signed = matches!(format, KvFormat::Sglang | KvFormat::SglangLegacy);
        let hash = |v: &Value| if signed { v.as_i64().map(|h| h as u64) } else { v.as_u64() };
        let (removed, stored) = (&decoded[0], &decoded[1]);
        let (removed_hashes, stored_hashes, stored_parent, stored_tokens, size) = match format {
            KvFormat::Vllm | KvFormat::Sglang => {
                assert_eq!(field(removed, "type").as_str(), Some("BlockRemoved"));
                assert_eq!(field(stored, "type").as_str(), Some("BlockStored"));
                assert_eq!(field(stored, "medium").as_str(), Some("GPU"));
                (
                    field(removed, "block_hashes"),
                    field(stored, "block_hashes"),
                    field(stored, "parent_block_hash"),
                    field(stored, "token_ids"),
                    field(stored, "block_size"),
                )
            }
            KvFormat::VllmLegacy | KvFormat::SglangLegacy => {
                let removed = removed.as_array().expect("array event");
                let stored = stored.as_array().expect("array event");
                assert_eq!(removed[0].as_str(), Some("BlockRemoved"));
                assert_eq!(stored[0].as_str(), Some("BlockStored"));
                assert_eq!(stored[6].as_str(), Some("GPU"));
                let arity = if format == KvFormat::VllmLegacy { 12 } else { 7 };
                assert_eq!(stored.len(), arity);
                (&removed[1], &stored[1], &stored[2], &stored[3], &stored[4])
            }
        };
        let hashes = |v: &Value| {
            v.as_array().expect("hashes").iter().map(|h| hash(h).expect("int")).collect::<Vec<_>>()
        };
        assert_eq!(hashes(removed_hashes), vec![7, u64::MAX - 3], "{format}");
        assert_eq!(hashes(stored_hashes), vec![11, 0xdead_beef_cafe], "{format}");
        assert_eq!(hash(stored_parent), Some(parent), "{format}");
        let got: Vec<u64> = stored_tokens
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_u64().expect("u64"))
            .collect();
        assert_eq!(got, tokens.iter().map(|t| u64::from(*t)).collect::<Vec<_>>());
        assert_eq!(size.as_u64(), Some(16));
    }
}

#[test]
fn formats_parse_from_their_flag_spelling() {
    for format in KvFormat::ALL {
        assert_eq!(format.as_str().parse::<KvFormat>().expect("parses"), format);
    }
    assert!("vllm_legacy".parse::<KvFormat>().is_err());
}
