"""`vlmr eval-rm`: evaluate any RewardModel on held-out episodes and preference pairs.

Progress metrics (models that return per-frame progress): VOC on expert clips, on the same clips
reversed (should go negative) and on random-action clips (should sit near 0), progress MAE, and
success-detection AUC of the last frame's reward. Language use: the same expert clips scored with
another episode's instruction should score lower. Preference metric: pairwise accuracy of
`prefer(chosen, rejected)`. Writes metrics.json and PNG progress curves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from vlm_rewards.config import JobConfig
from vlm_rewards.data.build import SyntheticData, open_episodes, open_pairs
from vlm_rewards.data.episodes import EpisodeDataset, EpisodeRecord, PairDataset
from vlm_rewards.data.labels import mismatched_instruction
from vlm_rewards.evaluation.metrics import mean_voc, pairwise_accuracy, progress_mae, success_auc
from vlm_rewards.evaluation.plots import plot_progress_curves
from vlm_rewards.interface import RewardModel, RewardRequest, RewardResult
from vlm_rewards.io import write_json
from vlm_rewards.registry import build_reward


class EvalRMConfig(JobConfig):
    reward: str | dict[str, Any] = "goal_pixel_progress"  # reward YAML path, name in configs/rewards/, or mapping
    episodes: Path | None = None  # an episode dataset folder; None: build synthetic held-out episodes
    pairs: Path | None = None  # a pair dataset folder; None: build synthetic held-out pairs
    # held-out ShapesWorld data, built when no folder is given (a seed disjoint from training's)
    synthetic: SyntheticData = pydantic.Field(
        default_factory=lambda: SyntheticData(num_episodes=64, num_pairs=128, seed=1000)
    )
    evaluate_pairs: bool | None = None  # None: only for preference models
    output_dir: Path = Path("outputs/eval_rm")
    batch_size: int = 16
    max_curves: int = 12
    seed: int = 0  # draws the mismatched instructions


def score_in_batches(
    reward: RewardModel, requests: Sequence[RewardRequest], batch_size: int, desc: str = "scoring"
) -> list[RewardResult]:
    results: list[RewardResult] = []
    for start in tqdm(range(0, len(requests), batch_size), desc=desc, unit="batch", leave=False):
        results.extend(reward.score(requests[start : start + batch_size]))
    return results


def evaluate_progress(
    reward: RewardModel, dataset: EpisodeDataset, batch_size: int, rng: np.random.Generator
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Progress metrics on an episode dataset, and per-episode curves for plotting."""
    records = list(dataset)
    requests = [dataset.to_request(record) for record in records]
    results = score_in_batches(reward, requests, batch_size, "episodes")
    if any(result.progress is None for result in results):
        raise ValueError(f"{reward.spec.name} returns no per-frame progress; progress metrics need it")
    experts = [i for i, record in enumerate(records) if _is_expert(record)]
    randoms = [i for i, record in enumerate(records) if record.policy == "random"]
    reversed_clips = [dataset.to_request(records[i], range(records[i].num_frames - 1, -1, -1)) for i in experts]
    reversed_results = score_in_batches(reward, reversed_clips, batch_size, "reversed clips")
    instructions = dataset.instructions
    mismatched = [
        replace(requests[i], text=mismatched_instruction(records[i].instruction, instructions, rng)) for i in experts
    ]
    mismatched_results = score_in_batches(reward, mismatched, batch_size, "mismatched instructions")
    matched_rewards = np.array([results[i].reward for i in experts])
    mismatched_rewards = np.array([result.reward for result in mismatched_results])
    metrics = {
        "voc_expert": mean_voc([results[i].progress for i in experts]),
        "voc_reversed": mean_voc([result.progress for result in reversed_results]),
        "voc_random": mean_voc([results[i].progress for i in randoms]) if randoms else float("nan"),
        "frame_pair_accuracy": frame_pair_accuracy([r.progress for r in results], [rec.progress for rec in records]),
        "progress_mae": float(np.nanmean([progress_mae(r.progress, rec.progress) for r, rec in zip(results, records)])),
        "success_auc": success_auc(np.array([r.reward for r in results]), np.array([rec.success for rec in records])),
        "reward_matched_instruction": float(matched_rewards.mean()),
        "reward_mismatched_instruction": float(mismatched_rewards.mean()),
        "mismatch_accuracy": float((matched_rewards > mismatched_rewards).mean()),
        "num_episodes": len(records),
        "num_expert_episodes": len(experts),
    }
    curves = [
        {"title": f"{rec.policy or 'episode'} {rec.episode_id}", "predicted": r.progress, "label": rec.progress}
        for r, rec in zip(results, records)
    ]
    return metrics, curves


