"""GRPO's math: group-relative advantages (one or several rewards), the PPO-clip loss and its diagnostics.

Advantages are per-prompt z-scores from `vlm_rewards.normalization` (statistics over the whole group,
gathered across processes), or with `global_std` the deviation from the group mean over the std of the
whole batch (Flow-GRPO's option); groups whose rewards are all equal carry no signal and are dropped
from the update (and counted). Several rewards combine in one of two ways:
- "reward": each reward z-scored over the whole batch (so weights compare like with like; a reward
  flat over the batch adds nothing), weighted sum, then group advantages of the sum;
- "advantage": group advantages of each reward, then their weighted sum (a group is dropped only if
  every reward is flat in it).

With `train.advantage: pairwise` (Pref-GRPO) a trained reward's value for an image is its win rate in its
prompt group under the reward's `prefer` (`pairwise_win_rates`) instead of its score; the rest is the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from vlm_rewards.interface import RewardRequest
from vlm_rewards.normalization import Gather, group_statistics, group_zscore

Aggregation = Literal["reward", "advantage"]


@dataclass
class Advantages:
    values: np.ndarray  # (N,) finite; 0 where not kept
    keep: np.ndarray  # (N,) bool: samples that enter the update
    zero_std_ratio: float  # share of samples whose group has zero reward std

    @property
    def num_dropped(self) -> int:
        return int((~self.keep).sum())


def group_advantages(
    rewards: np.ndarray,
    groups: Sequence[Hashable],
    epsilon: float = 1e-4,
    gather: Gather | None = None,
    global_std: bool = False,
) -> Advantages:
    """(r − group mean) / (std + ε) per prompt, std the group's or (`global_std`) the whole batch's, every process
    included; zero-std groups and non-finite rewards dropped."""
    rewards = np.asarray(rewards, dtype=np.float64)
    stats = group_statistics(rewards, groups, gather)
    std = group_statistics(rewards, ["batch"] * len(rewards), gather).std if global_std else stats.std
    with np.errstate(divide="ignore", invalid="ignore"):  # epsilon may be 0: flat groups divide 0 by 0
        values = (rewards - stats.mean) / (std + epsilon)
    keep = ~stats.zero_std & np.isfinite(values)
    return Advantages(np.where(keep, values, 0.0), keep, float(stats.zero_std.mean()))


def combined_advantages(
    rewards: Mapping[str, np.ndarray],
    weights: Mapping[str, float],
    groups: Sequence[Hashable],
    aggregation: Aggregation = "reward",
    epsilon: float = 1e-4,
    gather: Gather | None = None,
    global_std: bool = False,
) -> Advantages:
    """Advantages from several rewards (see the module docstring); one reward is plain `group_advantages`."""
    if len(rewards) == 1:
        (values,) = rewards.values()
        return group_advantages(values, groups, epsilon, gather, global_std)
    if aggregation == "reward":
        whole_batch = ["batch"] * len(groups)
        total = sum(weights[name] * group_zscore(values, whole_batch, 0.0, gather) for name, values in rewards.items())
        return group_advantages(total, groups, epsilon, gather, global_std)
    if aggregation == "advantage":
        parts = {
            name: group_advantages(values, groups, epsilon, gather, global_std) for name, values in rewards.items()
        }
        total = sum(weights[name] * part.values for name, part in parts.items())
        keep = np.logical_or.reduce([part.keep for part in parts.values()])
        return Advantages(np.where(keep, total, 0.0), keep, float((~keep).mean()))
    raise ValueError(f"aggregation {aggregation!r}; expected 'reward' or 'advantage'")


def check_prefer(rewards: Mapping[str, object]) -> None:
    """Pairwise advantages need every trained reward to judge pairs: refuse one without `prefer(a, b)`."""
    for name, reward in rewards.items():
        if not callable(getattr(reward, "prefer", None)):
            raise ValueError(
                f"train.advantage 'pairwise': reward {name!r} ({type(reward).__name__}) has no prefer(a, b); "
                "expected a reward of the reward interface (RewardModel.prefer), or use advantage: pointwise"
            )


def pairwise_win_rates(
    rewards: Mapping[str, object], images: np.ndarray, prompts: Sequence[str]
) -> dict[str, np.ndarray]:
    """Per trained reward, each image's win rate in its prompt group (`win_rates`), images as one-frame clips."""
    requests = [RewardRequest(image[None], prompt) for image, prompt in zip(images, prompts)]
    return {name: win_rates(reward.prefer, requests, prompts, name) for name, reward in rewards.items()}


