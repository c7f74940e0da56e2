"""Smoke tests of bench/annotate_throughput.py at tiny sizes: it runs, reports what it should, and the
job it times produces the reward-alone values (what is timed is right; the timings are not checked)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "annotate_throughput.py"
TIMED = {"job", "reward_alone", "decode_one_worker", "decode_pool"}
EQUAL = {"episodes": 3, "missing": 0, "max_abs_diff": 0.0, "equal": True}


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("annotate_throughput", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def small_config(bench, **overrides):
    return bench.BenchConfig(**{"num_videos": 3, "frames": 5, "frame_size": 32, "workers": 1, "backend": "thread",
                                "batch_size": 2, "max_frames": 4, "repeats": 1, "threads": 1, "num_layers": 1,
                                **overrides})  # fmt: skip


def test_annotate_throughput_bench_runs_and_times_the_right_outputs(bench, tmp_path):
    result = bench.run_benchmark(small_config(bench), tmp_path)
    assert set(result["frames_per_s"]) == TIMED
    assert set(result["median_seconds"]) == TIMED | {"reward_build", "pool_start"}
    for key in ("ratio_job_vs_reward", "ratio_paired_median", "ratio_main_cpu", "decode_frames_per_s_per_worker",
                "target", "target_met", "machine", "config"):  # fmt: skip
        assert key in result
    assert set(result["median_cpu_seconds"]["job"]) == {"main", "workers"}
    assert 0 < result["median_job_in_reward"]["seconds"] < result["median_seconds"]["job"]
    assert (result["frames"], result["episodes"], result["annotated"], result["failed"]) == (15, 3, 3, 0)
    assert all(value > 0 for value in result["frames_per_s"].values())
    # 5 frames, budget 4: subsampled, then expanded back to every frame, as in the job
    assert result["frames_per_request"] == [4]
    assert result["check"] == EQUAL


def test_3b_preset_builds_its_rm_in_memory(bench, tmp_path, monkeypatch):
    """The qwen2_5_vl_3b preset's path (an RM built in memory with the same weights in every build,
    behind the trained-RM interface), run with the tiny config in place of the 3B one."""
    from bench import _common

    monkeypatch.setattr(_common, "qwen2_5_vl_3b_config", lambda tiny: tiny)
    result = bench.run_benchmark(small_config(bench, preset="qwen2_5_vl_3b", frame_size=56), tmp_path)
    assert result["config"]["frame_size"] == 56
    assert result["check"] == EQUAL
