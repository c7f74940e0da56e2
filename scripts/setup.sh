#!/usr/bin/env bash
# Fresh-machine setup: system packages for offscreen MuJoCo rendering, a virtualenv in .venv,
# torch 2.13 (the local CPU wheel here; pass TORCH_SPEC to pick another build), then the project.
set -euo pipefail
cd "$(dirname "$0")/.."

SYSTEM_PACKAGES="libegl1 libgl1 libglib2.0-0"
missing=$(for p in $SYSTEM_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
    SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e ".[all,dev]"
if .venv/bin/python -m pip show torchvision >/dev/null 2>&1; then
    echo "torchvision got installed; it must stay out of the dependency tree" >&2
    exit 1
fi
echo "setup done: $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