def win_rates(
    prefer: Callable[[list[RewardRequest], list[RewardRequest]], np.ndarray],
    requests: Sequence[RewardRequest],
    groups: Sequence[Hashable],
    name: str = "reward",
) -> np.ndarray:
    """(N,) mean over the other members j of i's group of P(i beats j); every pair judged once, as
    prefer(earlier, later), with P(j beats i) = 1 − P(i beats j). One `prefer` call per group."""
    wins, opponents = np.zeros(len(requests)), np.zeros(len(requests))
    members: dict[Hashable, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    for group, indices in members.items():
        if len(indices) < 2:
            raise ValueError(f"pairwise win rates: group {group!r} has one image; expected at least 2 per group")
        first, second = np.array(list(itertools.combinations(indices, 2))).T
        first_wins = np.asarray(prefer([requests[i] for i in first], [requests[j] for j in second]), np.float64)
        if first_wins.shape != first.shape or not np.all((first_wins >= 0) & (first_wins <= 1)):
            raise ValueError(
                f"reward {name!r}: prefer gave {first_wins.tolist()[:8]} for the {len(first)} pairs of group "
                f"{group!r}; expected one probability in [0, 1] per pair"
            )
        np.add.at(wins, first, first_wins)
        np.add.at(wins, second, 1 - first_wins)
        np.add.at(opponents, first, 1)
        np.add.at(opponents, second, 1)
    return wins / opponents


def ppo_clip_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    advantage_clip: float = 5.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean PPO-clip policy loss over the batch, and the importance ratios."""
    advantages = advantages.clamp(-advantage_clip, advantage_clip)
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    return torch.maximum(unclipped, clipped).mean(), ratio


def ratio_diagnostics(
    ratio: torch.Tensor, log_prob: torch.Tensor, old_log_prob: torch.Tensor, clip_range: float
) -> dict:
    """Clip fractions (all, above and below the trust region), Flow-GRPO's approx-KL and the ratio's spread."""
    ratio = ratio.detach()
    return clip_statistics((log_prob - old_log_prob).detach(), clip_range) | {
        "clip_frac_high": (ratio > 1.0 + clip_range).float().mean().item(),
        "clip_frac_low": (ratio < 1.0 - clip_range).float().mean().item(),
        "ratio_mean": ratio.mean().item(),
        "ratio_max_deviation": (ratio - 1).abs().max().item(),
    }


def clip_statistics(log_ratio: torch.Tensor, clip_range: float) -> dict[str, float]:
    """As Flow-GRPO logs them: the clip fraction, mean(|ratio − 1| > clip_range), and the approx KL,
    0.5·mean((log_prob − old_log_prob)²)."""
    return {
        "clip_frac": ((log_ratio.exp() - 1).abs() > clip_range).float().mean().item(),
        "approx_kl": 0.5 * log_ratio.pow(2).mean().item(),
    }


class ClipTracker:
    """Clip fraction and approx KL of an epoch's PPO updates, per denoising step index and per optimizer step.

    The log-probs are averaged over every latent element, so log-ratios are small and a `clip_range` made for
    token log-probs may never engage: these say whether clipping acts at all, when, and at which steps of the
    trajectory.
    """

    def __init__(self, clip_range: float):
        self.clip_range = clip_range
        self.by_step_index: dict[int, list[torch.Tensor]] = {}
        self.since_update: list[torch.Tensor] = []
        self.updates: list[dict[str, float]] = []

    def add(self, log_ratio: torch.Tensor, step_indices: torch.Tensor) -> None:
        """One trained step of a minibatch: each sample's log(π/π_old) and the denoising step index it is at."""
        log_ratio, step_indices = log_ratio.detach().float().cpu(), step_indices.cpu()
        self.since_update.append(log_ratio)
        for index in step_indices.unique().tolist():
            self.by_step_index.setdefault(index, []).append(log_ratio[step_indices == index])

    def optimizer_step(self) -> dict[str, float]:
        """The statistics since the previous optimizer step (this one's samples and steps)."""
        logs = clip_statistics(torch.cat(self.since_update), self.clip_range)
        self.since_update = []
        self.updates.append(logs)
        return logs

    def logs(self) -> dict[str, float]:
        """Per denoising step index (`train/clip_frac/step_03`), and the largest of any optimizer step."""
        logs = {
            f"train/{name}/step_{index:02d}": value
            for index in sorted(self.by_step_index)
            for name, value in clip_statistics(torch.cat(self.by_step_index[index]), self.clip_range).items()
        }
        if self.updates:
            for name in ("clip_frac", "approx_kl"):
                logs[f"train/{name}_max"] = max(update[name] for update in self.updates)
        return logs


def reward_diagnostics(rewards: Mapping[str, np.ndarray], gold: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Per-reward mean/std; with a gold reward, each trained reward's rank correlation with it.

    A trained (proxy) reward that keeps rising while its correlation with gold falls is being hacked.
    """
    logs = {}
    for prefix, table in (("reward", rewards), ("gold", gold)):
        for name, values in table.items():
            logs[f"{prefix}/{name}/mean"] = float(np.nanmean(values))
            logs[f"{prefix}/{name}/std"] = float(np.nanstd(values))
    for name, values in rewards.items():
        for gold_name, gold_values in gold.items():
            logs[f"proxy_gold_spearman/{name}/{gold_name}"] = spearman(values, gold_values)
    return logs


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (average ranks for ties); NaN when either side is constant."""
    ranks = [_average_ranks(np.asarray(values, dtype=np.float64)) for values in (a, b)]
    if min(r.std() for r in ranks) == 0:
        return float("nan")
    return float(np.corrcoef(*ranks)[0, 1])


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks
