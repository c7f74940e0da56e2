#!/usr/bin/env bash
# The Meta-World environment: a second virtualenv, .venv-metaworld, because metaworld 3.1.1 pins
# mujoco==3.3.0 and the main one (.venv, scripts/setup.sh) runs mujoco 4. Same torch as setup.sh
# (the local 2.13 CPU wheel here; TORCH_SPEC picks another build), then the project with the extras
# that collection and the tests need. Run scripts/setup.sh first on a fresh machine (EGL packages).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-metaworld
[ -x $VENV/bin/python ] || "$PYTHON" -m venv $VENV
$VENV/bin/python -m pip install -q --upgrade pip
$VENV/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
$VENV/bin/python -m pip install -q -e ".[metaworld,robotics,training,dev]"
echo "setup done: $($VENV/bin/python -c 'import metaworld, mujoco; print("mujoco", mujoco.__version__, "metaworld", len(metaworld.ALL_V3_ENVIRONMENTS), "v3 tasks")')"
