//! msgpack decoding of event batches with serde visitors (no intermediate value tree).
//!
//! Every visitor that can grow a collection checks the declared length against
//! [`DecodeLimits`] first and pre-allocates at most a small fixed amount, so a frame that
//! announces four billion elements costs nothing before it fails at the end of its input.

use std::cell::Cell;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{
    BlockRemoved, BlockStored, DecodeLimits, Event, EventBatch, ExtraKey, Locality, MediumField,
    SpecKind, normalise_bytes_hash, normalise_signed_hash,
};
use crate::{DecodeError, Medium};

/// Largest capacity reserved up front for any collection; beyond it vectors grow as elements
/// actually arrive.
const PREALLOC: usize = 1024;

/// Decodes one msgpack `EventBatch` payload.
///
/// Never panics; every malformed, truncated or oversized input is an error.
pub fn decode_batch(payload: &[u8], limits: &DecodeLimits) -> Result<EventBatch, DecodeError> {
    if payload.len() > limits.max_payload_bytes {
        return Err(DecodeError::PayloadTooLarge {
            size: payload.len(),
            limit: limits.max_payload_bytes,
        });
    }
    let ctx = Ctx { limits, error: Cell::new(None) };
    let mut rest = payload;
    let mut de = rmp_serde::Deserializer::new(&mut rest);
    de.set_max_depth(limits.max_depth);
    let result = BatchSeed(&ctx).deserialize(&mut de);
    drop(de);
    match result {
        Ok(_) if !rest.is_empty() => Err(DecodeError::TrailingBytes { extra: rest.len() }),
        Ok(batch) => Ok(batch),
        Err(err) => Err(ctx.error.take().unwrap_or(DecodeError::Msgpack(err))),
    }
}

/// Decoding context: the limits, and the typed error behind a serde `custom` error.
struct Ctx<'l> {
    limits: &'l DecodeLimits,
    error: Cell<Option<DecodeError>>,
}

impl Ctx<'_> {
    fn fail<E: de::Error>(&self, error: DecodeError) -> E {
        self.error.set(Some(error));
        E::custom("event batch rejected")
    }

    fn check_len<E: de::Error>(
        &self,
        what: &'static str,
        len: usize,
        limit: usize,
    ) -> Result<(), E> {
        if len > limit {
            Err(self.fail(DecodeError::TooLarge { what, len, limit }))
        } else {
            Ok(())
        }
    }
}

fn drain<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

struct BatchSeed<'c, 'l>(&'c Ctx<'l>);

impl<'de> DeserializeSeed<'de> for BatchSeed<'_, '_> {
    type Value = EventBatch;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<EventBatch, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BatchSeed<'_, '_> {
    type Value = EventBatch;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an event batch array [ts, events, dp_rank]")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<EventBatch, A::Error> {
        let ctx = self.0;
        let ts = seq.next_element_seed(TimestampSeed)?;
        let events = seq.next_element_seed(EventsSeed(ctx))?;
        let (Some(ts), Some(events)) = (ts, events) else {
            return Err(ctx.fail(DecodeError::ShortBatch));
        };
        let dp_rank = seq.next_element_seed(OptIntSeed)?.flatten();
        drain(&mut seq)?;
        Ok(EventBatch { ts, events, dp_rank })
    }
}

struct TimestampSeed;

impl<'de> DeserializeSeed<'de> for TimestampSeed {
    type Value = f64;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<f64, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for TimestampSeed {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a timestamp")
    }

    fn visit_f64<E>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }

    #[expect(clippy::cast_precision_loss, reason = "timestamps are informational")]
    fn visit_u64<E>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }

    #[expect(clippy::cast_precision_loss, reason = "timestamps are informational")]
    fn visit_i64<E>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_unit<E>(self) -> Result<f64, E> {
        Ok(0.0)
    }
}

/// `nil` or an integer.
struct OptIntSeed;

