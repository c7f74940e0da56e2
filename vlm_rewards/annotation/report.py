"""A report a person opens: per-episode progress curves (PNG), the distribution of final progress, and
the episodes that look wrong, linked from `report/index.html`.

Flags (also in episodes.parquet, column `flags`):
- `never_rises`: progress never gets more than `rise_threshold` above its first value;
- `collapses_at_end`: the final progress is more than `collapse_threshold` below the episode's peak;
- `disagrees_with_success`: a success flag exists and the final progress says otherwise.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlm_rewards.annotation.config import ReportConfig
from vlm_rewards.io import atomic_path

logger = logging.getLogger(__name__)

FLAG_NAMES = ("never_rises", "collapses_at_end", "disagrees_with_success")


def episode_flags(progress: np.ndarray, success: bool | None, config: ReportConfig) -> list[str]:
    progress = np.asarray(progress, dtype=np.float64)
    if progress.size == 0:
        return []
    flags = []
    if progress.max() - progress[0] < config.rise_threshold:
        flags.append("never_rises")
    if progress.max() - progress[-1] > config.collapse_threshold:
        flags.append("collapses_at_end")
    if success is not None and (
        (success and progress[-1] < config.success_threshold)
        or (not success and progress[-1] >= 1 - config.success_threshold)
    ):
        flags.append("disagrees_with_success")
    return flags


def write_report(
    folder: Path,
    episodes: Sequence[dict[str, Any]],
    progress: dict[str, tuple[Any, dict, np.ndarray]],
    failures: Sequence[dict[str, Any]],
    config: ReportConfig,
    title: str,
) -> Path:
    """PNG curves (flagged episodes first, up to `max_curves`), a histogram of final progress, and index.html."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vlm_rewards.annotation.outputs import shard_stem

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "curves").mkdir(exist_ok=True)
    ordered = sorted(episodes, key=lambda row: (not row["flags"],))  # stable: flagged first, listing order
    curves: dict[str, str] = {}
    for row in ordered[: config.max_curves]:
        _, _, values = progress[row["episode"]]
        if np.isnan(values).all():
            continue
        name = f"curves/{shard_stem(row['source'], row['episode'])}.png"
        fig, ax = plt.subplots(figsize=(4, 2.5), dpi=80)
        ax.plot(np.arange(len(values)), values, lw=1.5)
        ax.set_ylim(-0.05, 1.05) if np.nanmin(values) >= 0 and np.nanmax(values) <= 1 else None
        ax.set_xlabel("frame")
        ax.set_ylabel("progress")
        ax.set_title(f"{row['episode']} {row['flags']}"[:60], fontsize=8)
        fig.tight_layout()
        _save(fig, folder / name)
        plt.close(fig)
        curves[row["episode"]] = name

    finals = [row["progress_final"] for row in episodes if row["progress_final"] is not None]
    if not finals:
        finals = [row["reward"] for row in episodes]
    fig, ax = plt.subplots(figsize=(5, 3), dpi=80)
    ax.hist(finals, bins=20)
    ax.set_xlabel("final progress" if episodes and episodes[0]["progress_final"] is not None else "reward")
    ax.set_ylabel("episodes")
    fig.tight_layout()
    _save(fig, folder / "final_progress.png")
    plt.close(fig)

    flagged = [row for row in episodes if row["flags"]]
    parts = [
        f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(episodes)} annotated, {len(failures)} failed, {len(flagged)} flagged.</p>",
        "<h2>Final progress</h2><img src='final_progress.png'>",
        "<h2>Flagged episodes</h2>",
        _table(flagged, curves),
        "<h2>Failures</h2><table border=1><tr><th>episode</th><th>stage</th><th>reason</th></tr>",
        *[
            f"<tr><td>{html.escape(str(f['episode']))}</td><td>{html.escape(f['stage'])}</td>"
            f"<td>{html.escape(f['reason'])}</td></tr>"
            for f in failures
        ],
        "</table><h2>All episodes</h2>",
        _table(episodes, curves),
        "</body></html>",
    ]
    index = folder / "index.html"
    with atomic_path(index) as temporary:
        temporary.write_text("\n".join(parts))
    return index


def _table(rows: Sequence[dict[str, Any]], curves: dict[str, str]) -> str:
    lines = ["<table border=1><tr><th>episode</th><th>instruction</th><th>final</th><th>success</th>"
             "<th>flags</th><th>curve</th></tr>"]  # fmt: skip
    for row in rows:
        final = row["progress_final"] if row["progress_final"] is not None else row["reward"]
        curve = f"<img src='{curves[row['episode']]}' height=120>" if row["episode"] in curves else ""
        lines.append(
            f"<tr><td>{html.escape(row['episode'])}</td><td>{html.escape(row['instruction'] or '')}</td>"
            f"<td>{final:.3f}</td><td>{row['success']}</td><td>{html.escape(row['flags'])}</td><td>{curve}</td></tr>"
        )
    return "\n".join([*lines, "</table>"])


def _save(fig, path: Path) -> None:
    with atomic_path(path) as temporary:
        fig.savefig(temporary, format="png", metadata={"Software": None})
