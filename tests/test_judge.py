import json
import math
import re

import numpy as np
import pytest
import torch

from vlm_rewards.evaluation.metrics import mean_voc
from vlm_rewards.interface import RewardRequest, SampleKey
from vlm_rewards.models.backbones import build_tiny_backbone, load_backbone
from vlm_rewards.models.judge import (
    GVLProgressJudge,
    YesNoJudge,
    answer_token_ids,
    gvl_frame_order,
    parse_progress_answer,
    progress_result,
    yes_no_readout,
)
from vlm_rewards.registry import build_reward

RNG = np.random.default_rng(0)
CLIPS = [RNG.integers(0, 255, (t, 56, 56, 3), dtype=np.uint8) for t in (1, 3, 3)]
REQUESTS = [
    RewardRequest(CLIPS[0], "push the red circle to the top left"),
    RewardRequest(CLIPS[1], "move the blue square to the center", reference=CLIPS[0]),
    RewardRequest(CLIPS[2], "slide the green triangle to the bottom right", views={"wrist": CLIPS[1]}),
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_backbone("qwen2_5_vl", tmp_path_factory.mktemp("judge") / "qwen2_5_vl")


@pytest.fixture(scope="module")
def backbone(tiny_dir):
    return load_backbone(tiny_dir, with_lm_head=True)


def yes_no_judge(backbone, tiny_dir, **params) -> YesNoJudge:
    return YesNoJudge(*backbone, YesNoJudge.Params(model=str(tiny_dir), device="cpu", **params))


def gvl_judge(backbone, tiny_dir, **params) -> GVLProgressJudge:
    return GVLProgressJudge(*backbone, GVLProgressJudge.Params(model=str(tiny_dir), device="cpu", **params))


def test_yes_no_judge_scores_a_batch_like_single_requests(backbone, tiny_dir):
    judge = yes_no_judge(backbone, tiny_dir, batch_size=3)
    assert not judge.spec.dense and judge.spec.value_range == (0.0, 1.0)
    assert judge.spec.frame_size[0] == 28 and judge.spec.max_frames == 32
    results = judge.score(REQUESTS)
    for result in results:
        assert 0.0 < result.reward < 1.0 and result.progress is None
        assert result.info["p_yes"] == result.reward
        assert result.reward == pytest.approx(1 / (1 + math.exp(result.info["logit_no"] - result.info["logit_yes"])))
    singles = [judge.score([request])[0].reward for request in REQUESTS]
    np.testing.assert_allclose([result.reward for result in results], singles, rtol=1e-4, atol=1e-5)


def test_yes_no_judge_per_frame_scores_prefixes(backbone, tiny_dir):
    judge = yes_no_judge(backbone, tiny_dir, per_frame=True, batch_size=2)
    assert judge.spec.dense and judge.spec.causal
    results = judge.score(REQUESTS[:2])
    assert [result.progress.shape for result in results] == [(1,), (3,)]
    whole_clip = yes_no_judge(backbone, tiny_dir).score([REQUESTS[1]])[0].reward
    assert results[1].reward == pytest.approx(whole_clip, rel=1e-4)
    assert results[1].progress[-1] == results[1].reward
    assert np.all((results[1].progress > 0) & (results[1].progress < 1))


def test_yes_no_readout_comes_from_the_next_token_logits(backbone, tiny_dir):
    judge = yes_no_judge(backbone, tiny_dir)
    tokenizer = judge.tokenizer
    assert all(tokenizer.decode([i]).strip().lower().startswith("y") for i in judge.yes_ids)
    assert all(tokenizer.decode([i]).strip().lower().startswith("n") for i in judge.no_ids)

    bias = torch.zeros(len(tokenizer))
    bias[judge.yes_ids] = 50.0
    handle = judge.model.lm_head.register_forward_hook(lambda module, inputs, output: output + bias)
    try:
        (result,) = judge.score(REQUESTS[1:2])
    finally:
        handle.remove()
    assert result.reward == pytest.approx(1.0, abs=1e-6)


def test_yes_no_readout_is_the_yes_mass_among_yes_and_no_tokens():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, 3.0], [5.0, 0.0, 0.0, 0.0, 0.0]])
    p_yes, logit_yes, logit_no = yes_no_readout(logits, [1, 2], [3])
    probabilities = logits.softmax(-1)
    expected = probabilities[:, [1, 2]].sum(-1) / probabilities[:, [1, 2, 3]].sum(-1)
    torch.testing.assert_close(p_yes, expected)
    torch.testing.assert_close(logit_yes - logit_no, torch.log(expected / (1 - expected)))


