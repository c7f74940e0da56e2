"""Pairwise (preference) advantages: win rates under a reward's `prefer`, by hand, through the trainer, refusals."""

import math

import numpy as np
import pytest
from accelerate import Accelerator

from vlm_rewards.generation import train
from vlm_rewards.generation.config import GRPOConfig
from vlm_rewards.generation.grpo import check_prefer, group_advantages, pairwise_win_rates
from vlm_rewards.generation.models import build_tiny_generator
from vlm_rewards.generation.rewards import RewardSet
from vlm_rewards.generation.train import run_grpo, sample_epoch
from vlm_rewards.interface import BaseReward, RewardResult, RewardSpec
from vlm_rewards.registry import build_reward

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BRIGHTNESS = {"kind": "function", "function": "vlm_rewards.generation.rule_rewards:brightness", "value_range": [0, 1]}


def brightness(request) -> float:
    return float(request.frames[-1].mean())


class BrighterWins(BaseReward):
    """A rule judge: P(a beats b) is 1 when a is brighter, 0 when darker, 1/2 on a tie. Records each call's pairs."""

    spec = RewardSpec("brighter_wins", "1")

    def __init__(self, answer=None):
        self.calls: list[int] = []
        self.answer = answer

    def _score(self, requests):
        return [RewardResult(brightness(request)) for request in requests]

    def _prefer(self, a, b):
        self.calls.append(len(a))
        if self.answer is not None:
            return np.full(len(a), self.answer)
        return np.array([0.5 + 0.5 * np.sign(brightness(x) - brightness(y)) for x, y in zip(a, b)])


def flat_images(values) -> np.ndarray:
    """(N, 4, 4, 3) uint8 images, image i filled with values[i]."""
    return np.stack([np.full((4, 4, 3), value, dtype=np.uint8) for value in values])


def test_win_rates_of_a_rule_judge_are_the_share_of_the_group_each_image_beats():
    judge = BrighterWins()
    prompts = ["a", "b", "a", "b", "a"]  # groups by prompt, not by position
    images = flat_images([30, 5, 10, 5, 20])
    rates = pairwise_win_rates({"judge": judge}, images, prompts)["judge"]
    # group a: 30 beats 10 and 20 (1), 10 beats none (0), 20 beats 10 only (1/2); group b: a tie (1/2 each)
    np.testing.assert_allclose(rates, [1.0, 0.5, 0.0, 0.5, 0.5])
    assert judge.calls == [3, 1]  # one prefer call per group; each unordered pair judged once


def test_soft_preferences_average_the_probabilities():
    """A scalar reward's default prefer is Bradley-Terry, σ(r_a − r_b): the win rate is its mean over opponents."""
    reward = build_reward(BRIGHTNESS)
    values = [0, 51, 255]  # brightness 0, 0.2, 1
    rates = pairwise_win_rates({"bright": reward}, flat_images(values), ["p"] * 3)["bright"]

    def sigmoid(x):
        return 1 / (1 + math.exp(-x))

    expected = [
        (sigmoid(-0.2) + sigmoid(-1.0)) / 2,
        (sigmoid(0.2) + sigmoid(-0.8)) / 2,
        (sigmoid(1.0) + sigmoid(0.8)) / 2,
    ]
    np.testing.assert_allclose(rates, expected, rtol=1e-12)
    assert rates.mean() == pytest.approx(0.5)  # every pair hands out one win between its two images


def tiny_config(tmp_path, advantage: str) -> GRPOConfig:
    return GRPOConfig.model_validate(
        {
            "output_dir": str(tmp_path),
            "rewards": {"trained": [{"name": "brightness", "config": BRIGHTNESS}]},
            "sampling": {"num_steps": 3, "eval_num_steps": 3},
            "train": {"epochs": 1, "batches_per_epoch": 2, "sample_batch_size": 8, "group_size": 4,
                      "train_batch_size": 8, "advantage": advantage},
            "eval_every": 0,
        }
    )  # fmt: skip


def test_pairwise_advantages_are_group_zscores_of_the_win_rates(tmp_path):
    config = tiny_config(tmp_path, "pairwise")
    generator = build_tiny_generator("flow")
    judge = BrighterWins()
    rewards = RewardSet({"judge": judge}, {"judge": 1.0})
    rollout, advantages, logs = sample_epoch(Accelerator(cpu=True), generator, generator.denoiser, rewards, config, 0)

    light = rollout.images.reshape(len(rollout), -1).mean(axis=1)
    wins = np.zeros(len(rollout))
    for i, prompt in enumerate(rollout.prompts):  # count by hand: opponents in the group that i is brighter than
        opponents = [j for j, other in enumerate(rollout.prompts) if other == prompt and j != i]
        wins[i] = np.mean([1.0 if light[i] > light[j] else 0.5 if light[i] == light[j] else 0.0 for j in opponents])
    expected = group_advantages(wins, rollout.prompts)
    assert len(set(wins.round(6))) > 2  # the rollout's images differ: the check is not trivial
    np.testing.assert_allclose(advantages.values, expected.values, rtol=1e-12)
    assert "time/pairwise_s" in logs and logs["reward/judge/mean"] == pytest.approx(light.mean())  # logs: scores

    pointwise = sample_epoch(
        Accelerator(cpu=True), generator, generator.denoiser, rewards, tiny_config(tmp_path, "pointwise"), 0
    )[1]
    assert not np.allclose(pointwise.values, advantages.values)


def test_grpo_trains_on_pairwise_advantages(tmp_path):
    history = run_grpo(tiny_config(tmp_path, "pairwise"))
    assert np.isfinite(history["train/policy_loss"][0][1]) and history["time/pairwise_s"][0][1] >= 0


class ScoreOnly:
    """A reward that scores but cannot compare two images (no `prefer`)."""

    spec = RewardSpec("score_only", "1")

    async def ascore(self, requests):
        return [RewardResult(0.0) for _ in requests]


def test_a_reward_without_prefer_is_refused_before_any_model_is_built(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"reward 'judge' \(ScoreOnly\) has no prefer"):
        check_prefer({"fine": BrighterWins(), "judge": ScoreOnly()})

    monkeypatch.setattr(train, "build_rewards", lambda config: RewardSet({"judge": ScoreOnly()}, {"judge": 1.0}))
    monkeypatch.setattr(train, "build_generator", lambda settings: pytest.fail("a model was built"))
    with pytest.raises(ValueError, match="reward 'judge'"):
        run_grpo(tiny_config(tmp_path, "pairwise"))
    monkeypatch.setattr(train, "build_generator", lambda settings: build_tiny_generator("flow"))
    run_grpo(tiny_config(tmp_path, "pointwise"))  # pointwise advantages need no prefer


@pytest.mark.parametrize("answer", [float("nan"), 1.5])
def test_a_preference_that_is_not_a_probability_names_the_reward(answer):
    with pytest.raises(ValueError, match=r"reward 'judge': prefer gave \[.*\] for the 1 pairs of group 'p'"):
        pairwise_win_rates({"judge": BrighterWins(answer)}, flat_images([1, 2]), ["p", "p"])
