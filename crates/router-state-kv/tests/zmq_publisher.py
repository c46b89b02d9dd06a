#!/usr/bin/env python3
"""A KV-event publisher built on libzmq (pyzmq) and msgpack, framed exactly as engines do.

Used by tests/interop.rs. It plays one engine with `--ranks` data-parallel ranks: per rank a
PUB socket (bound on consecutive ports, or connected to the router's bound SUB endpoints with
`--connect`) and a replay ROUTER (always bound, consecutive ports). Live messages are
`[topic, seq (8 bytes big-endian), payload]`; replay replies are `["", topic, seq, payload]`
(or `["", seq, payload]` after `frames 3`), ended by seq 0xffffffffffffffff with an empty
payload. Sequence numbers start at 0 per rank and restart at 0 on `restart`.

Commands, one per line on stdin, each answered by one line on stdout:
  batch RANK JSON   publish one batch; JSON = {"events": [...], "form": "map"|"array",
                    "publish": true, "topic": "..."}; answers "OK <seq>"
  frames 3|4        replay reply shape
  garbage RANK      a 2-frame message, a 7-byte seq message, then a batch that is not msgpack
                    (the last one consumes a seq); answers "OK <seq>"
  restart           close and rebind/reconnect every PUB, clear the rings, seq back to 0
  quit
Events are JSON objects with the msgspec field names plus "hash_kind": "u64" | "i64" |
"bytes" (how block hashes are encoded) and "pairs": true (token ids as pairs).
"""

import argparse
import json
import sys
import time

import msgpack
import zmq

END_SEQ = b"\xff" * 8

STORED_FIELDS = [
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
]
REMOVED_FIELDS = ["block_hashes", "medium"]


def encode_hash(value, kind):
    if value is None:
        return None
    if kind == "i64":
        return value - (1 << 64) if value >= (1 << 63) else value
    if kind == "bytes":
        return b"\x00" * 24 + value.to_bytes(8, "big")
    return value


def encode_event(event, form):
    kind = event.get("hash_kind", "u64")
    ev = dict(event)
    ev.pop("hash_kind", None)
    pairs = ev.pop("pairs", False)
    if "block_hashes" in ev:
        ev["block_hashes"] = [encode_hash(h, kind) for h in ev["block_hashes"]]
    if "parent_block_hash" in ev:
        ev["parent_block_hash"] = encode_hash(ev["parent_block_hash"], kind)
    if pairs and "token_ids" in ev:
        toks = ev["token_ids"]
        ev["token_ids"] = [[t, toks[i + 1] if i + 1 < len(toks) else 0] for i, t in enumerate(toks)]
    if form == "map":
        out = {"type": ev.pop("type")}
        out.update(ev)
        return out
    tag = ev["type"]
    fields = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(tag, [])
    return [tag] + [ev.get(name) for name in fields]


def bind_consecutive(ctx, kind, count):
    """Binds `count` sockets of `kind` on consecutive free ports of 127.0.0.1."""
    for _ in range(200):
        first = ctx.socket(kind)
        first.setsockopt(zmq.LINGER, 0)
        base = first.bind_to_random_port("tcp://127.0.0.1", min_port=20000, max_port=60000)
        socks = [first]
        try:
            for r in range(1, count):
                s = ctx.socket(kind)
                s.setsockopt(zmq.LINGER, 0)
                socks.append(s)
                s.bind("tcp://127.0.0.1:%d" % (base + r))
            return base, socks
        except zmq.ZMQError:
            for s in socks:
                s.close()
    raise SystemExit("no consecutive free ports")