def test_answer_token_ids_skip_whitespace_only_first_tokens(backbone):
    tokenizer = backbone[1].tokenizer
    ids = answer_token_ids(tokenizer, ("yes", "yes", " Yes"))
    assert ids == [tokenizer.encode("yes", add_special_tokens=False)[0]]  # deduped; " Yes" starts with "Ġ" here
    with pytest.raises(ValueError, match="no first token"):
        answer_token_ids(tokenizer, (" ",))


def test_gvl_with_a_random_model_reports_unparsed_frames(backbone, tiny_dir):
    judge = gvl_judge(backbone, tiny_dir, max_new_tokens=12, batch_size=2)
    spec = judge.spec
    assert spec.dense and not spec.causal and spec.batch_invariant and spec.deterministic
    assert spec.max_text_length == 8192 * 3  # the tiny model's context × 3 characters per token
    results = judge.score(REQUESTS[1:])
    for result in results:
        assert math.isnan(result.reward) and "could be parsed" in result.error
        assert result.info["unparsed_frames"] == [0, 1, 2] and np.isnan(result.progress).all()
        assert isinstance(result.info["answer"], str)
        assert sorted(result.info["frame_order"]) == [0, 1, 2]
        assert json.loads(json.dumps(result.to_json(), allow_nan=False))["reward"] is None


def scripted_generate(judge, answer_for):
    """Replace judge.model.generate: each row's answer is answer_for(prompt text of that row)."""

    def generate(input_ids, **kwargs):
        prompts = judge.tokenizer.batch_decode(input_ids)
        answer_ids = judge.tokenizer([answer_for(p) for p in prompts], padding=True, return_tensors="pt")["input_ids"]
        return torch.cat([input_ids, answer_ids], dim=1)

    return generate


def test_gvl_shows_the_initial_scene_and_maps_shown_order_back_to_time_order(backbone, tiny_dir, monkeypatch):
    judge = gvl_judge(backbone, tiny_dir, seed=3)
    clip = RNG.integers(0, 255, (5, 56, 56, 3), dtype=np.uint8)
    requests = [RewardRequest(clip, "push the red circle to the top left", key=SampleKey("s", e)) for e in (0, 1)]
    orders = [judge.frame_order(request) for request in requests]
    assert all(sorted(order) == list(range(5)) for order in orders) and orders[0] != orders[1]
    assert orders[0] == judge.frame_order(requests[0])  # reproducible
    prompts = []

    def answer_for(prompt):
        # Shown frame k gets 20% per original time step; request 1 leaves out the last frame.
        prompts.append(prompt)
        index = len(prompts) - 1
        return "\n".join(f"Frame {k + 1}: {20 * t}%" for k, t in enumerate(orders[index]) if index == 0 or t != 4)

    monkeypatch.setattr(judge.model, "generate", scripted_generate(judge, answer_for))
    first, second = judge.score(requests)
    image = "<|vision_start|><|vision_end|>"
    shown = prompts[0].replace("<|image_pad|>", "")
    assert f"top left\nInitial scene: {image}\nFrame 1: {image}\n" in shown and f"Frame 5: {image}\n" in shown
    assert "Frame 6" not in shown and "initial scene shows the task 'push the red circle" in shown
    np.testing.assert_allclose(first.progress, [0.0, 0.2, 0.4, 0.6, 0.8])
    assert first.reward == pytest.approx(0.8) and first.info["unparsed_frames"] == [] and first.error is None
    assert first.info["frame_order"] == orders[0] and first.info["answer"].startswith("Frame 1:")
    np.testing.assert_allclose(second.progress, [0.0, 0.2, 0.4, 0.6, np.nan])
    assert second.reward == pytest.approx(0.6) and second.info["unparsed_frames"] == [4]
    assert "[4]" in second.error


