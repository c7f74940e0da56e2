"""Small diagnostic figures, written atomically as PNG.

Figures are built with `matplotlib.figure.Figure`, not pyplot, so nothing here touches the global
backend or leaks open figures; saving to PNG renders with Agg.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from vlm_rewards.io import atomic_path

PANEL_SIZE = (2.6, 2.0)  # inches per panel
MAX_COLUMNS = 4


def plot_progress_curves(path: str | Path, curves: Sequence[Mapping[str, Any]], max_panels: int = 12) -> None:
    """One small panel per episode: predicted progress against the label when there is one.

    curves: dicts with "title", "predicted" (T,) and optionally "label" (T,); only the first
        `max_panels` are drawn.
    """
    curves = list(curves)[:max_panels]
    figure, axes = _grid(len(curves))
    for ax, curve in zip(axes, curves):
        ax.plot(np.asarray(curve["predicted"]), marker=".", label="predicted")
        if curve.get("label") is not None:
            ax.plot(np.asarray(curve["label"]), linestyle="--", color="black", label="label")
        ax.set_title(curve["title"], fontsize=7)
        ax.set_ylim(-0.05, 1.05)
        ax.tick_params(labelsize=6)
    labelled = [ax for ax, curve in zip(axes, curves) if curve.get("label") is not None]
    (labelled or axes)[0].legend(fontsize=6)
    save_png(figure, path)


def plot_training_curves(path: str | Path, history: Mapping[str, Sequence[tuple[int, float]]]) -> None:
    """One panel per metric, value against step; history maps a metric name to (step, value) points."""
    figure, axes = _grid(len(history))
    for ax, (metric, points) in zip(axes, history.items()):
        steps, values = zip(*points) if points else ((), ())
        ax.plot(steps, values)
        ax.set_title(metric, fontsize=8)
        ax.set_xlabel("step", fontsize=7)
        ax.tick_params(labelsize=6)
    save_png(figure, path)


def plot_reward_distributions(path: str | Path, groups: Mapping[str, Sequence[float]], title: str) -> None:
    """A box per group of rewards (e.g. per policy), to see at a glance whether a reward ranks them."""
    figure = Figure(figsize=(1.4 * len(groups) + 2, 3.2), layout="constrained")
    ax = figure.subplots()
    ax.boxplot([np.asarray(values, dtype=float) for values in groups.values()], tick_labels=list(groups))
    ax.set_ylabel("reward")
    ax.set_title(title, fontsize=9)
    save_png(figure, path)


def _grid(num_panels: int) -> tuple[Figure, list]:
    if num_panels == 0:
        raise ValueError("nothing to plot")
    columns = min(num_panels, MAX_COLUMNS)
    rows = math.ceil(num_panels / columns)
    figure = Figure(figsize=(PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel().tolist()
    for unused in axes[num_panels:]:
        unused.set_visible(False)
    return figure, axes


def save_png(figure: Figure, path: str | Path) -> None:
    """`figure` as a PNG at `path`, written atomically."""
    with atomic_path(path) as temporary:
        figure.savefig(temporary, format="png", dpi=100)
