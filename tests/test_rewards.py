import numpy as np
import pydantic
import pytest

from vlm_rewards.interface import RewardRequest, RewardResult
from vlm_rewards.normalization import RunningMeanStd, group_statistics, group_zscore
from vlm_rewards.registry import build_reward, known_kinds, register
from vlm_rewards.rewards.composite import CompositeReward
from vlm_rewards.rewards.function import FunctionReward
from vlm_rewards.rewards.rules import DistanceSession, GoalPixelProgress, MarkerProgress, MotionPenalty
from vlm_rewards.testing import ConformanceError, check_reward


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
    message = r"requests\[0\].reference: goal_pixel_progress needs reference/goal frames, got None"
    with pytest.raises(ValueError, match=message):
        GoalPixelProgress().score([RewardRequest(request.frames, request.text)])
    small_goal = np.zeros((1, 8, 8, 3), np.uint8)
    message = r"frames: frames of shape \(56, 56, 3\), expected the goal image's shape \(8, 8, 3\)"
    with pytest.raises(ValueError, match=r"requests\[0\]." + message):
        GoalPixelProgress().score([RewardRequest(request.frames, request.text, small_goal)])
    with pytest.raises(ValueError, match=r"references\[1\]: goal_pixel_progress needs a goal image, got None"):
        GoalPixelProgress().open_session([request.text] * 2, [request.reference, None])
    session = GoalPixelProgress().open_session([request.text], [small_goal])
    with pytest.raises(ValueError, match=r"frames\[0\]: frames of shape"):
        session.append([request.frames[:2]])


def test_motion_penalty_is_zero_for_a_still_clip():
    still = np.full((5, 8, 8, 3), 100, np.uint8)
    moving = still.copy()
    moving[1::2] = 200
    results = MotionPenalty(scale=2.0).score([RewardRequest(still, "t"), RewardRequest(moving, "t")])
    assert results[0].reward == 0.0
    assert results[1].reward == pytest.approx(-2.0 * 100 / 255)


MARKERS = MarkerProgress.Params(
    palette={"red": (250, 40, 40), "blue": (40, 40, 250)}, effector=(20, 20, 20), tolerance=60
)


def marker_clip(effector_path: list[tuple[int, int]]) -> np.ndarray:
    """32x32 grey frames: a red marker at (6, 6), a blue one at (25, 25), the effector's 3x3 square on a path."""
    frames = np.full((len(effector_path), 32, 32, 3), 128, np.uint8)
    frames[:, 4:9, 4:9] = (250, 40, 40)
    frames[:, 23:28, 23:28] = (40, 40, 250)
    for frame, (row, col) in zip(frames, effector_path):
        frame[row - 1 : row + 2, col - 1 : col + 2] = (20, 20, 20)
    return frames


def test_marker_progress_follows_the_named_marker():
    path = [(6, 26), (6, 21), (6, 16), (6, 11), (6, 6)]  # along the top row, onto the red marker
    frames = marker_clip(path)
    to_red, to_blue = MarkerProgress(MARKERS).score(
        [RewardRequest(frames, "reach the red target"), RewardRequest(frames, "reach the Blue target")]
    )
    np.testing.assert_allclose(to_red.progress, [0.0, 0.25, 0.5, 0.75, 1.0], atol=0.02)
    assert to_blue.progress.max() == 0.0  # moving away from blue: clipped at 0
    hidden = frames.copy()
    hidden[2, 5:8, 15:18] = 128  # the effector is hidden in frame 2: frame 1's distance is kept
    (result,) = MarkerProgress(MARKERS).score([RewardRequest(hidden, "reach the red target")])
    assert result.progress[2] == pytest.approx(to_red.progress[1])


def test_marker_progress_between_two_named_colours():
    """Push-style: the first named colour's marker moves onto the second's; either may have two shades."""
    frames = marker_clip([(14, 14)] * 4)
    for t, col in enumerate([6, 12, 18, 25]):  # the red marker slides right, along the blue one's row
        frames[t, 4:9, 4:9] = 128
        frames[t, 23:28, col - 2 : col + 3] = (200, 60, 60) if t % 2 else (250, 40, 40)
    frames[:, 23:28, 23:28] = (40, 40, 250)
    frames[3, 23:28, 23:28] = (200, 60, 60)  # on top of blue: blue is hidden, the last distance is kept
    params = MARKERS.model_copy(
        update={
            "between": (1, 2),
            "colours_named": 2,
            "palette": {"red": [(250, 40, 40), (200, 60, 60)], "blue": (40, 40, 250)},
        }
    )
    (push,) = MarkerProgress(params).score([RewardRequest(frames, "push the red block to the blue zone")])
    np.testing.assert_allclose(push.progress, [0.0, 6 / 19, 12 / 19, 12 / 19], atol=0.02)
    with pytest.raises(ValueError, match=r"names 1 palette colours; expected 2"):
        MarkerProgress(params).score([RewardRequest(frames, "push the red block")])
    with pytest.raises(pydantic.ValidationError, match=r"between \(1, 3\): expected two different markers"):
        MarkerProgress.Params(palette={"red": (1, 2, 3)}, effector=(0, 0, 0), between=(1, 3), colours_named=2)


