import numpy as np
import pytest

from vlm_rewards.interface import (
    BaseReward,
    RewardModel,
    RewardRequest,
    RewardResult,
    RewardSpec,
)
from vlm_rewards.rewards.function import FunctionReward


def brightness(request: RewardRequest) -> float:
    return float(request.frames[-1].mean() / 255.0)


def clip(t=2, h=8, w=8, value=0) -> np.ndarray:
    return np.full((t, h, w, 3), value, dtype=np.uint8)


@pytest.fixture
def reward() -> FunctionReward:
    return FunctionReward(brightness, value_range=(0.0, 1.0))


def test_function_reward_is_a_reward_model(reward):
    assert isinstance(reward, RewardModel)
    results = reward.score([RewardRequest(clip(value=0), "dark"), RewardRequest(clip(value=255), "bright")])
    assert [r.reward for r in results] == [0.0, 1.0]
    assert reward.spec.name == "brightness" and len(reward.spec.version) == 12


def test_prefer_is_bradley_terry_on_scores(reward):
    dark, bright = RewardRequest(clip(value=0), "x"), RewardRequest(clip(value=255), "x")
    p = reward.prefer([bright, dark], [dark, bright])
    np.testing.assert_allclose(p, [1 / (1 + np.exp(-1)), 1 / (1 + np.exp(1))])
    assert p[0] > 0.5 > p[1]


@pytest.mark.parametrize(
    "request_kwargs, message",
    [
        (
            dict(frames=np.zeros((2, 8, 8, 3), dtype=np.float32), text="t"),
            r"requests\[0\].frames: expected dtype uint8",
        ),
        (dict(frames=np.zeros((8, 8, 3), dtype=np.uint8), text="t"), r"frames: expected shape \(T, H, W, 3\)"),
        (dict(frames=np.zeros((2, 8, 8, 4), dtype=np.uint8), text="t"), r"frames: expected shape"),
        (dict(frames=np.zeros((0, 8, 8, 3), dtype=np.uint8), text="t"), r"frames: empty clip"),
        (dict(frames=[[1, 2, 3]], text="t"), r"frames: expected a numpy array"),
        (dict(frames=clip(), text="  "), r"requests\[0\].text: expected a non-empty"),
        (dict(frames=clip(), text="t", reference=np.zeros((1, 8, 8), np.uint8)), r"reference: expected shape"),
        (dict(frames=clip(t=2), text="t", views={"wrist": clip(t=3)}), r"views\['wrist'\]: 3 frames, expected 2"),
    ],
)
def test_bad_requests_name_the_field(reward, request_kwargs, message):
    with pytest.raises(ValueError, match=message):
        reward.score([RewardRequest(**request_kwargs)])


def test_bad_batches(reward):
    with pytest.raises(ValueError, match="empty batch"):
        reward.score([])
    with pytest.raises(ValueError, match="expected a sequence of RewardRequest"):
        reward.score(RewardRequest(clip(), "t"))
    with pytest.raises(ValueError, match=r"requests\[1\]: expected a RewardRequest"):
        reward.score([RewardRequest(clip(), "t"), "not a request"])
    with pytest.raises(ValueError, match="a has 1 requests and b has 2"):
        reward.prefer([RewardRequest(clip(), "t")], [RewardRequest(clip(), "t")] * 2)


class Limited(BaseReward):
    spec = RewardSpec("limited", "v1", "scalar", (0.0, 1.0), frame_size=(4, 16), max_frames=3)

    def _score(self, requests):
        return [RewardResult(reward=float("nan")) for _ in requests]


def test_spec_limits_are_enforced():
    model = Limited()
    with pytest.raises(ValueError, match="clip of 4 frames; limited takes at most 3"):
        model.score([RewardRequest(clip(t=4), "t")])
    with pytest.raises(ValueError, match="frames of size 2x2; limited expects sides between 4 and 16"):
        model.score([RewardRequest(clip(h=2, w=2), "t")])


def test_nan_reward_without_error_is_rejected():
    with pytest.raises(ValueError, match=r"result\[0\].reward is nan; a non-finite reward needs aux\['error'\]"):
        Limited().score([RewardRequest(clip(), "t")])


def test_function_reward_may_return_results_with_progress():
    def per_frame(request):
        values = request.frames.mean(axis=(1, 2, 3)) / 255
        return RewardResult(reward=float(values[-1]), progress=values)

    frames = np.stack([np.full((4, 4, 3), v, np.uint8) for v in (0, 51, 255)])
    (result,) = FunctionReward(per_frame).score([RewardRequest(frames, "t")])
    np.testing.assert_allclose(result.progress, [0.0, 0.2, 1.0])
