"""Smoke test of bench/rl_reward_overhead.py: what it times runs and agrees across modes, not the timings."""

from bench.rl_reward_overhead import MODES, BenchConfig, run_benchmark


def test_reduced_overhead_benchmark_runs_every_mode_and_matches_sync(tmp_path):
    # 7 steps of 3-step episodes: resets happen inside the timed steps and a relabel call holds 4 frames
    config = BenchConfig(num_envs=(2,), steps=7, repeats=1, size=32, max_episode_steps=3, every=2, threads=1)
    result = run_benchmark(config, tmp_path)

    assert result["modes_match_sync"], result["max_abs_diff_vs_sync"]
    rows = result["rows"]
    assert [(row["reward"], row["mode"]) for row in rows] == [(None, "env step + render")] + [
        (reward, mode) for reward in ("tiny_rm", "goal_pixel_progress") for mode in MODES
    ]
    assert all(row["num_envs"] == 2 and row["env_steps_per_s"] > 0 for row in rows)
    assert all(row["overhead_wall"] > -1 and row["overhead_cpu"] > -1 for row in rows[1:])
    assert {"cpu", "load_average", "torch_threads"} <= set(result["machine"])
    fast = result["session_fast_paths"]  # the session's checked fast paths ran (and agreed with what they replace)
    assert fast["pixels_exact"] and all(fast["pixels_exact"].values()) and fast["pixel_fallback_calls"] == 0
    assert fast["vision"]["enabled"] and fast["vision"]["max_abs_diff"] < 1e-5