class Engine:
    def __init__(self, args):
        self.ctx = zmq.Context()
        self.ranks = args.ranks
        self.topic = args.topic.encode()
        self.connect = args.connect
        self.frames = 4
        self.replay_base, self.routers = bind_consecutive(self.ctx, zmq.ROUTER, self.ranks)
        self.open_pubs()
        self.seq = [0] * self.ranks
        self.rings = [[] for _ in range(self.ranks)]

    def open_pubs(self):
        if self.connect:
            host, port = self.connect.rsplit(":", 1)
            self.pubs = []
            for r in range(self.ranks):
                s = self.ctx.socket(zmq.PUB)
                s.setsockopt(zmq.LINGER, 0)
                s.connect("%s:%d" % (host, int(port) + r))
                self.pubs.append(s)
            self.pub_base = 0
        elif getattr(self, "pub_base", None):
            self.pubs = []
            for r in range(self.ranks):
                s = self.ctx.socket(zmq.PUB)
                s.setsockopt(zmq.LINGER, 0)
                for attempt in range(200):
                    try:
                        s.bind("tcp://127.0.0.1:%d" % (self.pub_base + r))
                        break
                    except zmq.ZMQError:
                        # The closed socket's listener is released asynchronously.
                        time.sleep(0.01)
                else:
                    raise SystemExit("cannot rebind the PUB port")
                self.pubs.append(s)
        else:
            self.pub_base, self.pubs = bind_consecutive(self.ctx, zmq.PUB, self.ranks)

    def publish(self, rank, payload, publish=True, topic=None):
        seq = self.seq[rank]
        self.seq[rank] += 1
        topic = self.topic if topic is None else topic.encode()
        self.rings[rank].append((seq, topic, payload))
        if publish:
            self.pubs[rank].send_multipart([topic, seq.to_bytes(8, "big"), payload])
        return seq

    def batch(self, rank, spec):
        form = spec.get("form", "map")
        events = [encode_event(e, form) for e in spec.get("events", [])]
        payload = msgpack.packb([1.0, events, rank], use_bin_type=True)
        return self.publish(rank, payload, spec.get("publish", True), spec.get("topic"))

    def garbage(self, rank):
        pub = self.pubs[rank]
        pub.send_multipart([self.topic, (0).to_bytes(8, "big")])
        pub.send_multipart([self.topic, b"\x00" * 7, msgpack.packb([1.0, [], rank])])
        return self.publish(rank, b"\xc1\xc1 not msgpack")

    def restart(self):
        for s in self.pubs:
            s.close()
        self.seq = [0] * self.ranks
        self.rings = [[] for _ in range(self.ranks)]
        self.open_pubs()

    def serve_replay(self, rank):
        router = self.routers[rank]
        frames = router.recv_multipart()
        if len(frames) != 3:
            return
        ident, _, start = frames
        start = int.from_bytes(start, "big")
        for seq, topic, payload in self.rings[rank]:
            if seq >= start:
                reply = [ident, b""]
                if self.frames == 4:
                    reply.append(topic)
                reply += [seq.to_bytes(8, "big"), payload]
                router.send_multipart(reply)
        tail = [ident, b""] + ([self.topic] if self.frames == 4 else []) + [END_SEQ, b""]
        router.send_multipart(tail)

    def command(self, line):
        parts = line.strip().split(" ", 2)
        op = parts[0]
        if op == "batch":
            return "OK %d" % self.batch(int(parts[1]), json.loads(parts[2]))
        if op == "frames":
            self.frames = int(parts[1])
            return "OK"
        if op == "garbage":
            return "OK %d" % self.garbage(int(parts[1]))
        if op == "restart":
            self.restart()
            return "OK"
        if op == "quit":
            raise SystemExit(0)
        return "ERR unknown command %r" % op


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--topic", default="")
    parser.add_argument("--connect", default="", help="tcp://host:port of the router's SUB")
    engine = Engine(parser.parse_args())
    print("READY %d %d" % (engine.pub_base, engine.replay_base), flush=True)
    poller = zmq.Poller()
    poller.register(sys.stdin, zmq.POLLIN)
    for router in engine.routers:
        poller.register(router, zmq.POLLIN)
    while True:
        for sock, _ in poller.poll():
            if sock is sys.stdin or sock == sys.stdin.fileno():
                line = sys.stdin.readline()
                if not line:
                    return
                print(engine.command(line), flush=True)
            else:
                engine.serve_replay(engine.routers.index(sock))


if __name__ == "__main__":
    main()
