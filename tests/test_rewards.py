import numpy as np
import pytest

from vlm_rewards.interface import RewardRequest
from vlm_rewards.normalization import RunningMeanStd, group_zscore
from vlm_rewards.registry import build_reward, known_kinds, register
from vlm_rewards.rewards.composite import CompositeReward
from vlm_rewards.rewards.function import FunctionReward
from vlm_rewards.rewards.rules import GoalPixelProgress, MotionPenalty


def mean_pixel(request: RewardRequest) -> float:
    return float(request.frames.mean())


def test_goal_pixel_progress_ranks_expert_above_wrong_object(world):
    rng = np.random.default_rng(1)
    reward = GoalPixelProgress()
    expert = [world.rollout(rng, 10, "expert") for _ in range(6)]
    wrong = [world.rollout(rng, 10, "wrong_object") for _ in range(6)]
    score = lambda eps: [
        r.reward for r in reward.score([RewardRequest(e.frames, e.instruction, e.goal_frame) for e in eps])
    ]
    assert min(score(expert)) > max(score(wrong))
    (result,) = reward.score([RewardRequest(expert[0].frames, expert[0].instruction, expert[0].goal_frame)])
    assert result.progress.shape == (10,) and result.progress[0] == 0.0
    assert np.all((result.progress >= 0) & (result.progress <= 1))


def test_goal_pixel_progress_needs_a_goal(expert_requests):
    request = expert_requests[0]
    with pytest.raises(ValueError, match=r"requests\[0\].reference: goal_pixel_progress needs a goal frame"):
        GoalPixelProgress().score([RewardRequest(request.frames, request.text)])
    small_goal = np.zeros((1, 8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match=r"goal of shape \(8, 8, 3\), expected the frames' shape"):
        GoalPixelProgress().score([RewardRequest(request.frames, request.text, small_goal)])


def test_motion_penalty_is_zero_for_a_still_clip():
    still = np.full((5, 8, 8, 3), 100, np.uint8)
    moving = still.copy()
    moving[1::2] = 200
    results = MotionPenalty(scale=2.0).score([RewardRequest(still, "t"), RewardRequest(moving, "t")])
    assert results[0].reward == 0.0
    assert results[1].reward == pytest.approx(-2.0 * 100 / 255)


def test_running_mean_std_matches_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3, 2, size=n) for n in (5, 17, 1, 40)]
    stats = RunningMeanStd()
    for batch in batches:
        stats.update(batch)
    everything = np.concatenate(batches)
    assert stats.mean == pytest.approx(everything.mean())
    assert stats.var == pytest.approx(everything.var())
    assert stats.count == everything.size


def test_group_zscore():
    values = np.array([1.0, 3.0, 5.0, 5.0, np.nan, 7.0])
    z = group_zscore(values, ["a", "a", "b", "b", "c", "c"])
    np.testing.assert_allclose(z[:2], [-1, 1], atol=1e-3)
    np.testing.assert_array_equal(z[2:4], [0, 0])  # all-equal group
    assert np.isnan(z[4]) and z[5] == 0.0  # a failed sample stays NaN and is left out of its group's stats
    with pytest.raises(ValueError, match="3 values but 2 group labels"):
        group_zscore(np.zeros(3), ["a", "b"])


def test_shipped_composite_builds_and_scores(expert_requests):
    reward = build_reward("demo_composite")
    results = reward.score(expert_requests)
    for result in results:
        expected = result.aux["goal_pixel_progress"] + 2.0 * result.aux["smoothness"]
        assert result.reward == pytest.approx(expected)
    assert reward.spec.value_range == (-2.0, 1.0)


