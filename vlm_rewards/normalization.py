"""Reward normalisation for composites: running mean/std across calls and z-scores within groups."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


class RunningMeanStd:
    """Mean and variance over every value seen so far, merged batch by batch (Chan et al.)."""

    def __init__(self, epsilon: float = 1e-8):
        self.mean = 0.0
        self.var = 1.0
        self.count = 0
        self.epsilon = epsilon

    def update(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        if values.size == 0:
            return
        batch_mean, batch_var, batch_count = values.mean(), values.var(), values.size
        total = self.count + batch_count
        delta = batch_mean - self.mean
        merged_m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.mean = self.mean + delta * batch_count / total
        self.var = merged_m2 / total
        self.count = total

    def normalize(self, values: np.ndarray) -> np.ndarray:
        return (np.asarray(values, dtype=np.float64) - self.mean) / np.sqrt(self.var + self.epsilon)


def group_zscore(values: np.ndarray, groups: Sequence[Hashable], epsilon: float = 1e-4) -> np.ndarray:
    """(r - group mean) / (group std + epsilon); a group whose values are all equal gets zeros.

    Non-finite values (a model that failed on one sample) stay NaN and do not enter the statistics.
    """
    values = np.asarray(values, dtype=np.float64)
    if len(groups) != len(values):
        raise ValueError(f"group_zscore: {len(values)} values but {len(groups)} group labels")
    normalized = np.full_like(values, np.nan)
    labels = np.array([hash(g) for g in groups])
    for label in np.unique(labels):
        members = (labels == label) & np.isfinite(values)
        if not members.any():
            continue
        group = values[members]
        normalized[members] = (group - group.mean()) / (group.std() + epsilon)
    return normalized
