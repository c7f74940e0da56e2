"""Reward normalisation for consumers: rewards are pure, so the statistics live with whoever uses them.

- `RunningMeanStd`: mean and variance over every value seen (RL reward scaling); can be frozen for
  evaluation and saved/restored with a checkpoint (`state_dict` / `load_state_dict`).
- `group_zscore`: per-prompt z-scores (GRPO advantages). Statistics are taken over the whole group:
  with several processes pass `gather`, which must return the values and group labels of every
  process (e.g. `accelerate.utils.gather_object`), so no sample's value depends on how the group
  was split across processes or batches.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

Gather = Callable[[list], list]  # local list -> the concatenation of every process's list, in rank order


class RunningMeanStd:
    """Mean and variance over every value seen so far, merged batch by batch (Chan et al.), starting from
    a prior of mean 0 and variance 1 that weighs as `prior_count` values (`count` includes it).

    The prior keeps the variance positive until the values spread: without it a first batch of equal
    values has variance 0, and is divided by sqrt(epsilon). It fades as values arrive (after n values
    it weighs prior_count / (n + prior_count)). Non-finite values (a reward that failed on a sample)
    are left out of the statistics.
    """

    def __init__(self, epsilon: float = 1e-8, prior_count: float = 1.0):
        if not prior_count > 0:
            raise ValueError(f"RunningMeanStd: prior_count {prior_count}; expected > 0 (the weight of variance 1)")
        self.mean = 0.0
        self.var = 1.0
        self.count = float(prior_count)
        self.epsilon = epsilon
        self.frozen = False

    def update(self, values: np.ndarray) -> None:
        """Fold `values` into the statistics (a no-op while frozen)."""
        values = np.asarray(values, dtype=np.float64).ravel()
        values = values[np.isfinite(values)]
        if self.frozen or values.size == 0:
            return
        batch_mean, batch_var, batch_count = values.mean(), values.var(), values.size
        total = self.count + batch_count
        delta = batch_mean - self.mean
        merged_m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.mean = float(self.mean + delta * batch_count / total)
        self.var = float(merged_m2 / total)
        self.count = total

    def normalize(self, values: np.ndarray, center: bool = True) -> np.ndarray:
        """(values − mean) / std, or values / std with center=False (scale only, keeps the sign)."""
        values = np.asarray(values, dtype=np.float64)
        shifted = values - self.mean if center else values
        return shifted / np.sqrt(self.var + self.epsilon)

    def freeze(self, frozen: bool = True) -> None:
        """Stop (or resume) updating, e.g. for evaluation rollouts."""
        self.frozen = frozen

    def state_dict(self) -> dict[str, float | bool]:
        return {"mean": self.mean, "var": self.var, "count": self.count, "frozen": self.frozen}

    def load_state_dict(self, state: dict) -> None:
        missing = {"mean", "var", "count"} - set(state)
        if missing:
            raise ValueError(f"RunningMeanStd state: missing {sorted(missing)}")
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), float(state["count"])
        self.frozen = bool(state.get("frozen", False))


@dataclass(frozen=True)
class GroupStatistics:
    """Per sample: its group's mean, std and size (finite values only), over every process."""

    mean: np.ndarray
    std: np.ndarray
    size: np.ndarray

    @property
    def zero_std(self) -> np.ndarray:
        """Samples whose group has no spread (all rewards equal): their advantage carries no signal."""
        return self.std == 0


def group_statistics(values: np.ndarray, groups: Sequence[Hashable], gather: Gather | None = None) -> GroupStatistics:
    """Mean, std and count of each sample's group; with `gather`, over the values of every process."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or len(groups) != len(values):
        raise ValueError(f"group_statistics: {values.shape} values but {len(groups)} group labels; expected (N,) and N")
    all_values, all_groups = values, list(groups)
    if gather is not None:
        pairs = gather(list(zip(values.tolist(), groups)))
        all_values = np.array([value for value, _ in pairs], dtype=np.float64)
        all_groups = [group for _, group in pairs]
    by_group: dict[Hashable, list[float]] = {}
    for value, group in zip(all_values, all_groups):
        if np.isfinite(value):
            by_group.setdefault(group, []).append(value)
    mean, std, size = (np.full(len(values), np.nan) for _ in range(3))
    for i, group in enumerate(groups):
        members = np.asarray(by_group.get(group, []))
        if members.size:
            mean[i], std[i], size[i] = members.mean(), members.std(), members.size
    return GroupStatistics(mean, std, size)


def group_zscore(
    values: np.ndarray, groups: Sequence[Hashable], epsilon: float = 1e-4, gather: Gather | None = None
) -> np.ndarray:
    """(r − group mean) / (group std + epsilon); a group whose values are all equal gets zeros.

    Non-finite values stay NaN and do not enter the statistics. With `gather`, statistics cover the
    group's members on every process.
    """
    values = np.asarray(values, dtype=np.float64)
    stats = group_statistics(values, groups, gather)
    with np.errstate(divide="ignore", invalid="ignore"):  # epsilon may be 0: flat groups divide 0 by 0
        scores = (values - stats.mean) / (stats.std + epsilon)
    return np.where(stats.zero_std & np.isfinite(values), 0.0, scores)
