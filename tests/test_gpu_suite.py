"""bench/gpu_suite.sh end to end on the CPU with the tiny presets (CI's reduced run of the GPU suite)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ("rm_throughput", "rl_reward_overhead", "annotate_throughput", "grpo_step")


def run_suite(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    return subprocess.run(["bash", "bench/gpu_suite.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_suite_runs_every_bench_on_the_cpu(tmp_path):
    done = run_suite("--device", "cpu", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "0 of 4 benches failed" in done.stdout
    for name in BENCHES:
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result["machine"]["device"] == "cpu", name
        assert result["config"]["preset"] == "tiny", name
    assert "== grpo_step: exit 0" in (tmp_path / "suite.log").read_text()


def test_suite_refuses_an_unknown_device(tmp_path):
    done = run_suite("--device", "tpu", "--out", str(tmp_path))
    assert done.returncode == 2 and "--device must be cuda or cpu, got tpu" in done.stderr
    assert not list(tmp_path.iterdir())


def test_suite_refuses_an_unknown_bench(tmp_path):
    done = run_suite("--device", "cpu", "--benches", "rm_throughput,rl_overhead", "--out", str(tmp_path))
    assert done.returncode == 2 and "unknown bench rl_overhead" in done.stderr
