//! Msgpack encoding of event batches, byte-compatible with the engines' msgspec structs
//! (`docs/design/wire/golden.txt` is the reference).
//!
//! Batch: `[ts: f64, [event, ...], dp_rank]`. Map-encoded events carry the fields the engines
//! emit with `omit_defaults`; array-encoded ones carry every position of the old structs.

use rmp::encode as mp;

use super::{KvEvent, KvFormat};

const MEDIUM_GPU: &str = "GPU";

/// Encodes one batch of events for `dp_rank` in `format`.
pub fn encode_batch(
    format: KvFormat,
    ts: f64,
    events: &[KvEvent],
    block_size: u32,
    dp_rank: Option<u32>,
) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64 + events.len() * 96));
    w.array(3);
    w.f64(ts);
    w.array(events.len());
    for event in events {
        match format {
            KvFormat::Vllm => vllm_map(&mut w, event, block_size),
            KvFormat::VllmLegacy => vllm_array(&mut w, event, block_size),
            KvFormat::Sglang => sglang_map(&mut w, event, block_size),
            KvFormat::SglangLegacy => sglang_array(&mut w, event, block_size),
        }
    }
    match dp_rank {
        Some(rank) => w.uint(u64::from(rank)),
        None => w.nil(),
    }
    w.0
}

fn vllm_map(w: &mut Writer, event: &KvEvent, block_size: u32) {
    match event {
        KvEvent::Stored { hashes, parent, token_ids } => {
            // vLLM's BlockStored struct has more than 15 fields, so msgspec reserves a map16
            // header and patches the count of the fields it did not omit.
            w.map16(10);
            w.key_str("type", "BlockStored");
            w.str("block_hashes");
            w.u64s(hashes);
            w.str("parent_block_hash");
            w.opt_u64(*parent);
            w.str("token_ids");
            w.u32s(token_ids);
            w.str("block_size");
            w.uint(u64::from(block_size));
            w.str("lora_id");
            w.nil();
            w.key_str("medium", MEDIUM_GPU);
            w.str("lora_name");
            w.nil();
            w.str("extra_keys");
            w.array(hashes.len());
            for _ in hashes {
                w.nil();
            }
            w.str("group_idx");
            w.uint(0);
        }
        KvEvent::Removed { hashes } => {
            w.map(3);
            w.key_str("type", "BlockRemoved");
            w.str("block_hashes");
            w.u64s(hashes);
            w.key_str("medium", MEDIUM_GPU);
        }
        KvEvent::Cleared => {
            w.map(1);
            w.key_str("type", "AllBlocksCleared");
        }
    }
}

fn vllm_array(w: &mut Writer, event: &KvEvent, block_size: u32) {
    match event {
        KvEvent::Stored { hashes, parent, token_ids } => {
            w.array(12);
            w.str("BlockStored");
            w.u64s(hashes);
            w.opt_u64(*parent);
            w.u32s(token_ids);
            w.uint(u64::from(block_size));
            w.nil(); // lora_id
            w.str(MEDIUM_GPU);
            w.nil(); // lora_name
            w.array(hashes.len()); // extra_keys, one per block
            for _ in hashes {
                w.nil();
            }
            w.uint(0); // group_idx
            w.nil(); // kv_cache_spec_kind
            w.nil(); // kv_cache_spec_sliding_window
        }
        KvEvent::Removed { hashes } => {
            w.array(4);
            w.str("BlockRemoved");
            w.u64s(hashes);
            w.str(MEDIUM_GPU);
            w.nil(); // group_idx
        }
        KvEvent::Cleared => {
            w.array(1);
            w.str("AllBlocksCleared");
        }
    }
}

fn sglang_map(w: &mut Writer, event: &KvEvent, block_size: u32) {
    match event {
        KvEvent::Stored { hashes, parent, token_ids } => {
            w.map(7);
            w.key_str("type", "BlockStored");
            w.str("block_hashes");
            w.i64s(hashes);
            w.str("parent_block_hash");
            w.opt_i64(*parent);
            w.str("token_ids");
            w.u32s(token_ids);
            w.str("block_size");
            w.uint(u64::from(block_size));
            w.str("lora_id");
            w.nil();
            w.key_str("medium", MEDIUM_GPU);
        }
        KvEvent::Removed { hashes } => {
            w.map(3);
            w.key_str("type", "BlockRemoved");
            w.str("block_hashes");
            w.i64s(hashes);
            w.key_str("medium", MEDIUM_GPU);
        }
        KvEvent::Cleared => {
            w.map(1);
            w.key_str("type", "AllBlocksCleared");
        }
    }
}

fn sglang_array(w: &mut Writer, event: &KvEvent, block_size: u32) {
    match event {
        KvEvent::Stored { hashes, parent, token_ids } => {
            w.array(7);
            w.str("BlockStored");
            w.i64s(hashes);
            w.opt_i64(*parent);
            w.u32s(token_ids);
            w.uint(u64::from(block_size));
            w.nil(); // lora_id
            w.str(MEDIUM_GPU);
        }
        KvEvent::Removed { hashes } => {
            w.array(3);
            w.str("BlockRemoved");
            w.i64s(hashes);
            w.str(MEDIUM_GPU);
        }
        KvEvent::Cleared => {
            w.array(1);
            w.str("AllBlocksCleared");
        }
    }
}

/// A msgpack writer into memory; every integer takes its smallest form, like msgspec.
struct Writer(Vec<u8>);

const INFALLIBLE: &str = "writing msgpack into a Vec cannot fail";

impl Writer {
    fn array(&mut self, len: usize) {
        mp::write_array_len(&mut self.0, len as u32).expect(INFALLIBLE);
    }

    fn map(&mut self, len: u32) {
        mp::write_map_len(&mut self.0, len).expect(INFALLIBLE);
    }

    fn map16(&mut self, len: u16) {
        self.0.push(0xde);
        self.0.extend_from_slice(&len.to_be_bytes());
    }

    fn str(&mut self, s: &str) {
        mp::write_str(&mut self.0, s).expect(INFALLIBLE);
    }

    fn key_str(&mut self, key: &str, value: &str) {
        self.str(key);
        self.str(value);
    }

    fn nil(&mut self) {
        mp::write_nil(&mut self.0).expect(INFALLIBLE);
    }

    fn f64(&mut self, v: f64) {
        mp::write_f64(&mut self.0, v).expect(INFALLIBLE);
    }

    fn uint(&mut self, v: u64) {
        mp::write_uint(&mut self.0, v).expect(INFALLIBLE);
    }

    /// SGLang hashes are signed: the u64 reinterpreted as two's complement.
    fn sint(&mut self, v: u64) {
        let signed = v as i64;
        if signed >= 0 {
            self.uint(v);
        } else {
            mp::write_sint(&mut self.0, signed).expect(INFALLIBLE);
        }
    }

    fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            Some(v) => self.uint(v),
            None => self.nil(),
        }
    }

    fn opt_i64(&mut self, v: Option<u64>) {
        match v {
            Some(v) => self.sint(v),
            None => self.nil(),
        }
    }

    fn u64s(&mut self, vs: &[u64]) {
        self.array(vs.len());
        for v in vs {
            self.uint(*v);
        }
    }

    fn i64s(&mut self, vs: &[u64]) {
        self.array(vs.len());
        for v in vs {
            self.sint(*v);
        }
    }

    fn u32s(&mut self, vs: &[u32]) {
        self.array(vs.len());
        for v in vs {
            self.uint(u64::from(*v));
        }
    }
}
