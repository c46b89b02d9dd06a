#!/usr/bin/env python3
"""Owns the weights of the two tiny vLLM test models: builds, deterministically, a random-weight
Llama-architecture model for each family of tests/vllm/models/ (`llama3`, `chatml`) into
`--out` (default ${ROUTER_VLLM_MODELS:-~/.cache/router-ci/vllm-models})/<family>/.

    ~/.cache/router-ci/vllm-0.32.0/bin/python tests/vllm/make_models.py [--out DIR]

Run by setup.sh with the vLLM venv's python. Each model directory gets the committed files of
tests/vllm/models/<family>/ (tokenizer.json, tokenizer_config.json with the chat template,
special_tokens_map.json, config.json, generation_config.json; see convert_tiktoken.py) copied in,
plus `model.safetensors`: every tensor of transformers' LlamaForCausalLM for that config, filled
in name order from one torch generator seeded with torch.manual_seed(0): N(0, 0.02) for matrices
and embeddings, ones for the RMSNorm weights. Same inputs, same bytes. The outputs are noise; the
models exist to exercise tokenization, templates, scheduling, the prefix cache and KV events.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

HERE = Path(__file__).resolve().parent
FAMILIES = ("llama3", "chatml")
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json", "generation_config.json")


def shapes(config: dict) -> dict:
    """Names and shapes of LlamaForCausalLM's tensors (no bias, untied embeddings)."""
    h = config["hidden_size"]
    inter = config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv = config["num_key_value_heads"]
    head_dim = config.get("head_dim", h // heads)
    vocab = config["vocab_size"]
    out = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (h,)
        out[p + "post_attention_layernorm.weight"] = (h,)
        out[p + "self_attn.q_proj.weight"] = (heads * head_dim, h)
        out[p + "self_attn.k_proj.weight"] = (kv * head_dim, h)
        out[p + "self_attn.v_proj.weight"] = (kv * head_dim, h)
        out[p + "self_attn.o_proj.weight"] = (h, heads * head_dim)
        out[p + "mlp.gate_proj.weight"] = (inter, h)
        out[p + "mlp.up_proj.weight"] = (inter, h)
        out[p + "mlp.down_proj.weight"] = (h, inter)
    return out


def check_against_transformers(config_dir: Path, names: dict) -> None:
    """The tensor names and shapes must be what transformers' Llama has (no weights allocated)."""
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if expected != names:
        sys.exit(f"make_models: tensor layout differs from transformers': {set(expected) ^ set(names)}")


def build(family: str, out_root: Path) -> None:
    src = HERE / "models" / family
    config = json.loads((src / "config.json").read_text())
    tokenizer = json.loads((src / "tokenizer.json").read_text())
    vocab = len(tokenizer["model"]["vocab"]) + sum(
        1 for t in tokenizer["added_tokens"] if t["content"] not in tokenizer["model"]["vocab"]
    )
    if config["vocab_size"] != vocab:
        sys.exit(f"make_models: {family}: config vocab_size {config['vocab_size']} != tokenizer size {vocab}")
    names = shapes(config)
    check_against_transformers(src, names)

    torch.manual_seed(0)
    tensors = {}
    for name in sorted(names):
        shape = names[name]
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=torch.float32)
        else:
            tensors[name] = torch.randn(shape, dtype=torch.float32) * 0.02

    dest = out_root / family
    tmp = out_root / f".{family}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in FILES:
        shutil.copyfile(src / name, tmp / name)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    digest = hashlib.sha256((dest / "model.safetensors").read_bytes()).hexdigest()
    params = sum(t.numel() for t in tensors.values())
    print(f"make_models: {dest}: {params} parameters, model.safetensors sha256 {digest[:16]}")


def main() -> None:
    default = os.environ.get("ROUTER_VLLM_MODELS") or str(Path.home() / ".cache/router-ci/vllm-models")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(default))
    parser.add_argument("families", nargs="*", default=list(FAMILIES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for family in args.families:
        build(family, args.out)


if __name__ == "__main__":
    main()