impl<'de> DeserializeSeed<'de> for OptIntSeed {
    type Value = Option<i64>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<i64>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for OptIntSeed {
    type Value = Option<i64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer or nil")
    }

    fn visit_unit<E>(self) -> Result<Option<i64>, E> {
        Ok(None)
    }

    fn visit_i64<E>(self, v: i64) -> Result<Option<i64>, E> {
        Ok(Some(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<i64>, E> {
        i64::try_from(v)
            .map(Some)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &"an i64"))
    }
}

/// `nil` or a string, bounded in length.
struct OptStringSeed<'c, 'l>(&'c Ctx<'l>);

impl<'de> DeserializeSeed<'de> for OptStringSeed<'_, '_> {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for OptStringSeed<'_, '_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string or nil")
    }

    fn visit_unit<E>(self) -> Result<Option<String>, E> {
        Ok(None)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<String>, E> {
        self.0.check_len("string", v.len(), self.0.limits.max_string_bytes)?;
        Ok(Some(v.to_owned()))
    }
}

/// A string field read into a small enum without allocating; `nil` is `None`.
struct NameSeed<T>(fn(&str) -> T);

impl<'de, T> DeserializeSeed<'de> for NameSeed<T> {
    type Value = Option<T>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<T> Visitor<'_> for NameSeed<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a name or nil")
    }

    fn visit_unit<E>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_str<E>(self, v: &str) -> Result<Option<T>, E> {
        Ok(Some((self.0)(v)))
    }
}

fn medium_of(name: &str) -> MediumField {
    Medium::parse(name).map_or(MediumField::Unknown, MediumField::Known)
}

fn spec_kind_of(name: &str) -> SpecKind {
    match name {
        "full_attention" | "mla_attention" | "sink_full_attention" => SpecKind::Full,
        _ => SpecKind::Other,
    }
}

fn locality_of(name: &str) -> Locality {
    if name.eq_ignore_ascii_case("local") {
        Locality::Local
    } else if name.eq_ignore_ascii_case("remote") {
        Locality::Remote
    } else {
        Locality::Other
    }
}

/// A block hash: u64, i64 (two's complement) or bytes (last 8, big-endian).
struct HashSeed;

impl<'de> DeserializeSeed<'de> for HashSeed {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for HashSeed {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a block hash (integer or bytes)")
    }

    fn visit_u64<E>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E>(self, v: i64) -> Result<u64, E> {
        Ok(normalise_signed_hash(v))
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<u64, E> {
        Ok(normalise_bytes_hash(v))
    }
}

/// `nil` or a block hash.
struct OptHashSeed;

impl<'de> DeserializeSeed<'de> for OptHashSeed {
    type Value = Option<u64>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(self)
    }
}