def evaluate_pair_dataset(reward: RewardModel, pairs: PairDataset, batch_size: int) -> dict[str, float]:
    chosen, rejected = zip(*(pairs.to_requests(pair) for pair in pairs))
    probabilities = np.concatenate(
        [
            reward.prefer(chosen[start : start + batch_size], rejected[start : start + batch_size])
            for start in tqdm(range(0, len(chosen), batch_size), desc="pairs", unit="batch", leave=False)
        ]
    )
    ties = np.array([pair.tie for pair in pairs])
    return {
        "pair_accuracy": pairwise_accuracy(probabilities, np.ones(len(probabilities), bool), ties),
        "num_pairs": len(probabilities),
    }


def run_eval(config: EvalRMConfig, console: Console | None = None, reward: RewardModel | None = None) -> dict:
    console = console or Console()
    reward = reward or build_reward(config.reward)
    evaluate_pairs = reward.spec.output == "preference" if config.evaluate_pairs is None else config.evaluate_pairs
    rng = np.random.default_rng(config.seed)
    metrics: dict[str, Any] = {"reward": reward.spec.name, "version": reward.spec.version}
    if reward.spec.output != "preference":
        progress_metrics, curves = evaluate_progress(
            reward,
            open_episodes(config.episodes, config.synthetic, config.output_dir / "data" / "episodes", "shapes-heldout"),
            config.batch_size,
            rng,
        )
        metrics |= progress_metrics
        experts_first = sorted(curves, key=lambda curve: not curve["title"].startswith("expert"))
        plot_progress_curves(config.output_dir / "progress_curves.png", experts_first, config.max_curves)
    if evaluate_pairs:
        metrics |= evaluate_pair_dataset(
            reward,
            open_pairs(config.pairs, config.synthetic, config.output_dir / "data" / "pairs", "shapes-heldout-pairs"),
            config.batch_size,
        )
    write_json(config.output_dir / "metrics.json", metrics)
    console.print(metrics_table(metrics))
    console.print(f"wrote {config.output_dir / 'metrics.json'}")
    return metrics


def metrics_table(metrics: dict[str, Any]) -> Table:
    table = Table("metric", "value", title=f"{metrics['reward']} ({metrics['version']})")
    for key, value in metrics.items():
        if isinstance(value, float):
            table.add_row(key, f"{value:.3f}")
    return table


def _is_expert(record: EpisodeRecord) -> bool:
    return record.policy == "expert" if record.policy is not None else record.success


def frame_pair_accuracy(predicted: Sequence[np.ndarray], labels: Sequence[np.ndarray], min_gap: float = 0.1) -> float:
    """Within each episode, how often two frames whose labels differ by ≥ min_gap are ordered right."""
    predicted_gaps, label_gaps = [], []
    for values, label in zip(predicted, labels):
        earlier, later = np.triu_indices(len(label), k=1)
        label_gap = label[later] - label[earlier]
        keep = np.abs(label_gap) >= min_gap
        predicted_gaps.append(values[later][keep] - values[earlier][keep])
        label_gaps.append(label_gap[keep])
    # P(later frame ahead) is 1, 0, or 0.5 for a predicted tie, which pairwise_accuracy gives half credit
    p_later_ahead = 0.5 + 0.5 * np.sign(np.concatenate(predicted_gaps))
    return pairwise_accuracy(p_later_ahead, np.concatenate(label_gaps) > 0)