def test_marker_progress_session_reads_each_frame_once(monkeypatch):
    """The RL loop's session reads only the new frames (O(1) a step), with the whole clip's values."""
    frames = marker_clip([(6, 26), (6, 21), (6, 16), (6, 11), (6, 6)])
    reward = MarkerProgress(MARKERS)
    (whole,) = reward.score([RewardRequest(frames, "reach the red target")])
    frames_read = []
    read = reward._distances
    monkeypatch.setattr(
        reward, "_distances", lambda new, goal, where: frames_read.append(len(new)) or read(new, goal, where)
    )
    with reward.open_session(["reach the red target"]) as session:
        streamed = np.concatenate([session.append([frame[None]])[0] for frame in frames])
        with pytest.raises(ValueError, match=r"frames\[0\]: frames of shape \(16, 16, 3\), the stream began with"):
            session.append([frames[:1, :16, :16]])
    np.testing.assert_allclose(streamed, whole.progress)
    assert frames_read == [1] * len(frames)


def test_a_refused_append_leaves_the_distance_session_as_it_was():
    frames = marker_clip([(6, 26), (6, 21)])
    with MarkerProgress(MARKERS).open_session(["reach the red target"] * 2) as session:
        with pytest.raises(ValueError, match=r"frames\[1\]: expected dtype uint8"):
            session.append([frames[:1, :16, :16], frames[:1].astype(np.float32)])
        assert session.num_frames == [0, 0]
        session.append([frames[:1], frames[:1]])  # stream 0's first frames are these, not the refused ones
        assert session.num_frames == [1, 1]


@pytest.mark.parametrize("text, count", [("reach the green target", 0), ("red or blue", 2)])
def test_marker_progress_needs_exactly_one_named_colour(text, count):
    message = (
        rf"requests\[0\].text: '{text}' names {count} palette colours; expected 1, all different, of \['red', 'blue'\]"
    )
    with pytest.raises(ValueError, match=message):
        MarkerProgress(MARKERS).score([RewardRequest(marker_clip([(6, 26)]), text)])


def test_running_mean_std_matches_numpy_and_checkpoints():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3, 2, size=n) for n in (5, 17, 1, 40)]
    stats = RunningMeanStd(prior_count=2)  # the prior (mean 0, variance 1) weighs as the values -1 and 1
    for batch in batches:
        stats.update(batch)
    everything = np.concatenate([[-1.0, 1.0], *batches])
    assert stats.mean == pytest.approx(everything.mean())
    assert stats.var == pytest.approx(everything.var())
    assert stats.count == everything.size
    restored = RunningMeanStd()
    restored.load_state_dict(stats.state_dict())
    np.testing.assert_array_equal(restored.normalize(everything), stats.normalize(everything))
    stats.freeze()
    stats.update(np.array([1e6, np.nan]))
    assert stats.count == everything.size  # frozen: evaluation rollouts do not move the statistics
    stats.freeze(False)
    stats.update(np.array([np.nan, np.inf]))
    assert stats.count == everything.size  # non-finite values never enter


def test_group_zscore():
    values = np.array([1.0, 3.0, 5.0, 5.0, np.nan, 7.0])
    z = group_zscore(values, ["a", "a", "b", "b", "c", "c"])
    np.testing.assert_allclose(z[:2], [-1, 1], atol=1e-3)
    np.testing.assert_array_equal(z[2:4], [0, 0])  # all-equal group
    assert np.isnan(z[4]) and z[5] == 0.0  # a failed sample stays NaN and is left out of its group's stats
    unsmoothed = group_zscore(values, ["a", "a", "b", "b", "c", "c"], epsilon=0.0)
    np.testing.assert_array_equal(unsmoothed[[0, 1, 2, 3, 5]], [-1, 1, 0, 0, 0])  # flat groups: zeros, not 0/0
    assert np.isnan(unsmoothed[4])
    stats = group_statistics(values, ["a", "a", "b", "b", "c", "c"])
    np.testing.assert_array_equal(stats.zero_std, [False, False, True, True, True, True])
    with pytest.raises(ValueError, match="but 2 group labels"):
        group_zscore(np.zeros(3), ["a", "b"])