def test_gvl_frame_order_depends_on_the_request_not_its_batch_position():
    clips = [RNG.integers(0, 255, (8, 28, 28, 3), dtype=np.uint8) for _ in range(3)]
    requests = [RewardRequest(clip, "stack the blocks") for clip in clips]
    alone = [gvl_frame_order(request) for request in requests]
    assert [gvl_frame_order(request) for request in reversed(requests)] == alone[::-1]
    assert len({tuple(order) for order in alone}) == 3  # different clips, different shuffles
    assert gvl_frame_order(RewardRequest(clips[0].copy(), "stack the blocks")) == alone[0]  # content, not identity
    assert gvl_frame_order(RewardRequest(clips[0], "stack the red blocks")) != alone[0]
    assert gvl_frame_order(requests[0], seed=1) != alone[0]
    keyed = RewardRequest(clips[0], "stack the blocks", key=SampleKey("set", 7))
    same_key = RewardRequest(clips[1], "stack the blocks", key=SampleKey("set", 7))
    assert gvl_frame_order(keyed) == gvl_frame_order(same_key)  # a key stands for the sample's content


def test_gvl_batch_results_equal_single_results(backbone, tiny_dir, monkeypatch):
    judge = gvl_judge(backbone, tiny_dir, batch_size=2)
    rng = np.random.default_rng(5)
    # a judge whose answer is a function of its prompt: the k-th label gets a value from the prompt's hash
    monkeypatch.setattr(
        judge.model,
        "generate",
        scripted_generate(judge, lambda prompt: f"Frame 1: {hash(prompt) % 101}%\nFrame 2: 50%\nFrame 3: 7%"),
    )
    requests = [RewardRequest(rng.integers(0, 255, (3, 28, 28, 3), dtype=np.uint8), "push") for _ in range(3)]
    batched = judge.score(requests)
    for request, result in zip(requests, batched):
        (single,) = judge.score([request])
        np.testing.assert_array_equal(single.progress, result.progress)
        assert single.info == result.info


