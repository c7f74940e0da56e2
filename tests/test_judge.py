import math

import numpy as np
import pytest
import torch

from vlm_rewards.interface import RewardRequest
from vlm_rewards.models.backbones import build_tiny_backbone, load_backbone
from vlm_rewards.models.judge import (
    GVLProgressJudge,
    YesNoJudge,
    answer_token_ids,
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
    assert judge.spec.output == "scalar" and judge.spec.value_range == (0.0, 1.0)
    assert judge.spec.frame_size[0] == 28 and judge.spec.max_frames == 32
    results = judge.score(REQUESTS)
    for result in results:
        assert 0.0 < result.reward < 1.0 and result.progress is None
        assert result.aux["p_yes"] == result.reward
        assert result.reward == pytest.approx(1 / (1 + math.exp(result.aux["logit_no"] - result.aux["logit_yes"])))
    singles = [judge.score([request])[0].reward for request in REQUESTS]
    np.testing.assert_allclose([result.reward for result in results], singles, rtol=1e-4, atol=1e-5)


def test_yes_no_judge_per_frame_scores_prefixes(backbone, tiny_dir):
    judge = yes_no_judge(backbone, tiny_dir, per_frame=True, batch_size=2)
    assert judge.spec.output == "progress"
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
    results = judge.score(REQUESTS[1:])
    for result in results:
        assert math.isnan(result.reward) and "error" in result.aux
        assert result.aux["unparsed_frames"] == [0, 1, 2] and np.isnan(result.progress).all()
        assert isinstance(result.aux["answer"], str)
    assert results[0].aux["frame_order"][0] == 0


def test_gvl_maps_shown_order_back_to_time_order(backbone, tiny_dir, monkeypatch):
    judge = gvl_judge(backbone, tiny_dir, seed=3)
    clip = RNG.integers(0, 255, (5, 56, 56, 3), dtype=np.uint8)
    requests = [RewardRequest(clip, "push the red circle to the top left")] * 2
    orders = [judge.frame_order(index, 5) for index in range(2)]
    assert orders[0][0] == 0 and sorted(orders[0]) == list(range(5)) and orders[0] != list(range(5))
    assert orders[0] == judge.frame_order(0, 5)  # reproducible
    # Shown frame k gets 20% per original time step; request 1 leaves out the last frame.
    answers = [
        "\n".join(f"Frame {k + 1}: {20 * t}%" for k, t in enumerate(order) if index == 0 or t != 4)
        for index, order in enumerate(orders)
    ]

    def generate(input_ids, **kwargs):
        answer_ids = judge.tokenizer(answers, padding=True, return_tensors="pt")["input_ids"]
        return torch.cat([input_ids, answer_ids], dim=1)

    monkeypatch.setattr(judge.model, "generate", generate)
    first, second = judge.score(requests)
    np.testing.assert_allclose(first.progress, [0.0, 0.2, 0.4, 0.6, 0.8])
    assert first.reward == pytest.approx(0.8) and first.aux["unparsed_frames"] == []
    assert first.aux["answer"] == answers[0] and first.aux["frame_order"] == orders[0]
    np.testing.assert_allclose(second.progress, [0.0, 0.2, 0.4, 0.6, np.nan])
    assert second.reward == pytest.approx(0.6) and second.aux["unparsed_frames"] == [4]


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
    ],
)
def test_parse_progress_answer(answer, expected):
    np.testing.assert_allclose(parse_progress_answer(answer, 3), expected)


def test_progress_result_falls_back_to_the_latest_parsed_frame():
    # Shown order [0, 2, 1]: shown Frame 2 is original frame 2, shown Frame 3 is original frame 1.
    result = progress_result("Frame 1: 0%\nFrame 3: 40%", [0, 2, 1])
    np.testing.assert_allclose(result.progress, [0.0, 0.4, np.nan])
    assert result.reward == pytest.approx(0.4) and result.aux["unparsed_frames"] == [2]
    assert "error" not in result.aux
    empty = progress_result("I cannot tell.", [0, 1])
    assert math.isnan(empty.reward) and "could be parsed" in empty.aux["error"]


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