def test_group_zscore_gathers_the_whole_group_across_processes():
    """Two processes each hold half of group "a": statistics over the whole group, as one process would get."""
    values, groups = np.array([1.0, 2.0, 3.0, 10.0]), ["a", "a", "a", "b"]
    whole = group_zscore(values, groups)
    rank0, rank1 = (values[:2], groups[:2]), (values[2:], groups[2:])

    def gather_from(local_rank):  # what accelerate's gather_object returns: every rank's list, in rank order
        return lambda local: (
            (local if local_rank == 0 else list(zip(*rank0))) + (local if local_rank == 1 else list(zip(*rank1)))
        )

    np.testing.assert_allclose(group_zscore(*rank0, gather=gather_from(0)), whole[:2])
    np.testing.assert_allclose(group_zscore(*rank1, gather=gather_from(1)), whole[2:])
    assert not np.allclose(group_zscore(*rank0), whole[:2])  # without gathering the split changes the values


def test_shipped_composite_builds_and_scores(expert_requests):
    reward = build_reward("demo_composite")
    results = reward.score(expert_requests)
    for result in results:
        expected = result.components["goal_pixel_progress"] + 2.0 * result.components["smoothness"]
        assert result.reward == pytest.approx(expected)
    assert reward.spec.value_range == (-2.0, 1.0)
    assert reward.spec.components == ("goal_pixel_progress", "smoothness")
    assert reward.spec.requires == ("reference",) and not reward.spec.dense


def test_composite_is_pure():
    """The same request gets the same value whatever was scored before and whoever shares its batch."""
    reward = CompositeReward([FunctionReward(mean_pixel), MotionPenalty()], weights=[1.0, 2.0])
    batch = lambda *values: [RewardRequest(np.full((1, 2, 2, 3), v, np.uint8), "t") for v in values]
    (alone,) = reward.score(batch(100))
    reward.score(batch(0, 10, 250))
    assert reward.score(batch(3, 100))[1] == alone


def test_composite_of_dense_parts_keeps_weighted_progress(expert_requests):
    pixel = GoalPixelProgress()
    reward = CompositeReward([pixel, GoalPixelProgress(name="again")], weights=[0.25, 0.5])
    assert reward.spec.dense and reward.spec.causal and reward.spec.value_range == (0.0, 0.75)
    (result,) = reward.score(expert_requests[:1])
    (part,) = pixel.score(expert_requests[:1])
    np.testing.assert_allclose(result.progress, 0.75 * part.progress)


def failing(request):
    return RewardResult(reward=float("nan"), error="unparseable answer")


def test_composite_of_causal_parts_streams_each_part(expert_requests):
    """Each part keeps its own session (no rescoring); the composite adds their progress per frame."""
    composite = CompositeReward([GoalPixelProgress(), GoalPixelProgress(name="b")], [1.0, 0.5])
    request = expert_requests[0]
    with composite.open_session([request.text], [request.reference]) as session:
        assert all(isinstance(part, DistanceSession) for part in session.sessions)
        streamed = np.concatenate([session.append([request.frames[t : t + 1]])[0] for t in range(request.num_frames)])
        with pytest.raises(ValueError, match=r"frames\[0\]: expected dtype uint8"):
            session.append([request.frames.astype(np.float32)])
        assert session.num_frames == [request.num_frames]
    np.testing.assert_allclose(streamed, 1.5 * composite.rewards[0].score([request])[0].progress)


def test_a_composite_whose_later_part_refuses_to_open_closes_the_earlier_sessions(monkeypatch):
    closed = []
    monkeypatch.setattr(DistanceSession, "close", lambda session: closed.append(session))
    composite = CompositeReward([MarkerProgress(MARKERS), GoalPixelProgress()], [1.0, 1.0])
    monkeypatch.setattr(composite.rewards[1], "open_session", lambda texts, references=None: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        composite.open_session(["reach the red target"])
    assert len(closed) == 1 and closed[0].reward is composite.rewards[0]


def test_composite_propagates_a_component_error_by_default():
    parts = [FunctionReward(failing, name="judge"), FunctionReward(mean_pixel)]
    request = RewardRequest(np.full((1, 2, 2, 3), 4, np.uint8), "t")
    (result,) = CompositeReward(parts, [1, 1]).score([request])
    assert np.isnan(result.reward) and result.error == "judge: unparseable answer"
    assert np.isnan(result.components["judge"]) and result.components["mean_pixel"] == 4.0
    (zeroed,) = CompositeReward(parts, [1, 1], on_error="zero").score([request])
    assert zeroed.reward == 4.0 and zeroed.error == "judge: unparseable answer"


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
        ({"kind": "marker_progress", "palette": {}, "effector": [0, 0, 0]}, "palette: Dictionary should have at least"),
        ({"kind": "function", "function": "os.path"}, "expected 'package.module:function'"),
        ({"kind": "function", "function": "no_such_module:f"}, "could not be imported"),
        ({"kind": "function", "function": "os:system"}, "functions of 'os' are refused"),
        ({"kind": "function", "function": "builtins:eval"}, "functions of 'builtins' are refused"),
        ({"kind": "function", "function": "math:sqrt"}, "is not a Python function"),
        ({"kind": "composite", "components": [{"reward": "motion_penalty", "weight": float("nan")}]}, "finite"),
    ],
)
def test_bad_reward_configs(config, message):
    with pytest.raises(ValueError, match=message):
        build_reward(config)


