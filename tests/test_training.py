"""The training loop: it runs, it resumes exactly, and (marked slow, reduced for CI) it learns."""

import json

import pytest
import torch
from safetensors.torch import load_file

from vlm_rewards.config import load_job_config
from vlm_rewards.registry import build_reward
from vlm_rewards.training import batches as batches_module
from vlm_rewards.training.config import TrainRMConfig
from vlm_rewards.training.train import run_training

TINY_RUN = [
    "model.backbone=tiny",
    "optim.steps=6",
    "optim.batch_size=4",
    "optim.warmup_steps=2",
    "log_every=1",
    "eval_every=100",
    "save_every=3",
    "data.synthetic_train.num_episodes=12",
    "data.synthetic_train.num_pairs=12",
    "data.synthetic_train.num_frames=6",
    "data.synthetic_eval.num_episodes=6",
    "data.synthetic_eval.num_pairs=6",
    "data.synthetic_eval.num_frames=6",
    "model.tiny.num_layers=1",
    "model.tiny.vision_depth=1",
]


def tiny_config(output_dir, *overrides) -> TrainRMConfig:
    return load_job_config(
        TrainRMConfig, "configs/train_rm/progress_tiny.yaml", [*TINY_RUN, f"output_dir={output_dir}", *overrides]
    )


def test_shipped_train_and_eval_configs_validate():
    from pathlib import Path

    from vlm_rewards.evaluation.config import EvalRMConfig

    for path in Path("configs/train_rm").glob("*.yaml"):
        load_job_config(TrainRMConfig, path)
    for path in Path("configs/eval_rm").glob("*.yaml"):
        load_job_config(EvalRMConfig, path)


@pytest.mark.parametrize("task_overrides", [[], ["model.reward.task=preference", "model.reward.head=scalar"]])
def test_training_writes_a_usable_reward_model(tmp_path, task_overrides):
    metrics = run_training(tiny_config(tmp_path, *task_overrides))
    assert (tmp_path / "model" / "reward_model.json").exists()
    assert (tmp_path / "training_curves.png").stat().st_size > 1000
    assert json.loads((tmp_path / "metrics.json").read_text())["step"] == 6
    reward = build_reward({"kind": "trained_rm", "model": str(tmp_path / "model")})
    key = "voc_expert" if reward.spec.dense else "pair_accuracy"
    assert key in metrics
    history = json.loads((tmp_path / "history.json").read_text())
    assert [step for step, _ in history["train/loss"]] == list(range(1, 7))


def test_head_only_updates_train_the_head_before_the_backbone(tmp_path):
    run_training(tiny_config(tmp_path, "optim.warmup_steps=0", "optim.head_only_updates=4"))
    backbone_lrs = [lr for _, lr in json.loads((tmp_path / "history.json").read_text())["train/lr"]]
    assert backbone_lrs[:3] == [0.0, 0.0, 0.0] and backbone_lrs[3] > 0  # the lr of the update after each step


def test_step_loss_weight_adds_the_step_term(tmp_path):
    first_losses = {}
    for weight in (0.0, 5.0):
        run_training(tiny_config(tmp_path / str(weight), f"optim.step_loss_weight={weight}"))
        first_losses[weight] = json.loads((tmp_path / str(weight) / "history.json").read_text())["train/loss"][0][1]
    assert first_losses[5.0] > first_losses[0.0] + 1.0  # an untrained reward's steps barely correlate


def test_resume_continues_exactly_where_it_stopped(tmp_path, monkeypatch):
    uninterrupted = tmp_path / "uninterrupted"
    run_training(tiny_config(uninterrupted))

    original_batch = batches_module.ProgressBatches.batch

    def crash_at_step_4(self, step, rank=0):
        if step == 4:
            raise KeyboardInterrupt("simulated crash")
        return original_batch(self, step, rank)

    interrupted = tmp_path / "interrupted"
    monkeypatch.setattr(batches_module.ProgressBatches, "batch", crash_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        run_training(tiny_config(interrupted))
    monkeypatch.setattr(batches_module.ProgressBatches, "batch", original_batch)
    assert (interrupted / "checkpoints" / "step_3" / "complete").exists()
    run_training(tiny_config(interrupted))

    for name in ("reward_head.safetensors", "model.safetensors"):
        expected, resumed = load_file(uninterrupted / "model" / name), load_file(interrupted / "model" / name)
        for key in expected:
            torch.testing.assert_close(resumed[key], expected[key], msg=f"{name}:{key}")


@pytest.mark.slow
def test_preference_rm_learns_from_scratch(tmp_path):
    """Reduced version of examples/train_from_scratch.sh: held-out pair accuracy clearly above chance."""
    config = load_job_config(
        TrainRMConfig,
        "configs/train_rm/preference_tiny.yaml",
        [
            f"output_dir={tmp_path}",
            "optim.steps=500",
            "eval_every=1000",
            "data.synthetic_train.num_pairs=2000",
            "data.synthetic_eval.num_pairs=200",
        ],
    )
    metrics = run_training(config)
    assert metrics["pair_accuracy"] > 0.6  # chance is 0.5; 200 pairs put 0.6 over 2.8 standard errors away


@pytest.mark.slow
def test_progress_rm_learns_to_read_the_frames(tmp_path):
    """Reduced examples/train_from_scratch.sh: a short preference stage, then a short progress stage on
    its backbone. Above chance means the frames are read: a model blind to them (instruction and frame
    position only) gives reversed clips the same VOC as the expert clips. Instruction use shows up only
    later in training (docs/benchmarks.md), so this reduced run does not assert it."""
    stage_one = [f"output_dir={tmp_path / 'preference'}", "optim.steps=500", "eval_every=1000"]
    stage_one += ["data.synthetic_train.num_pairs=2000", "data.synthetic_eval.num_pairs=32"]
    run_training(load_job_config(TrainRMConfig, "configs/train_rm/preference_tiny.yaml", stage_one))
    stage_two = [f"output_dir={tmp_path / 'progress'}", f"model.backbone={tmp_path / 'preference' / 'model'}"]
    stage_two += ["optim.steps=300", "eval_every=1000", "data.synthetic_train.num_episodes=600"]
    stage_two += ["data.synthetic_eval.num_episodes=48"]
    metrics = run_training(load_job_config(TrainRMConfig, "configs/train_rm/progress_tiny.yaml", stage_two))
    assert metrics["voc_expert"] - metrics["voc_reversed"] > 0.3
