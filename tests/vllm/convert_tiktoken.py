#!/usr/bin/env python3
"""Owns the committed tokenizer side of the two tiny vLLM test models: regenerates, byte for byte,
tests/vllm/models/{llama3,chatml}/{tokenizer.json,tokenizer_config.json,special_tokens_map.json,
config.json,generation_config.json}. The weights are not here: make_models.py builds them.

    ~/.cache/router-ci/vllm-0.32.0/bin/python tests/vllm/convert_tiktoken.py [--tiktoken FILE]

The vocabulary is GPT-2's byte-level BPE (50,256 ranks) as `openai-whisper` ships it in its PyPI
sdist (`whisper/assets/gpt2.tiktoken`). Without --tiktoken the pinned sdist is downloaded with
`pip download --no-deps --no-binary :all: openai-whisper==20250625` (sha256 checked) and only that
file is read. The Hugging Face tokenizer is built the way transformers' TikTokenConverter does it:
the vocabulary is the ranks, each multi-byte token contributes every (left, right) split whose
halves are both tokens as a merge (ordered by the token's rank, then the halves' ranks), the
pre-tokenizer is the GPT-2 split regex followed by a byte-level mapping, and `ignore_merges` is
on (a whole pre-token found in the vocabulary is one token, as in tiktoken).

Each family then adds its special tokens after the 50,256 ranks:
  llama3  <|begin_of_text|> (BOS, added by the post-processor), <|end_of_text|>,
          <|start_header_id|>, <|end_header_id|>, <|eot_id|> (EOS), <|eom_id|>, <|python_tag|>;
          chat template: meta-llama/Llama-3.1-8B-Instruct's (tools, date_string, BOS printed)
  chatml  <|endoftext|> (pad), <|im_start|>, <|im_end|> (EOS), and the non-special added tokens
          <tool_call>, </tool_call>; no BOS; chat template: Qwen/Qwen2.5-7B-Instruct's (default
          system prompt, tools)
The templates are read from crates/router-chat-template/testdata/templates/ (see its SOURCES.md).

It also writes the demo's tokenizer, crates/router-sim/assets/gpt2/tokenizer.json: the same
vocabulary with <|endoftext|>, <|im_start|> and <|im_end|> (all special) and no BOS, beside a
tokenizer_config.json holding router-sim's ChatML template (that of assets/tokenizer_config.json).
"""

import argparse
import base64
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
TEMPLATES = REPO / "crates/router-chat-template/testdata/templates"
WHISPER = "openai-whisper==20250625"
WHISPER_SDIST = "openai_whisper-20250625.tar.gz"
WHISPER_SHA256 = "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96"
GPT2_TIKTOKEN_SHA256 = None  # checked through the sdist's hash

# GPT-2's pre-tokenizer regex (tiktoken's "gpt2" pat_str).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

FAMILIES = {
    "llama3": {
        "template_dir": "llama-3.1-8b-instruct",
        # (content, special)
        "added": [
            ("<|begin_of_text|>", True),
            ("<|end_of_text|>", True),
            ("<|start_header_id|>", True),
            ("<|end_header_id|>", True),
            ("<|eot_id|>", True),
            ("<|eom_id|>", True),
            ("<|python_tag|>", True),
        ],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "pad": None,
        # Llama 3's generation_config stops on all three.
        "gen_eos": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
        "model_max_length": 4096,
    },
    "chatml": {
        "template_dir": "qwen2.5-7b-instruct",
        "added": [
            ("<|endoftext|>", True),
            ("<|im_start|>", True),
            ("<|im_end|>", True),
            ("<tool_call>", False),
            ("</tool_call>", False),
        ],
        "bos": None,
        "eos": "<|im_end|>",
        "pad": "<|endoftext|>",
        "gen_eos": ["<|im_end|>", "<|endoftext|>"],
        "model_max_length": 4096,
    },
}

# The model shape (make_models.py fills in the weights).
MODEL_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention supports head sizes 32, 64, 80, ... (not 16)
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
}


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def fetch_tiktoken() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        print(f"convert_tiktoken: downloading the {WHISPER} sdist", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", WHISPER, "-d", tmp],
            check=True,
            timeout=600,
        )
        sdist = Path(tmp) / WHISPER_SDIST
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if digest != WHISPER_SHA256:
            sys.exit(f"convert_tiktoken: {sdist.name} has sha256 {digest}, expected {WHISPER_SHA256}")
        with tarfile.open(sdist) as tar:
            member = tar.getmember("openai_whisper-20250625/whisper/assets/gpt2.tiktoken")
            return tar.extractfile(member).read()