def test_composite_group_normalization_zscores_within_prompts():
    frames = [np.full((1, 4, 4, 3), v, np.uint8) for v in (10, 20, 30, 100, 200)]
    texts = ["a", "a", "a", "b", "b"]
    reward = CompositeReward([FunctionReward(mean_pixel)], weights=[2.0], normalize=["group"])
    rewards = np.array([r.reward for r in reward.score([RewardRequest(f, t) for f, t in zip(frames, texts)])])
    np.testing.assert_allclose(rewards[:3].mean(), 0, atol=1e-9)
    np.testing.assert_allclose(rewards[:3].std(), 2.0, rtol=1e-3)
    np.testing.assert_allclose(rewards[3:], [-2.0, 2.0], rtol=1e-3)


def test_composite_running_normalization_remembers_past_batches():
    reward = CompositeReward([FunctionReward(mean_pixel)], weights=[1.0], normalize=["running"])
    batch = lambda *values: [RewardRequest(np.full((1, 2, 2, 3), v, np.uint8), "t") for v in values]
    reward.score(batch(0, 10))
    (later,) = reward.score(batch(100))
    values = np.array([0.0, 10.0, 100.0])
    assert later.reward == pytest.approx((100 - values.mean()) / values.std(), rel=1e-6)


def test_composite_propagates_a_component_error():
    def failing(request):
        from vlm_rewards.interface import RewardResult

        return RewardResult(reward=float("nan"), aux={"error": "unparseable answer"})

    reward = CompositeReward([FunctionReward(failing, name="judge"), FunctionReward(mean_pixel)], [1, 1], ["none"] * 2)
    (result,) = reward.score([RewardRequest(np.zeros((1, 2, 2, 3), np.uint8), "t")])
    assert np.isnan(result.reward) and result.aux["error"] == "judge: unparseable answer"


def test_function_reward_from_yaml_mapping():
    reward = build_reward({"kind": "function", "function": "tests.test_rewards:mean_pixel", "name": "mp"})
    (result,) = reward.score([RewardRequest(np.full((1, 2, 2, 3), 7, np.uint8), "t")])
    assert result.reward == 7.0 and reward.spec.name == "mp"


@pytest.mark.parametrize(
    "config, message",
    [
        ({"name": "x"}, "missing `kind`"),
        ({"kind": "nope"}, "unknown reward kind 'nope'; known kinds: "),
        ({"kind": "motion_penalty", "scale": -1}, r"kind 'motion_penalty'\): scale: Input should be greater than 0"),
        ({"kind": "motion_penalty", "scael": 1}, "scael: Extra inputs are not permitted"),
        ({"kind": "composite", "components": []}, "components: List should have at least 1 item"),
        ({"kind": "function", "function": "os.path"}, "expected 'package.module:function'"),
        ({"kind": "function", "function": "no_such_module:f"}, "could not be imported"),
    ],
)
def test_bad_reward_configs(config, message):
    with pytest.raises(ValueError, match=message):
        build_reward(config)


def test_missing_reward_file():
    with pytest.raises(ValueError, match="reward config 'missing.yaml' not found"):
        build_reward("missing.yaml")


def test_user_registered_kind():
    import pydantic

    @register("constant_for_test")
    class Constant(FunctionReward):
        class Params(pydantic.BaseModel):
            value: float

        @classmethod
        def from_params(cls, params):
            return cls(lambda request: params.value, name="constant")

    assert "constant_for_test" in known_kinds()
    (result,) = build_reward({"kind": "constant_for_test", "value": 0.25}).score(
        [RewardRequest(np.zeros((1, 2, 2, 3), np.uint8), "t")]
    )
    assert result.reward == 0.25


def test_every_shipped_reward_config_builds():
    from vlm_rewards.registry import REWARDS_DIR

    for path in REWARDS_DIR.glob("*.yaml"):
        if path.stem in CONFIGS_NEEDING_WEIGHTS:
            continue
        assert build_reward(path).spec.name


CONFIGS_NEEDING_WEIGHTS = {"clip_goal", "progress_tiny", "preference_tiny", "vlm_judge", "gvl_progress"}
