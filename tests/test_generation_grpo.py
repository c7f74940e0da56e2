"""GRPO's math against NumPy references: group advantages, multi-reward aggregation, PPO-clip, diagnostics."""

import numpy as np
import pytest
import torch

from vlm_rewards.generation.grpo import (
    combined_advantages,
    group_advantages,
    ppo_clip_loss,
    ratio_diagnostics,
    reward_diagnostics,
)


def numpy_group_advantages(rewards, groups, epsilon=1e-4):
    """Per group (r − mean)/(std + ε), population std; zero-std groups dropped."""
    rewards, groups = np.asarray(rewards, dtype=np.float64), np.asarray(groups)
    values, keep = np.zeros_like(rewards), np.ones(len(rewards), dtype=bool)
    for group in np.unique(groups):
        members = groups == group
        std = rewards[members].std()
        if std == 0:
            keep[members] = False
        else:
            values[members] = (rewards[members] - rewards[members].mean()) / (std + epsilon)
    return values, keep


def test_group_advantages_match_numpy():
    rng = np.random.default_rng(0)
    groups = [f"prompt {i}" for i in range(6) for _ in range(4)]
    rewards = rng.normal(size=24)
    rewards[8:12] = 0.5  # one group with no spread
    advantages = group_advantages(rewards, groups)
    expected, keep = numpy_group_advantages(rewards, groups)
    np.testing.assert_allclose(advantages.values, expected, rtol=1e-12)
    np.testing.assert_array_equal(advantages.keep, keep)
    assert advantages.zero_std_ratio == pytest.approx(1 / 6) and advantages.num_dropped == 4


def test_group_statistics_are_gathered_across_processes():
    """A group split over two processes gets the advantages of the whole group."""
    rng = np.random.default_rng(1)
    groups = ["a", "a", "b", "b", "a", "a", "b", "b"]
    rewards = rng.normal(size=8)
    everything = group_advantages(rewards, groups)
    shards = [(rewards[:4], groups[:4]), (rewards[4:], groups[4:])]
    pairs = [pair for values, labels in shards for pair in zip(values.tolist(), labels)]
    per_process = [group_advantages(values, labels, gather=lambda _: pairs) for values, labels in shards]
    np.testing.assert_allclose(np.concatenate([p.values for p in per_process]), everything.values, rtol=1e-12)


def test_multi_reward_aggregation_matches_numpy():
    rng = np.random.default_rng(2)
    groups = [i for i in range(4) for _ in range(3)]
    aesthetic, ocr = rng.normal(size=12), 100 * rng.normal(size=12)  # different scales on purpose
    weights = {"aesthetic": 0.7, "ocr": 0.3}
    rewards = {"aesthetic": aesthetic, "ocr": ocr}

    def batch_z(values):
        return (values - values.mean()) / values.std()

    by_reward = combined_advantages(rewards, weights, groups, "reward")
    expected, _ = numpy_group_advantages(0.7 * batch_z(aesthetic) + 0.3 * batch_z(ocr), groups)
    np.testing.assert_allclose(by_reward.values, expected, rtol=1e-10)

    by_advantage = combined_advantages(rewards, weights, groups, "advantage")
    expected = 0.7 * numpy_group_advantages(aesthetic, groups)[0] + 0.3 * numpy_group_advantages(ocr, groups)[0]
    np.testing.assert_allclose(by_advantage.values, expected, rtol=1e-10)

    flat_everywhere = np.zeros(12)  # e.g. a verifier nothing passes yet: no signal, and no NaN either
    alongside = combined_advantages({"aesthetic": aesthetic, "ocr": flat_everywhere}, weights, groups, "reward")
    expected, _ = numpy_group_advantages(0.7 * batch_z(aesthetic), groups)
    np.testing.assert_allclose(alongside.values, expected, rtol=1e-10)

    flat_ocr = np.repeat(rng.normal(size=4), 3)  # ocr flat in every group: only aesthetic drives advantages
    mixed = combined_advantages({"aesthetic": aesthetic, "ocr": flat_ocr}, weights, groups, "advantage")
    assert mixed.keep.all()
    np.testing.assert_allclose(mixed.values, 0.7 * numpy_group_advantages(aesthetic, groups)[0], rtol=1e-10)


def numpy_ppo_clip(log_prob, old_log_prob, advantages, clip_range, advantage_clip):
    advantages = np.clip(advantages, -advantage_clip, advantage_clip)
    ratio = np.exp(log_prob - old_log_prob)
    losses = np.maximum(-advantages * ratio, -advantages * np.clip(ratio, 1 - clip_range, 1 + clip_range))
    return losses.mean(), ratio


def test_ppo_clip_loss_and_clip_fractions_match_numpy():
    rng = np.random.default_rng(3)
    old = rng.normal(size=64)
    new = old + rng.normal(scale=2e-4, size=64)
    advantages = rng.normal(scale=4, size=64)  # some beyond ±5: clipped
    clip_range = 1e-4
    loss, ratio = ppo_clip_loss(*(torch.tensor(x) for x in (new, old, advantages)), clip_range, 5.0)
    expected_loss, expected_ratio = numpy_ppo_clip(new, old, advantages, clip_range, 5.0)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-12)
    np.testing.assert_allclose(ratio.numpy(), expected_ratio, rtol=1e-12)
    logs = ratio_diagnostics(ratio, torch.tensor(new), torch.tensor(old), clip_range)
    assert logs["clip_frac_high"] == pytest.approx(np.mean(expected_ratio > 1 + clip_range))
    assert logs["clip_frac_low"] == pytest.approx(np.mean(expected_ratio < 1 - clip_range))
    assert 0 < logs["clip_frac_high"] < 1 and 0 < logs["clip_frac_low"] < 1
    assert logs["clip_frac"] == pytest.approx(logs["clip_frac_high"] + logs["clip_frac_low"])
    assert logs["approx_kl"] == pytest.approx(0.5 * np.mean((new - old) ** 2), rel=1e-9)  # Flow-GRPO's


def test_ppo_clip_gradient_vanishes_outside_the_trust_region():
    old = torch.zeros(4, dtype=torch.float64)
    new = torch.tensor([0.1, -0.1, 0.1, -0.1], dtype=torch.float64, requires_grad=True)
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=torch.float64)
    loss, _ = ppo_clip_loss(new, old, advantages, clip_range=0.01)
    loss.backward()
    # moving further in the advantage's direction past the clip: no gradient; moving against it: gradient
    np.testing.assert_allclose(new.grad.numpy()[:2], 0.0)
    assert (new.grad.numpy()[2:] != 0).all()


def test_reward_diagnostics_report_proxy_gold_rank_correlation():
    proxy = np.array([1.0, 2.0, 3.0, 4.0])
    logs = reward_diagnostics({"proxy": proxy}, {"verifier": np.array([0.0, 0.0, 1.0, 1.0])})
    assert logs["reward/proxy/mean"] == 2.5 and logs["gold/verifier/mean"] == 0.5
    assert logs["proxy_gold_spearman/proxy/verifier"] == pytest.approx(np.sqrt(0.8))