def load_ranks(data: bytes) -> dict:
    ranks = {}
    for line in data.splitlines():
        if not line:
            continue
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    assert sorted(ranks.values()) == list(range(len(ranks))), "ranks are not 0..n-1"
    return ranks


def vocab_and_merges(ranks: dict):
    """transformers' TikTokenConverter.extract_vocab_merges_from_model, for a bytes->rank map."""
    byte_encoder = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_encoder[x] for x in b)

    vocab = {}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[to_str(token)] = rank
        if len(token) == 1:
            continue
        local = []
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                local.append((left, right, rank))
        local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])  # stable: keeps the halves' order within a rank
    return vocab, [(to_str(a), to_str(b)) for a, b, _ in merges]


def build_tokenizer(vocab, merges, family: dict) -> Tokenizer:
    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False, ignore_merges=True)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(
        [AddedToken(content, special=special, normalized=False, single_word=False, lstrip=False, rstrip=False) for content, special in family["added"]]
    )
    byte_level = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    if family["bos"]:
        bos = family["bos"]
        bos_id = tok.token_to_id(bos)
        template = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)],
        )
        tok.post_processor = processors.Sequence([byte_level, template])
    else:
        tok.post_processor = byte_level
    return tok


def dump(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_family(name: str, family: dict, vocab, merges) -> None:
    out = HERE / "models" / name
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab, merges, family)
    # Compact: the vocabulary and merges dominate the size.
    text = tok.to_str(pretty=False)
    # Re-serialise with sorted-free, stable separators (tokenizers' own order is deterministic).
    (out / "tokenizer.json").write_text(text + "\n")

    ids = {content: tok.token_to_id(content) for content, _ in family["added"]}
    size = tok.get_vocab_size(with_added_tokens=True)
    template_config = json.loads((TEMPLATES / family["template_dir"] / "tokenizer_config.json").read_text())
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": family["model_max_length"],
        "clean_up_tokenization_spaces": False,
        "add_bos_token": bool(family["bos"]),
        "add_eos_token": False,
        "bos_token": family["bos"],
        "eos_token": family["eos"],
        "pad_token": family["pad"],
        "unk_token": None,
        "added_tokens_decoder": {
            str(ids[content]): {
                "content": content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for content, special in family["added"]
        },
        "chat_template": template_config["chat_template"],
    }
    dump(out / "tokenizer_config.json", config)
    special = {"bos_token": family["bos"], "eos_token": family["eos"], "pad_token": family["pad"]}
    dump(out / "special_tokens_map.json", {k: v for k, v in special.items() if v is not None})
    model_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "float32",
        "vocab_size": size,
        **MODEL_SHAPE,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "rope_scaling": None,
        "bos_token_id": ids.get(family["bos"]) if family["bos"] else None,
        "eos_token_id": ids[family["eos"]],
        "pad_token_id": ids[family["pad"]] if family["pad"] else None,
    }
    dump(out / "config.json", model_config)
    generation = {
        "bos_token_id": model_config["bos_token_id"],
        "eos_token_id": [ids[t] for t in family["gen_eos"]],
        "do_sample": False,
    }
    if family["pad"]:
        generation["pad_token_id"] = ids[family["pad"]]
    dump(out / "generation_config.json", generation)
    print(f"convert_tiktoken: {out.relative_to(REPO)}: {size} tokens, added {ids}")


def write_demo(vocab, merges) -> None:
    """router-sim's GPT-2 tokenizer for `router-server --demo` and the clients benchmarking it."""
    out = REPO / "crates/router-sim/assets/gpt2"
    out.mkdir(parents=True, exist_ok=True)
    family = {"added": [(t, True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")], "bos": None}
    tok = build_tokenizer(vocab, merges, family)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False) + "\n")
    config = json.loads((REPO / "crates/router-sim/assets/tokenizer_config.json").read_text())
    dump(out / "tokenizer_config.json", config)
    print(f"convert_tiktoken: {out.relative_to(REPO)}: {tok.get_vocab_size(with_added_tokens=True)} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiktoken", type=Path, help="gpt2.tiktoken (default: from the pinned openai-whisper sdist)")
    args = parser.parse_args()
    data = args.tiktoken.read_bytes() if args.tiktoken else fetch_tiktoken()
    ranks = load_ranks(data)
    vocab, merges = vocab_and_merges(ranks)
    print(f"convert_tiktoken: {len(vocab)} ranks, {len(merges)} merges", file=sys.stderr)
    for name, family in FAMILIES.items():
        write_family(name, family, vocab, merges)
    write_demo(vocab, merges)


if __name__ == "__main__":
    main()
