import json
import zlib

import numpy as np
import pytest

from vlm_rewards.data.build import SyntheticData
from vlm_rewards.data.episodes import EpisodeRecord, write_episodes
from vlm_rewards.evaluation.config import EvalRMConfig
from vlm_rewards.evaluation.evaluate import frame_pair_accuracy, run_eval
from vlm_rewards.interface import RewardRequest, RewardResult


def clock(request: RewardRequest) -> RewardResult:
    """Progress = elapsed time: blind to what happens in the frames."""
    progress = np.linspace(0, 1, request.num_frames)
    return RewardResult(reward=float(progress[-1]), progress=progress)


def instructed_clock(request: RewardRequest) -> RewardResult:
    """A clock whose final value depends on the instruction's text."""
    progress = np.linspace(0, 1, request.num_frames) * (zlib.crc32(request.text.encode()) % 100 + 1) / 100
    return RewardResult(reward=float(progress[-1]), progress=progress)


def short_sighted(request: RewardRequest) -> RewardResult:
    """Reads progress off the frames' brightness in clips of up to 8 frames, and is noisy in longer ones: an RM
    that holds only at its training clip length."""
    progress = request.frames.mean(axis=(1, 2, 3)) / 255
    if request.num_frames > 8:
        progress = progress + np.random.default_rng(int(request.frames.sum())).normal(0, 0.3, request.num_frames)
    return RewardResult(reward=float(progress[-1]), progress=progress)


def small_eval(tmp_path, reward, **overrides) -> EvalRMConfig:
    synthetic = SyntheticData(num_episodes=24, num_pairs=16, num_frames=8, seed=7)
    return EvalRMConfig(reward=reward, synthetic=synthetic, output_dir=tmp_path, **overrides)


def test_pixel_baseline_tracks_progress_but_ignores_language(tmp_path):
    metrics = run_eval(small_eval(tmp_path, "goal_pixel_progress"))
    assert metrics["voc_expert"] > 0.6 and metrics["voc_reversed"] < 0
    assert metrics["success_auc"] > 0.8
    assert metrics["mismatch_accuracy"] == 0.0  # the goal image, not the instruction, drives it
    assert metrics["instruction_sensitivity"] == 0.0
    assert metrics["pixel_sensitivity"] > 0.05  # a still first frame never gets closer to the goal
    assert json.loads((tmp_path / "metrics.json").read_text())["voc_expert"] == metrics["voc_expert"]
    assert (tmp_path / "progress_curves.png").stat().st_size > 1000


def test_a_clock_is_caught_by_reversed_clips(tmp_path):
    reward = {"kind": "function", "function": "tests.test_evaluate:clock", "dense": True}
    metrics = run_eval(small_eval(tmp_path, reward, evaluate_pairs=True))
    assert metrics["voc_expert"] == pytest.approx(1.0)
    assert metrics["voc_reversed"] == pytest.approx(1.0)  # a real progress model must go negative here
    assert metrics["voc_random"] == pytest.approx(1.0)
    assert metrics["pair_accuracy"] == 0.5  # single images: every pair is a tie
    assert metrics["instruction_sensitivity"] == 0.0
    assert metrics["pixel_sensitivity"] == 0.0  # blind to the frames, as reversed clips also show


def test_instruction_sensitivity_is_the_mean_change_of_the_final_reward(tmp_path):
    reward = {"kind": "function", "function": "tests.test_evaluate:instructed_clock", "dense": True}
    metrics = run_eval(small_eval(tmp_path, reward, evaluate_pairs=False))
    mean_change = abs(metrics["reward_matched_instruction"] - metrics["reward_mismatched_instruction"])
    assert metrics["instruction_sensitivity"] >= mean_change - 1e-12  # mean |a − b| ≥ |mean a − mean b|
    assert metrics["instruction_sensitivity"] > 0.05


def test_frame_pair_accuracy():
    label = np.array([0.0, 0.5, 1.0])
    assert frame_pair_accuracy([label], [label]) == 1.0
    assert frame_pair_accuracy([label[::-1]], [label]) == 0.0
    assert frame_pair_accuracy([np.zeros(3)], [label]) == 0.5


def test_progress_metrics_need_progress(tmp_path):
    with pytest.raises(ValueError, match="motion_penalty returns no per-frame progress"):
        run_eval(small_eval(tmp_path, "motion_penalty", evaluate_pairs=False))


