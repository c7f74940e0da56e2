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
    return load_job_config(TrainRMConfig, "configs/train_rm/progress_tiny.yaml", [*TINY_RUN, f"output_dir={output_dir}", *overrides])


def test_shipped_train_configs_validate():
    for path in ("configs/train_rm/progress_tiny.yaml", "configs/train_rm/preference_tiny.yaml", "configs/train_rm/progress_lora_qwen2_5_vl_3b.yaml"):
        load_job_config(TrainRMConfig, path)


@pytest.mark.parametrize("task_overrides", [[], ["model.reward.task=preference", "model.reward.head=scalar"]])
def test_training_writes_a_usable_reward_model(tmp_path, task_overrides):
    metrics = run_training(tiny_config(tmp_path, *task_overrides))
    assert (tmp_path / "model" / "reward_model.json").exists()
    assert (tmp_path / "training_curves.png").stat().st_size > 1000
    assert json.loads((tmp_path / "metrics.json").read_text())["step"] == 6
    reward = build_reward({"kind": "vlm_reward_model", "model": str(tmp_path / "model")})
    key = "voc_expert" if reward.spec.output == "progress" else "pair_accuracy"
    assert key in metrics
    history = json.loads((tmp_path / "history.json").read_text())
    assert [step for step, _ in history["train/loss"]] == list(range(1, 7))


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
