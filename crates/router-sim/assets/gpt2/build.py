"""Builds tokenizer.json beside this file: GPT-2's byte-level BPE (50257 tokens), read from
`whisper/assets/gpt2.tiktoken` of PyPI `openai-whisper==20250625` (no model hub), plus the two
ChatML markers of the demo's chat template as special tokens (50257, 50258).

    pip download --no-deps openai-whisper==20250625 && tar xzf openai_whisper-20250625.tar.gz
    python3 build.py openai_whisper-20250625/whisper/assets/gpt2.tiktoken

Needs only the standard library. The merges are recovered from the ranks as tiktoken defines
BPE: a token of rank r is the merge of the two parts that byte-pair encoding with ranks below r
leaves of it.
"""

import base64
import json
import sys
from pathlib import Path


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable characters."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def parts_below(ranks, token, max_rank):
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best is None or rank < best[1]):
                best = (i, rank)
        if best is None:
            return parts
        i = best[0]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def main(tiktoken_file):
    ranks = {}
    for line in Path(tiktoken_file).read_text().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    encode = bytes_to_unicode()
    text = lambda token: "".join(encode[b] for b in token)
    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            left, right = parts_below(ranks, token, rank)
            merges.append(f"{text(left)} {text(right)}")
    special = lambda id, content: {
        "id": id, "content": content, "single_word": False, "lstrip": False,
        "rstrip": False, "normalized": False, "special": True,
    }
    vocab["<|endoftext|>"] = 50256
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            special(50256, "<|endoftext|>"),
            special(50257, "<|im_start|>"),
            special(50258, "<|im_end|>"),
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": merges},
    }
    out = Path(__file__).with_name("tokenizer.json")
    out.write_text(json.dumps(tokenizer, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"{out}: {len(vocab)} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main(sys.argv[1])
