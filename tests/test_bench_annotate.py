"""Smoke test of bench/annotate_throughput.py at tiny sizes: it runs, reports what it should, and the
job it times produces the reward-alone values (what is timed is right; the timings are not checked)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "annotate_throughput.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("annotate_throughput", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_annotate_throughput_bench_runs_and_times_the_right_outputs(bench, tmp_path):
    config = bench.BenchConfig(num_videos=3, frames=5, frame_size=32, workers=1, backend="thread", batch_size=2,
                               max_frames=4, warmup=0, repeats=1, threads=1, num_layers=1)  # fmt: skip
    result = bench.run_benchmark(config, tmp_path)
    phases = {"job", "reward_alone", "decode_one_worker", "decode_pool"}
    assert phases <= set(result["frames_per_s"]) and phases | {"pool_start"} <= set(result["median_seconds"])
    for key in ("ratio_job_vs_reward", "ratio_paired_median", "ratio_without_pool_start",
                "decode_frames_per_s_per_worker", "target", "target_met", "machine", "config"):  # fmt: skip
        assert key in result
    assert (result["frames"], result["episodes"], result["annotated"], result["failed"]) == (15, 3, 3, 0)
    assert all(value > 0 for value in result["frames_per_s"].values())
    # 5 frames, budget 4: subsampled, then expanded back to every frame, as in the job
    assert result["frames_per_request"] == [4]
    check = result["check"]
    assert check == {"episodes": 3, "missing": 0, "max_abs_diff": 0.0, "equal": True}