impl Visitor<'_> for OptHashSeed {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a block hash or nil")
    }

    fn visit_unit<E>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, v: u64) -> Result<Option<u64>, E> {
        Ok(Some(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Option<u64>, E> {
        Ok(Some(normalise_signed_hash(v)))
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<Option<u64>, E> {
        Ok(Some(normalise_bytes_hash(v)))
    }
}

struct HashListSeed<'c, 'l>(&'c Ctx<'l>);

impl<'de> DeserializeSeed<'de> for HashListSeed<'_, '_> {
    type Value = Vec<u64>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for HashListSeed<'_, '_> {
    type Value = Vec<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of block hashes")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
        let limit = self.0.limits.max_blocks_per_event;
        let hint = seq.size_hint().unwrap_or(0);
        self.0.check_len("block_hashes", hint, limit)?;
        let mut out = Vec::with_capacity(hint.min(PREALLOC));
        while let Some(hash) = seq.next_element_seed(HashSeed)? {
            self.0.check_len("block_hashes", out.len() + 1, limit)?;
            out.push(hash);
        }
        Ok(out)
    }
}

/// One token id, or the first element of a token pair. The flag says whether it was a pair.
struct TokenSeed;

impl<'de> DeserializeSeed<'de> for TokenSeed {
    type Value = (u32, bool);

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(u32, bool), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TokenSeed {
    type Value = (u32, bool);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a token id or a token pair")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(u32, bool), E> {
        u32::try_from(v)
            .map(|t| (t, false))
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &"a u32 token id"))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(u32, bool), E> {
        u32::try_from(v)
            .map(|t| (t, false))
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &"a u32 token id"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(u32, bool), A::Error> {
        let Some((first, nested)) = seq.next_element_seed(TokenSeed)? else {
            return Err(de::Error::invalid_length(0, &"a non-empty token pair"));
        };
        if nested {
            return Err(de::Error::custom("token pairs nest at most one level"));
        }
        drain(&mut seq)?;
        Ok((first, true))
    }
}

/// Token ids, plain or as pairs.
struct TokenListSeed<'c, 'l>(&'c Ctx<'l>);

impl<'de> DeserializeSeed<'de> for TokenListSeed<'_, '_> {
    type Value = (Vec<u32>, bool);

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(Vec<u32>, bool), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TokenListSeed<'_, '_> {
    type Value = (Vec<u32>, bool);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of token ids")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(Vec<u32>, bool), A::Error> {
        let limit = self.0.limits.max_tokens_per_event;
        let hint = seq.size_hint().unwrap_or(0);
        self.0.check_len("token_ids", hint, limit)?;
        let mut out = Vec::with_capacity(hint.min(PREALLOC * 16));
        let mut pairs = false;
        while let Some((token, pair)) = seq.next_element_seed(TokenSeed)? {
            self.0.check_len("token_ids", out.len() + 1, limit)?;
            pairs |= pair;
            out.push(token);
        }
        Ok((out, pairs))
    }
}

/// `nil` or token ids (for optional token fields).
struct OptTokenListSeed<'c, 'l>(&'c Ctx<'l>);

impl<'de> DeserializeSeed<'de> for OptTokenListSeed<'_, '_> {
    type Value = Option<Vec<u32>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<Vec<u32>>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for OptTokenListSeed<'_, '_> {
    type Value = Option<Vec<u32>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of token ids or nil")
    }

    fn visit_unit<E>(self) -> Result<Option<Vec<u32>>, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Option<Vec<u32>>, A::Error> {
        TokenListSeed(self.0).visit_seq(seq).map(|(tokens, _)| Some(tokens))
    }
}

/// `extra_keys`: `nil` or one `nil`-or-tuple per block.
struct ExtraKeysSeed<'c, 'l>(&'c Ctx<'l>);

type ExtraKeys = Option<Vec<Option<Vec<ExtraKey>>>>;

impl<'de> DeserializeSeed<'de> for ExtraKeysSeed<'_, '_> {
    type Value = ExtraKeys;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ExtraKeys, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ExtraKeysSeed<'_, '_> {
    type Value = ExtraKeys;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("extra keys: nil or an array of nil-or-tuples")
    }

    fn visit_unit<E>(self) -> Result<ExtraKeys, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ExtraKeys, A::Error> {
        let limit = self.0.limits.max_blocks_per_event;
        let hint = seq.size_hint().unwrap_or(0);
        self.0.check_len("extra_keys", hint, limit)?;
        let mut out = Vec::with_capacity(hint.min(PREALLOC));
        while let Some(keys) = seq.next_element_seed(BlockExtraKeysSeed(self.0))? {
            self.0.check_len("extra_keys", out.len() + 1, limit)?;
            out.push(keys);
        }
        Ok(Some(out))
    }
}

struct BlockExtraKeysSeed<'c, 'l>(&'c Ctx<'l>);

impl<'de> DeserializeSeed<'de> for BlockExtraKeysSeed<'_, '_> {
    type Value = Option<Vec<ExtraKey>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BlockExtraKeysSeed<'_, '_> {
    type Value = Option<Vec<ExtraKey>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("nil or a tuple of extra keys")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let limit = self.0.limits.max_blocks_per_event;
        let mut out = Vec::new();
        while let Some(key) = seq.next_element_seed(ExtraKeySeed(self.0))? {
            self.0.check_len("extra key tuple", out.len() + 1, limit)?;
            out.push(key);
        }
        Ok(Some(out))
    }
}

struct ExtraKeySeed<'c, 'l>(&'c Ctx<'l>);

impl<'de> DeserializeSeed<'de> for ExtraKeySeed<'_, '_> {
    type Value = ExtraKey;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ExtraKey, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ExtraKeySeed<'_, '_> {
    type Value = ExtraKey;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an extra key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ExtraKey, E> {
        self.0.check_len("string", v.len(), self.0.limits.max_string_bytes)?;
        Ok(ExtraKey::Str(v.to_owned()))
    }

    fn visit_bool<E>(self, _: bool) -> Result<ExtraKey, E> {
        Ok(ExtraKey::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<ExtraKey, E> {
        Ok(ExtraKey::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<ExtraKey, E> {
        Ok(ExtraKey::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<ExtraKey, E> {
        Ok(ExtraKey::Other)
    }

    fn visit_bytes<E>(self, _: &[u8]) -> Result<ExtraKey, E> {
        Ok(ExtraKey::Other)
    }

    fn visit_unit<E>(self) -> Result<ExtraKey, E> {
        Ok(ExtraKey::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ExtraKey, A::Error> {
        drain(&mut seq)?;
        Ok(ExtraKey::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ExtraKey, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(ExtraKey::Other)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<ExtraKey, D::Error> {
        IgnoredAny::deserialize(d)?;
        Ok(ExtraKey::Other)
    }
}

struct EventsSeed<'c, 'l>(&'c Ctx<'l>);

impl<'de> DeserializeSeed<'de> for EventsSeed<'_, '_> {
    type Value = Vec<Event>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Event>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_, '_> {
    type Value = Vec<Event>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of events")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Event>, A::Error> {
        let limit = self.0.limits.max_events;
        let hint = seq.size_hint().unwrap_or(0);
        self.0.check_len("events", hint, limit)?;
        let mut out = Vec::with_capacity(hint.min(PREALLOC));
        while let Some(event) = seq.next_element_seed(EventSeed(self.0))? {
            self.0.check_len("events", out.len() + 1, limit)?;
            out.push(event);
        }
        Ok(out)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
    Unknown,
}

fn kind_of(name: &str) -> Kind {
    match name {
        "BlockStored" => Kind::Stored,
        "BlockRemoved" => Kind::Removed,
        "AllBlocksCleared" => Kind::Cleared,
        _ => Kind::Unknown,
    }
}

/// The fields an event may carry, in the order old array-form `BlockStored` lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Type,
    BlockHashes,
    ParentBlockHash,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    ExtraKeys,
    GroupIdx,
    KvCacheSpecKind,
    KvCacheSpecSlidingWindow,
    Locality,
    Ownership,
    SessionId,
    LookaheadTokenIds,
    CacheSalt,
    Other,
}

fn key_of(name: &str) -> Key {
    match name {
        "type" => Key::Type,
        "block_hashes" => Key::BlockHashes,
        "parent_block_hash" => Key::ParentBlockHash,
        "token_ids" => Key::TokenIds,
        "block_size" => Key::BlockSize,
        "lora_id" => Key::LoraId,
        "medium" => Key::Medium,
        "lora_name" => Key::LoraName,
        "extra_keys" => Key::ExtraKeys,
        "group_idx" => Key::GroupIdx,
        "kv_cache_spec_kind" => Key::KvCacheSpecKind,
        "kv_cache_spec_sliding_window" => Key::KvCacheSpecSlidingWindow,
        "locality" => Key::Locality,
        "ownership" => Key::Ownership,
        "session_id" => Key::SessionId,
        "lookahead_token_ids" => Key::LookaheadTokenIds,
        "cache_salt" => Key::CacheSalt,
        _ => Key::Other,
    }
}

/// Positional fields of array-form `BlockStored` after the tag.
const STORED_ORDER: [Key; 14] = [
    Key::BlockHashes,
    Key::ParentBlockHash,
    Key::TokenIds,
    Key::BlockSize,
    Key::LoraId,
    Key::Medium,
    Key::LoraName,
    Key::ExtraKeys,
    Key::GroupIdx,
    Key::KvCacheSpecKind,
    Key::KvCacheSpecSlidingWindow,
    Key::Locality,
    Key::Ownership,
    Key::SessionId,
];

/// Positional fields of array-form `BlockRemoved` after the tag.
const REMOVED_ORDER: [Key; 5] =
    [Key::BlockHashes, Key::Medium, Key::GroupIdx, Key::Locality, Key::Ownership];

/// Everything an event carried, before it is checked against its type.
#[derive(Default)]
struct Raw {
    kind: Option<Kind>,
    block_hashes: Option<Vec<u64>>,
    parent_block_hash: Option<u64>,
    token_ids: Option<(Vec<u32>, bool)>,
    block_size: Option<i64>,
    lora_id: Option<i64>,
    medium: Option<MediumField>,
    lora_name: Option<String>,
    extra_keys: ExtraKeys,
    group_idx: Option<i64>,
    kv_cache_spec_kind: Option<SpecKind>,
    kv_cache_spec_sliding_window: Option<i64>,
    locality: Option<Locality>,
    ownership: Option<String>,
    session_id: Option<String>,
    lookahead_token_ids: Option<Vec<u32>>,
    cache_salt: Option<String>,
}

impl Raw {
    fn into_event(self) -> Event {
        match self.kind.unwrap_or(Kind::Unknown) {
            Kind::Unknown => Event::Unknown,
            Kind::Cleared => Event::AllCleared,
            Kind::Removed => {
                let Some(block_hashes) = self.block_hashes else {
                    return Event::Invalid { event: "BlockRemoved", missing: "block_hashes" };
                };
                Event::Removed(BlockRemoved {
                    block_hashes,
                    medium: self.medium,
                    group_idx: self.group_idx,
                    locality: self.locality,
                    ownership: self.ownership,
                })
            }
            Kind::Stored => {
                let Some(block_hashes) = self.block_hashes else {
                    return Event::Invalid { event: "BlockStored", missing: "block_hashes" };
                };
                let Some((token_ids, token_pairs)) = self.token_ids else {
                    return Event::Invalid { event: "BlockStored", missing: "token_ids" };
                };
                Event::Stored(BlockStored {
                    block_hashes,
                    parent_block_hash: self.parent_block_hash,
                    token_ids,
                    token_pairs,
                    block_size: self.block_size,
                    lora_id: self.lora_id,
                    medium: self.medium,
                    lora_name: self.lora_name,
                    extra_keys: self.extra_keys,
                    group_idx: self.group_idx,
                    kv_cache_spec_kind: self.kv_cache_spec_kind,
                    kv_cache_spec_sliding_window: self.kv_cache_spec_sliding_window,
                    locality: self.locality,
                    ownership: self.ownership,
                    session_id: self.session_id,
                    lookahead_token_ids: self.lookahead_token_ids,
                    cache_salt: self.cache_salt,
                })
            }
        }
    }
}

/// Decodes the value of one field into [`Raw`].
struct FieldSeed<'a, 'c, 'l> {
    key: Key,
    raw: &'a mut Raw,
    ctx: &'c Ctx<'l>,
}

impl<'de> DeserializeSeed<'de> for FieldSeed<'_, '_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let FieldSeed { key, raw, ctx } = self;
        match key {
            Key::Type => raw.kind = NameSeed(kind_of).deserialize(d)?,
            Key::BlockHashes => raw.block_hashes = Some(HashListSeed(ctx).deserialize(d)?),
            Key::ParentBlockHash => raw.parent_block_hash = OptHashSeed.deserialize(d)?,
            Key::TokenIds => raw.token_ids = Some(TokenListSeed(ctx).deserialize(d)?),
            Key::BlockSize => raw.block_size = OptIntSeed.deserialize(d)?,
            Key::LoraId => raw.lora_id = OptIntSeed.deserialize(d)?,
            Key::Medium => raw.medium = NameSeed(medium_of).deserialize(d)?,
            Key::LoraName => raw.lora_name = OptStringSeed(ctx).deserialize(d)?,
            Key::ExtraKeys => raw.extra_keys = ExtraKeysSeed(ctx).deserialize(d)?,
            Key::GroupIdx => raw.group_idx = OptIntSeed.deserialize(d)?,
            Key::KvCacheSpecKind => {
                raw.kv_cache_spec_kind = NameSeed(spec_kind_of).deserialize(d)?
            }
            Key::KvCacheSpecSlidingWindow => {
                raw.kv_cache_spec_sliding_window = OptIntSeed.deserialize(d)?;
            }
            Key::Locality => raw.locality = NameSeed(locality_of).deserialize(d)?,
            Key::Ownership => raw.ownership = OptStringSeed(ctx).deserialize(d)?,
            Key::SessionId => raw.session_id = OptStringSeed(ctx).deserialize(d)?,
            Key::LookaheadTokenIds => {
                raw.lookahead_token_ids = OptTokenListSeed(ctx).deserialize(d)?;
            }
            Key::CacheSalt => raw.cache_salt = OptStringSeed(ctx).deserialize(d)?,
            Key::Other => {
                IgnoredAny::deserialize(d)?;
            }
        }
        Ok(())
    }
}

/// A map key, read without allocating.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E>(self, v: &str) -> Result<Key, E> {
        Ok(key_of(v))
    }

    fn visit_bytes<E>(self, v: &[u8]) -> Result<Key, E> {
        Ok(std::str::from_utf8(v).map_or(Key::Other, key_of))
    }

    // Non-string keys are legal msgpack; they name nothing we know.
    fn visit_u64<E>(self, _: u64) -> Result<Key, E> {
        Ok(Key::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Key, E> {
        Ok(Key::Other)
    }

    fn visit_unit<E>(self) -> Result<Key, E> {
        Ok(Key::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Key, A::Error> {
        drain(&mut seq)?;
        Ok(Key::Other)
    }
}

struct EventSeed<'c, 'l>(&'c Ctx<'l>);

impl<'de> DeserializeSeed<'de> for EventSeed<'_, '_> {
    type Value = Event;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Event, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for EventSeed<'_, '_> {
    type Value = Event;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an event map with \"type\" or an array with the type first")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
        let mut raw = Raw::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            map.next_value_seed(FieldSeed { key, raw: &mut raw, ctx: self.0 })?;
        }
        Ok(raw.into_event())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Event, A::Error> {
        let mut raw = Raw::default();
        let Some(kind) = seq.next_element_seed(NameSeed(kind_of))? else {
            return Ok(Event::Unknown);
        };
        raw.kind = kind;
        let order: &[Key] = match kind.unwrap_or(Kind::Unknown) {
            Kind::Stored => &STORED_ORDER,
            Kind::Removed => &REMOVED_ORDER,
            Kind::Cleared | Kind::Unknown => &[],
        };
        for &key in order {
            if seq.next_element_seed(FieldSeed { key, raw: &mut raw, ctx: self.0 })?.is_none() {
                break;
            }
        }
        drain(&mut seq)?;
        Ok(raw.into_event())
    }
}
