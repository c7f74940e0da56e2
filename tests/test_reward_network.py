import json

import numpy as np
import pytest
import torch

from vlm_rewards.interface import RewardModel, RewardRequest
from vlm_rewards.models.backbones import build_tiny_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.reward_network import CONFIG_FILE, RewardNetwork
from vlm_rewards.registry import build_reward


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory):
    return build_tiny_backbone("qwen2_5_vl", tmp_path_factory.mktemp("backbone"))


@pytest.fixture
def clips(world):
    rng = np.random.default_rng(0)
    episodes = [world.rollout(rng, t, "expert") for t in (3, 5, 4)]
    return [RewardRequest(e.frames, e.instruction, reference=e.goal_frame) for e in episodes]


def saved_reward(backbone_dir, tmp_path, **config):
    torch.manual_seed(0)
    model = RewardNetwork.from_backbone(backbone_dir, RewardNetworkConfig(**config))
    model.save_pretrained(tmp_path / "rm", extra={"step": 0})
    return build_reward({"kind": "trained_rm", "model": str(tmp_path / "rm"), "batch_size": 2})


@pytest.mark.parametrize("head", ["regression", "bins"])
def test_progress_rm_scores_every_frame_in_one_pass(backbone_dir, tmp_path, clips, head):
    reward = saved_reward(backbone_dir, tmp_path, head=head, num_bins=8)
    assert isinstance(reward, RewardModel) and reward.spec.dense and reward.spec.causal
    results = reward.score(clips)
    for request, result in zip(clips, results):
        assert result.progress.shape == (request.num_frames,)
        assert np.all((result.progress >= 0) & (result.progress <= 1))
        assert result.reward == result.progress[-1]
    alone = reward.score(clips[1:2])[0]
    np.testing.assert_allclose(alone.progress, results[1].progress, atol=1e-5)  # padding changes nothing


def test_one_pass_equals_scoring_each_prefix(backbone_dir, tmp_path, clips):
    """A frame's progress depends only on the instruction and the frames up to it (causal readout)."""
    reward = saved_reward(backbone_dir, tmp_path)
    request = clips[1]
    full = reward.score([request])[0].progress
    prefixes = [RewardRequest(request.frames[: t + 1], request.text) for t in range(request.num_frames)]
    np.testing.assert_allclose([r.reward for r in reward.score(prefixes)], full, atol=1e-5)


def test_reference_frames_are_used_only_when_configured(backbone_dir, tmp_path, clips):
    without = saved_reward(backbone_dir, tmp_path / "a").score(clips[:1])[0].progress
    stripped = [RewardRequest(clips[0].frames, clips[0].text)]
    np.testing.assert_allclose(saved_reward(backbone_dir, tmp_path / "b").score(stripped)[0].progress, without)
    with_goal = saved_reward(backbone_dir, tmp_path / "c", use_reference=True).score(clips[:1])[0].progress
    assert not np.allclose(with_goal, without)


def test_preference_rm_prefer_is_bradley_terry(backbone_dir, tmp_path, clips):
    reward = saved_reward(backbone_dir, tmp_path, task="preference", head="scalar")
    assert not reward.spec.dense
    a, b = clips[:2], clips[1:3]
    rewards_a = np.array([r.reward for r in reward.score(a)])
    rewards_b = np.array([r.reward for r in reward.score(b)])
    np.testing.assert_allclose(reward.prefer(a, b), 1 / (1 + np.exp(rewards_b - rewards_a)), atol=1e-5)


def test_saved_head_round_trips(backbone_dir, tmp_path, clips):
    torch.manual_seed(1)
    model = RewardNetwork.from_backbone(backbone_dir, RewardNetworkConfig(head="bins", num_bins=4)).eval()
    version = model.save_pretrained(tmp_path / "rm")
    loaded = RewardNetwork.from_pretrained(tmp_path / "rm").eval()
    with torch.no_grad():
        batch = model.encode(clips)
        torch.testing.assert_close(model.predict(batch), loaded.predict(loaded.encode(clips)))
    assert json.loads((tmp_path / "rm" / CONFIG_FILE).read_text())["version"] == version


def test_bad_inputs_and_folders(backbone_dir, tmp_path, clips):
    reward = saved_reward(backbone_dir, tmp_path, max_frames=4)
    with pytest.raises(ValueError, match=r"requests\[0\].frames: clip of 5 frames; rm takes at most 4"):
        reward.score(clips[1:2])
    with pytest.raises(ValueError, match="frames of size 8x8; rm expects sides between 28"):
        reward.score([RewardRequest(np.zeros((2, 8, 8, 3), np.uint8), "move")])
    with pytest.raises(ValueError, match="text: expected a non-empty"):
        reward.score([RewardRequest(clips[0].frames, "")])
    with pytest.raises(ValueError, match="no reward_model.json; expected a reward-model folder"):
        RewardNetwork.from_pretrained(backbone_dir)
    (tmp_path / "rm" / CONFIG_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="reward_model.json: not a valid reward-model config"):
        RewardNetwork.from_pretrained(tmp_path / "rm")
    with pytest.raises(ValueError, match="a preference model needs a head in"):
        RewardNetworkConfig(task="preference", head="bins")
