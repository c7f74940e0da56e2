"""The conformance checker on every reward kind that needs weights, built on tiny random models.

Rule-based kinds are checked in tests/test_rewards.py; every shipped config in tests/test_shipped_rewards.py.
"""

import pytest
import torch

from tests.test_embedding_goal import BASELINE, _save_tiny_clip
from vlm_rewards.models.backbones import FAMILIES, build_tiny_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.models.streaming import KVCacheSession
from vlm_rewards.registry import build_reward
from vlm_rewards.testing import check_reward

SMALL_FRAMES = {"min_pixels": 4 * 28 * 28, "max_pixels": 4 * 32 * 32}  # about 4 tokens per frame: fast on CPU


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    root = tmp_path_factory.mktemp("conformance")
    return {family: build_tiny_backbone(family, root / family, num_layers=1) for family in FAMILIES}


def trained(backbone_dir, folder, **config):
    torch.manual_seed(0)
    network = RewardNetwork.from_backbone(backbone_dir, RewardNetworkConfig(max_frames=6, **SMALL_FRAMES, **config))
    network.save_pretrained(folder)
    return build_reward({"kind": "trained_rm", "model": str(folder), "device": "cpu", "batch_size": 2})


@pytest.mark.parametrize("family", FAMILIES)
def test_progress_rm_conforms(backbones, tmp_path, family):
    reward = trained(backbones[family], tmp_path / "rm")
    assert reward.spec.dense and reward.spec.causal
    assert isinstance(reward.open_session(["move the red circle"]), KVCacheSession)  # the session check streams
    check_reward(reward)


def test_progress_rm_with_a_goal_image_conforms(backbones, tmp_path):
    reward = trained(backbones["qwen2_5_vl"], tmp_path / "rm", use_reference=True)
    assert reward.spec.requires == ("reference",)
    check_reward(reward)


def test_preference_rm_conforms(backbones, tmp_path):
    reward = trained(backbones["qwen2_vl"], tmp_path / "rm", task="preference", head="scalar")
    assert not reward.spec.dense
    check_reward(reward)


@pytest.mark.parametrize("per_frame", [False, True], ids=["clip", "per_frame"])
def test_yes_no_judge_conforms(backbones, per_frame):
    judge = build_reward(
        {"kind": "vlm_judge", "model": str(backbones["qwen2_5_vl"]), "device": "cpu", "per_frame": per_frame}
        | {"max_frames": 4, **SMALL_FRAMES}
    )
    check_reward(judge, atol=1e-4)  # left padding moves logits by ~1e-6 between batch compositions


def test_gvl_judge_conforms(backbones):
    judge = build_reward(
        {"kind": "gvl_progress", "model": str(backbones["qwen2_5_vl"]), "device": "cpu", "max_new_tokens": 8}
        | {"max_frames": 4, **SMALL_FRAMES}
    )
    check_reward(judge, atol=1e-4)


def test_embedding_goal_conforms(tmp_path):
    reward = build_reward(
        {"kind": "embedding_goal", "model": str(_save_tiny_clip(tmp_path / "clip")), "baseline_prompts": [BASELINE]}
    )
    check_reward(reward)


def test_judge_version_changes_when_the_weights_change(tmp_path):
    folder = build_tiny_backbone("qwen2_vl", tmp_path / "judge", num_layers=1)
    config = {"kind": "vlm_judge", "model": str(folder), "device": "cpu"}
    before = build_reward(config).spec.version
    build_tiny_backbone("qwen2_vl", folder, num_layers=1, seed=1)  # same architecture, other weights
    assert build_reward(config).spec.version != before