def test_random_guessing_judge_has_zero_mean_voc(backbone, tiny_dir, monkeypatch):
    """OpenGVL's baseline: a judge that guesses every queried frame at random scores VOC ≈ 0. It states
    0% for a queried frame only where the prompt tells it that frame is the initial scene (the old
    layout pinned shown Frame 1 to frame 0 at 0%, which biased VOC to ≈ 0.34 at T = 8)."""
    judge = gvl_judge(backbone, tiny_dir, batch_size=64)
    rng = np.random.default_rng(0)

    def random_answer(prompt):
        labels = sorted({int(k) for k in re.findall(r"Frame (\d+): <\|vision_start\|>", prompt)})
        pinned = {int(k) for k in re.findall(r"Frame (\d+), the initial scene", prompt)}
        return "\n".join(f"Frame {k}: {0 if k in pinned else rng.integers(0, 101)}%" for k in labels)

    monkeypatch.setattr(judge.model, "generate", scripted_generate(judge, random_answer))
    frames = np.zeros((8, 28, 28, 3), dtype=np.uint8)
    requests = [RewardRequest(frames, f"task {i}") for i in range(512)]
    results = judge.score(requests)
    assert all(result.error is None for result in results)
    assert abs(mean_voc([result.progress for result in results])) < 0.05


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("Frame 1: 0%\nFrame 2: 45%\nFrame 3: 100%", [0.0, 0.45, 1.0]),
        ("frame 1 - 0 %\nframe 2 - 45 %\nframe 3 - 90 %", [0.0, 0.45, 0.9]),
        ("Frame 1: 0\nFrame 2: 45.5\nFrame 3: 12.25", [0.0, 0.455, 0.1225]),
        ("1: 10%\n  2: 45%\n3 = 80%", [0.1, 0.45, 0.8]),
        ("Frame 1: 0%, Frame 2: 50%, FRAME 3: 75%", [0.0, 0.5, 0.75]),
        ("**Frame 2**: about 30%\n- Frame 1: 5%", [0.05, 0.3, np.nan]),
        ("Frame 3: Task Completion Percentage: 60%", [np.nan, np.nan, 0.6]),
        ("Frame 1: -5%\nFrame 2: 150%\nFrame 3: 99%", [0.0, 1.0, 0.99]),
        ("Frame 2: 40%\nFrame 2: 90%", [np.nan, 0.4, np.nan]),  # the first value wins
        ("Frame 0: 10%\nFrame 4: 70%\nFrame 3: 30%", [np.nan, np.nan, 0.3]),  # frames outside 1..3 ignored
        ("The robot moves at 12:30 toward the cup.", [np.nan, np.nan, np.nan]),
        ("", [np.nan, np.nan, np.nan]),
        ("ĠtheĠ %%% 3x: :: frame frame: 12", [np.nan, np.nan, np.nan]),
        # descriptions with numbers before the percentage (these read NaN and 2% before)
        ("Frame 1: top-left, 90%", [0.9, np.nan, np.nan]),
        ("Frame 2: 2 blocks stacked on the left, 60%", [np.nan, 0.6, np.nan]),
        ("Frame 2: 2 blocks stacked, 60", [np.nan, np.nan, np.nan]),  # ambiguous without a %
        # GVL's answer format, whose descriptions may hold percentages of their own
        (
            "Frame 1: Frame Description: the cup is 50% full, Task Completion Percentages: 20%\n"
            "Frame 2: Frame Description: 3 cubes left. Task Completion Percentages: 70%",
            [0.2, 0.7, np.nan],
        ),
        ("Frame 3 (gripper open): 35%", [np.nan, np.nan, np.nan]),  # no separator after the label
        ("Frame #3) 35%\n2. 15%", [np.nan, 0.15, 0.35]),
        ("Frame 1: 3.5%", [0.035, np.nan, np.nan]),
    ],
)
def test_parse_progress_answer(answer, expected):
    np.testing.assert_allclose(parse_progress_answer(answer, 3), expected)


def test_progress_result_falls_back_to_the_latest_parsed_frame():
    # Shown order [0, 2, 1]: shown Frame 2 is original frame 2, shown Frame 3 is original frame 1.
    result = progress_result("Frame 1: 0%\nFrame 3: 40%", [0, 2, 1])
    np.testing.assert_allclose(result.progress, [0.0, 0.4, np.nan])
    assert result.reward == pytest.approx(0.4) and result.info["unparsed_frames"] == [2]
    assert "frames [2]" in result.error  # a NaN frame always comes with an error
    complete = progress_result("Frame 1: 0%\nFrame 2: 40%\nFrame 3: 20%", [0, 2, 1])
    assert complete.error is None and complete.reward == pytest.approx(0.4)
    empty = progress_result("I cannot tell.", [0, 1])
    assert math.isnan(empty.reward) and "could be parsed" in empty.error
    assert empty.to_json()["reward"] is None and empty.info["frame_order"] == [0, 1]


def test_params_and_loading_errors(tmp_path, tiny_dir):
    with pytest.raises(ValueError, match="no such folder"):
        build_reward({"kind": "vlm_judge", "model": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="only field is"):
        build_reward({"kind": "gvl_progress", "model": str(tiny_dir), "question": "Rate {task} per frame."})
    judge = build_reward({"kind": "gvl_progress", "model": str(tiny_dir), "device": "cpu", "max_new_tokens": 8})
    assert isinstance(judge, GVLProgressJudge) and judge.spec.name == "gvl_progress"
    other = build_reward({"kind": "gvl_progress", "model": str(tiny_dir), "device": "cpu", "max_new_tokens": 9})
    assert other.spec.version != judge.spec.version
    batched = build_reward({"kind": "gvl_progress", "model": str(tiny_dir), "max_new_tokens": 8, "batch_size": 1})
    assert batched.spec.version == judge.spec.version
