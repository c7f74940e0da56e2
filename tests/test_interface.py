import asyncio
import json
import math

import numpy as np
import pytest

from vlm_rewards.interface import (
    BaseReward,
    RewardModel,
    RewardRequest,
    RewardResult,
    RewardSpec,
    score_each,
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


def test_ascore_equals_score(reward):
    requests = [RewardRequest(clip(value=v), "t") for v in (0, 100, 255)]
    assert asyncio.run(reward.ascore(requests)) == reward.score(requests)


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
        (dict(frames=clip(), text="t", views=None), r"views: expected a mapping"),
        (dict(frames=clip(t=2), text="t", frame_index=np.array([3, 1])), r"frame_index: expected 2 strictly"),
        (dict(frames=clip(t=2), text="t", frame_index=np.array([0, 1, 2])), r"frame_index: expected 2 strictly"),
        (dict(frames=clip(t=2), text="t", frame_index=np.array([0.0, 1.0])), r"frame_index: expected 2 strictly"),
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


class Fixed(BaseReward):
    """Returns whatever result it is given, to test result validation."""

    def __init__(self, result: RewardResult, **spec):
        self.result = result
        self.spec = RewardSpec(**{"name": "fixed", "version": "v1", "value_range": (0.0, 1.0), **spec})

    def _score(self, requests):
        return [self.result for _ in requests]


def test_spec_limits_are_enforced():
    model = Fixed(RewardResult(0.5), frame_size=(4, 16), max_frames=3, max_text_length=10)
    with pytest.raises(ValueError, match="clip of 4 frames; fixed takes at most 3"):
        model.score([RewardRequest(clip(t=4), "t")])
    with pytest.raises(ValueError, match="frames of size 2x2; fixed expects sides between 4 and 16"):
        model.score([RewardRequest(clip(h=2, w=2), "t")])
    with pytest.raises(ValueError, match=r"text: 11 characters; fixed takes at most 10"):
        model.score([RewardRequest(clip(), "x" * 11)])


def test_requirements_are_refused_at_the_boundary():
    model = Fixed(RewardResult(0.5), requires=("reference", "view:wrist"))
    with pytest.raises(ValueError, match=r"requests\[0\].reference: fixed needs reference/goal frames, got None"):
        model.score([RewardRequest(clip(), "t", views={"wrist": clip()})])
    with pytest.raises(ValueError, match=r"requests\[0\].views: fixed needs the camera view 'wrist'"):
        model.score([RewardRequest(clip(), "t", reference=clip(t=1))])
    with pytest.raises(ValueError, match="requires entry 'goal'"):
        RewardSpec("bad", "v", requires=("goal",))


@pytest.mark.parametrize(
    "result, spec, message",
    [
        (RewardResult(math.nan), {}, "NaN in reward/progress/components needs an error"),
        (RewardResult(math.inf, error="x"), {}, "infinite values"),
        (RewardResult(1.5), {}, r"values 1.5..1.5 outside the spec's value range \[0.0, 1.0\]"),
        (RewardResult(0.5), {"dense": True}, r"progress: fixed is dense; expected shape \(2,\), got None"),
        (RewardResult(0.5, progress=np.zeros(3)), {"dense": True}, r"expected shape \(2,\), got \(3,\)"),
        (RewardResult(0.5, progress=np.array([0.1, 2.0])), {"dense": True}, "outside the spec's value range"),
        (RewardResult(0.5, progress=np.array([0.1, np.nan])), {"dense": True}, "NaN .* needs an error"),
        (RewardResult(0.5, progress=np.zeros(2)), {}, "fixed is not dense; expected None"),
        (RewardResult(0.5, components={"b": 0.1}), {"components": ("a",)}, r"components: names \['b'\]"),
        (RewardResult(0.5, components={"a": math.nan}), {"components": ("a",)}, "needs an error"),
        (RewardResult(0.5, info={"object": object()}), {}, "info: not JSON-safe"),
        (RewardResult("0.5"), {}, "reward: expected a float"),
    ],
)
def test_results_are_validated(result, spec, message):
    with pytest.raises(ValueError, match=message):
        Fixed(result, **spec).score([RewardRequest(clip(), "t")])


def test_nan_with_an_error_is_accepted():
    (result,) = Fixed(RewardResult(math.nan, error="unparsed")).score([RewardRequest(clip(), "t")])
    assert math.isnan(result.reward) and not result.ok


def test_results_and_specs_round_trip_through_json():
    result = RewardResult(
        reward=math.nan,
        progress=np.array([0.25, np.nan]),
        components={"a": 1.0, "b": math.nan},
        info={"answer": "Frame 1: 25%", "logits": np.array([1.5, -2.0]), "order": (1, 0)},
        error="frame 2 unparsed",
    )
    text = json.dumps(result.to_json(), allow_nan=False)
    back = RewardResult.from_json(json.loads(text))
    assert math.isnan(back.reward) and back.error == result.error
    np.testing.assert_array_equal(back.progress, result.progress)
    assert list(back.components) == ["a", "b"] and math.isnan(back.components["b"])
    assert back.info == {"answer": "Frame 1: 25%", "logits": [1.5, -2.0], "order": [1, 0]}

    spec = RewardSpec("s", "v", (-math.inf, 0.0), dense=True, causal=True, requires=("reference",), max_frames=8)
    spec_text = json.dumps(spec.to_json(), allow_nan=False)
    assert RewardSpec.from_json(json.loads(spec_text)) == spec


def test_causal_needs_dense():
    with pytest.raises(ValueError, match="causal=True needs dense=True"):
        RewardSpec("s", "v", causal=True)


def test_rescoring_session_equals_scoring_prefixes():
    def mean_per_frame(request):
        values = request.frames.mean(axis=(1, 2, 3)) / 255
        return RewardResult(reward=float(values[-1]), progress=values)

    dense = FunctionReward(mean_per_frame, value_range=(0.0, 1.0), dense=True, causal=True)
    frames = [np.stack([np.full((4, 4, 3), v, np.uint8) for v in values]) for values in ([0, 51, 255], [10, 20])]
    with dense.open_session(["a", "b"]) as session:
        first = session.append([frames[0][:2], frames[1][:1]])
        second = session.append([frames[0][2:], frames[1][1:]])
        assert session.num_frames == [3, 2]
        session.reset(1, "b")
        assert session.num_frames == [3, 0]
    np.testing.assert_allclose(np.concatenate([first[0], second[0]]), [0.0, 0.2, 1.0])
    np.testing.assert_allclose(np.concatenate([first[1], second[1]]), [10 / 255, 20 / 255])

    scalar = FunctionReward(brightness, value_range=(0.0, 1.0))
    with scalar.open_session(["a"]) as session:
        (values,) = session.append([frames[0]])
    np.testing.assert_allclose(values, [0.0, 0.2, 1.0])  # the reward of each prefix


def test_session_refuses_mismatched_appends(reward):
    with reward.open_session(["a", "b"]) as session:
        with pytest.raises(ValueError, match="1 frame arrays and 1 view dicts for 2 streams"):
            session.append([clip()])
        session.append([clip(), clip()])
        with pytest.raises(ValueError, match=r"frames\[1\]: frames of shape \(4, 4, 3\), the stream began with"):
            session.append([clip(), clip(h=4, w=4)])


def test_function_reward_may_return_results_with_progress():
    def per_frame(request):
        values = request.frames.mean(axis=(1, 2, 3)) / 255
        return RewardResult(reward=float(values[-1]), progress=values)

    frames = np.stack([np.full((4, 4, 3), v, np.uint8) for v in (0, 51, 255)])
    (result,) = FunctionReward(per_frame, dense=True).score([RewardRequest(frames, "t")])
    np.testing.assert_allclose(result.progress, [0.0, 0.2, 1.0])


def test_score_each_isolates_the_request_a_reward_refuses():
    def picky(request):
        if request.text == "bad":
            raise ValueError("refused")
        return 0.5

    reward = FunctionReward(picky, value_range=(0.0, 1.0))
    requests = [RewardRequest(clip(), text) for text in ("a", "bad", "b")]
    first, refused, last = score_each(reward, requests)
    assert first.reward == last.reward == 0.5 and isinstance(refused, ValueError)
    with pytest.raises(ValueError, match="refused"):
        reward.score(requests)  # the batch alone fails; score_each keeps the batch-mates