def test_missing_reward_file():
    with pytest.raises(ValueError, match="reward config 'missing.yaml' not found"):
        build_reward("missing.yaml")
    with pytest.raises(ValueError, match="reward config 'no_such_reward' is not a shipped config"):
        build_reward("no_such_reward")


def test_component_paths_resolve_relative_to_their_yaml(tmp_path, monkeypatch):
    """No fallback to a shipped config of the same file name; a missing file is an error."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "motion_penalty.yaml").write_text("kind: motion_penalty\nname: local\nscale: 3.0\n")
    (tmp_path / "combo.yaml").write_text("kind: composite\ncomponents:\n  - reward: rules/motion_penalty.yaml\n")
    monkeypatch.chdir(tmp_path / "rules")  # the current folder must not matter
    combo = build_reward(tmp_path / "combo.yaml")
    assert combo.rewards[0].spec.name == "local" and combo.rewards[0].scale == 3.0
    with pytest.raises(ValueError, match="not found"):
        build_reward("/typo/dir/motion_penalty.yaml")
    (tmp_path / "broken.yaml").write_text("kind: composite\ncomponents:\n  - reward: missing/motion_penalty.yaml\n")
    with pytest.raises(ValueError, match=r"missing/motion_penalty.yaml' not found"):
        build_reward(tmp_path / "broken.yaml")


def test_a_composite_that_includes_itself_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("kind: composite\ncomponents:\n  - reward: b.yaml\n")
    (tmp_path / "b.yaml").write_text("kind: composite\ncomponents:\n  - reward: ./a.yaml\n")
    with pytest.raises(ValueError, match=r"includes itself: .*a.yaml -> .*b.yaml -> .*a.yaml"):
        build_reward(tmp_path / "a.yaml")


@pytest.mark.parametrize("returned", [None, np.zeros(3), 1 + 2j, "0.5", True])
def test_function_returning_a_non_number_names_the_function_and_index(returned):
    reward = FunctionReward(lambda request: returned if request.text == "bad" else 0.0, name="f")
    frames = np.zeros((1, 2, 2, 3), np.uint8)
    good, bad = RewardRequest(frames, "ok"), RewardRequest(frames, "bad")
    with pytest.raises(ValueError, match=r"function tests.test_rewards:.*<lambda> returned .* for requests\[1\]"):
        reward.score([good, bad])


def test_function_gets_read_only_frames():
    def vandal(request):
        request.frames[:] = 0
        return 0.0

    frames = np.full((1, 2, 2, 3), 9, np.uint8)
    with pytest.raises(ValueError, match="read-only"):
        FunctionReward(vandal).score([RewardRequest(frames, "t")])
    assert frames.min() == 9


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


@pytest.mark.parametrize(
    "reward",
    [
        FunctionReward(mean_pixel),
        GoalPixelProgress(),
        MotionPenalty(scale=0.5),
        CompositeReward([GoalPixelProgress(), GoalPixelProgress(name="b")], [1.0, -1.0]),
    ],
    ids=["function", "goal_pixel_progress", "motion_penalty", "dense_composite"],
)
def test_rule_kinds_conform(reward):
    check_reward(reward)


def test_conformance_checker_catches_a_broken_promise():
    """A reward that claims batch invariance but depends on its batch-mates is caught."""

    class BatchMean(FunctionReward):
        def _score(self, requests):
            mean = np.mean([r.frames.mean() for r in requests])
            return [RewardResult(reward=float(mean)) for _ in requests]

    with pytest.raises(ConformanceError, match="batch_invariant"):
        check_reward(BatchMean(mean_pixel))

    def lying_causal(request):
        values = np.full(request.num_frames, request.frames.mean() / 255)
        return RewardResult(reward=float(values[-1]), progress=values)

    with pytest.raises(ConformanceError, match="causal"):
        check_reward(FunctionReward(lying_causal, value_range=(0.0, 1.0), dense=True, causal=True))


def test_duplicate_keys_in_a_reward_config_are_errors(tmp_path):
    (tmp_path / "twice.yaml").write_text("kind: motion_penalty\nscale: 1.0\nscale: 2.0\n")
    with pytest.raises(ValueError, match=r"twice.yaml:3: duplicate key 'scale'"):
        build_reward(tmp_path / "twice.yaml")