def test_a_single_task_dataset_has_no_instruction_metrics(tmp_path):
    """Meta-World style: every episode has one instruction, so there is none to swap in."""
    rng = np.random.default_rng(0)
    records = [
        EpisodeRecord(i, "press the button", rng.integers(0, 256, (6, 28, 28, 3), dtype=np.uint8),
                      np.linspace(0, 1, 6, dtype=np.float32), True, "expert")
        for i in range(3)
    ]  # fmt: skip
    write_episodes(tmp_path / "episodes", records)
    reward = {"kind": "function", "function": "tests.test_evaluate:clock", "dense": True}
    metrics = run_eval(EvalRMConfig(reward=reward, episodes=tmp_path / "episodes", output_dir=tmp_path / "eval"))
    assert metrics["voc_expert"] == pytest.approx(1.0)
    assert np.isnan(metrics["mismatch_accuracy"]) and np.isnan(metrics["reward_mismatched_instruction"])
    assert np.isnan(metrics["instruction_sensitivity"])


def test_a_dataset_without_experts_has_no_expert_metrics(tmp_path):
    """Random-action episodes only: the expert and reversed VOC are NaN, the label metrics are still scored."""
    rng = np.random.default_rng(0)
    records = [
        EpisodeRecord(i, "reach the red target", rng.integers(0, 256, (6, 28, 28, 3), dtype=np.uint8),
                      rng.uniform(0, 1, 6).astype(np.float32), False, "random")
        for i in range(3)
    ]  # fmt: skip
    write_episodes(tmp_path / "episodes", records)
    reward = {"kind": "function", "function": "tests.test_evaluate:clock", "dense": True}
    metrics = run_eval(EvalRMConfig(reward=reward, episodes=tmp_path / "episodes", output_dir=tmp_path / "eval"))
    assert np.isnan(metrics["voc_expert"]) and np.isnan(metrics["voc_reversed"])
    assert np.isnan(metrics["pixel_sensitivity"])
    assert metrics["voc_random"] == pytest.approx(1.0) and np.isfinite(metrics["step_correlation"])
    assert metrics["num_expert_episodes"] == 0


def test_step_correlation_at_clip_frames_shows_an_rm_that_holds_only_at_its_training_length(tmp_path):
    rng = np.random.default_rng(0)
    records = []
    for i in range(12):
        label = np.clip(np.cumsum(rng.uniform(-0.05, 0.15, 24)), 0, 1).astype(np.float32)
        frames = np.broadcast_to((label * 255).astype(np.uint8)[:, None, None, None], (24, 8, 8, 3)).copy()
        records.append(EpisodeRecord(i, "reach the red target", frames, label, True, "expert"))
    write_episodes(tmp_path / "episodes", records)
    reward = {"kind": "function", "function": "tests.test_evaluate:short_sighted", "dense": True}
    config = EvalRMConfig(reward=reward, episodes=tmp_path / "episodes", output_dir=tmp_path / "eval")
    assert "step_correlation_at_clip_frames" not in run_eval(config)
    metrics = run_eval(config.model_copy(update={"clip_frames": 8}))
    assert metrics["step_correlation_at_clip_frames"] > 0.95
    assert metrics["step_correlation"] < 0.5


def test_step_correlation_per_policy_shows_where_the_steps_go_wrong(tmp_path):
    """The reward reads brightness; only the expert's frames show its progress, the trained policy's do not."""
    rng = np.random.default_rng(1)
    records = []
    for i in range(16):
        label = np.clip(np.cumsum(rng.uniform(-0.05, 0.2, 8)), 0, 1).astype(np.float32)
        policy = "expert" if i % 2 else "trained"
        shown = label if policy == "expert" else rng.uniform(0, 1, 8)
        frames = np.broadcast_to((shown * 255).astype(np.uint8)[:, None, None, None], (8, 8, 8, 3)).copy()
        records.append(EpisodeRecord(i, "reach the red target", frames, label, policy == "expert", policy))
    write_episodes(tmp_path / "episodes", records)
    reward = {"kind": "function", "function": "tests.test_evaluate:short_sighted", "dense": True}
    metrics = run_eval(EvalRMConfig(reward=reward, episodes=tmp_path / "episodes", output_dir=tmp_path / "eval"))
    assert metrics["step_correlation_policy_expert"] > 0.99
    assert abs(metrics["step_correlation_policy_trained"]) < 0.3
    assert metrics["step_correlation_policy_trained"] < metrics["step_correlation"] < 0.99
