"""Reward-weighted regression: GRPO's fine-tuning baseline on the same sampled images."""

import numpy as np
import pytest
import torch

from vlm_rewards.generation.config import RWRConfig
from vlm_rewards.generation.export import run_algorithm
from vlm_rewards.generation.models import build_tiny_generator
from vlm_rewards.generation.pretrain import flow_matching_loss
from vlm_rewards.generation.rwr import run_rwr

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REDNESS = {"kind": "function", "function": "vlm_rewards.generation.rule_rewards:redness", "value_range": [-1, 1]}


def rwr_config(tmp_path, **train) -> RWRConfig:
    return RWRConfig.model_validate(
        {
            "output_dir": str(tmp_path),
            "rewards": {"trained": [{"name": "redness", "config": REDNESS}]},
            "sampling": {"num_steps": 4, "eval_num_steps": 4, "same_noise_in_group": True},
            "train": {"prompts": ["a red circle", "a blue square"], "eval_prompts": ["a red circle", "a blue square"],
                      "eval_images_per_prompt": 4, "group_size": 8, "sample_batch_size": 16, "batches_per_epoch": 2,
                      "train_batch_size": 16, "lr": 1e-2, "inner_epochs": 4} | train,
            "temperature": 0.5,
            "eval_every": 1,
            "checkpoint_every": 1,
        }
    )  # fmt: skip


def test_rwr_raises_the_reward_it_weights_by_and_resumes(tmp_path):
    history = run_rwr(rwr_config(tmp_path, epochs=4))
    redness = dict(history["eval/reward/redness"])
    assert redness[4] > redness[0] + 0.08, redness  # seed 0: -0.046 -> 0.061
    # ODE samples, each image of a group from its own noise (same_noise_in_group is ignored): groups differ
    assert all(ratio == 0.0 for _, ratio in history["zero_std_ratio"])
    assert run_algorithm(tmp_path) == "rwr"  # what the demo's report names

    resumed = run_rwr(rwr_config(tmp_path, epochs=5))
    assert [epoch for epoch, _ in resumed["train/weighted_loss"]] == [1, 2, 3, 4, 5]  # 1-4 restored, not rerun


def test_weighted_flow_matching_loss_is_the_weighted_mean_of_per_image_losses():
    generator = build_tiny_generator("flow")
    images = np.random.default_rng(0).integers(0, 256, size=(3, *generator.latent_shape[1:], 3), dtype=np.uint8)
    embeddings = generator.encode_prompts(["a", "b", "c"])

    def loss(weights):  # the same noise every call
        return flow_matching_loss(generator, embeddings, images, torch.Generator().manual_seed(0), weights)

    per_image = torch.stack([loss(3 * torch.eye(3)[i]) for i in range(3)])  # one image's loss at a time
    weights = torch.tensor([0.0, 1.0, 2.0])
    assert per_image.min() > 0 and len(set(per_image.tolist())) == 3
    assert torch.allclose(loss(weights), (weights * per_image).mean())
    assert torch.allclose(loss(None), per_image.mean())
