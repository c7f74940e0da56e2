"""`vlmr eval-rm`: evaluate any RewardModel on held-out episodes and preference pairs.

Progress metrics (models that return per-frame progress): VOC on expert clips, on the same clips
reversed (should go negative) and on random-action clips (should sit near 0), progress MAE, and
success-detection AUC of the last frame's reward. Rewards with a `success` component (a trained RM's
success head) add its AUROC against the episode outcome (`success_head_auroc_final`) and, on episodes with
per-frame labels, per frame (`success_head_auroc_frame`, from `info["success_per_frame"]`); rewards with a
`stage` component add `stage_accuracy` on frames with a known stage (`info["stage_per_frame"]`).
Language use: the same expert clips scored with another episode's instruction should score lower.
Preference metric: pairwise accuracy of `prefer(chosen, rejected)`. Writes metrics.json and PNG progress curves.

Frames, episodes and pairs a reward could not score (NaN, as an LLM judge returns by design) are left
out of every metric and counted: `num_unscored_frames`, `num_unscored_episodes`, `num_unscored_pairs`.
Long episodes are scored the way `vlm_rewards.subsample.score_episodes` does: subsampled to the
reward's frame budget, the values spread back to every frame.

Library code: it logs through `logging` and shows progress only through an injected `track`
(`vlm_rewards.tracking.Track`; the CLI passes a tqdm one).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vlm_rewards.annotation.lerobot_episodes import LeRobotEpisodes
from vlm_rewards.data.build import open_episodes, open_pairs
from vlm_rewards.data.episodes import EpisodeDataset, EpisodeRecord, PairDataset
from vlm_rewards.data.labels import mismatched_instruction
from vlm_rewards.data.opengvl import read_opengvl_set
from vlm_rewards.evaluation.config import EvalRMConfig
from vlm_rewards.evaluation.metrics import (
    mean_voc,
    pairwise_accuracy,
    progress_mae,
    stage_accuracy,
    step_correlation,
    success_auc,
    voc,
)
from vlm_rewards.evaluation.plots import plot_progress_curves
from vlm_rewards.interface import RewardModel, RewardRequest, RewardResult
from vlm_rewards.io import atomic_path, write_json
from vlm_rewards.registry import build_reward
from vlm_rewards.subsample import score_episodes, subsample_indices
from vlm_rewards.tracking import Track, untracked

logger = logging.getLogger(__name__)


def score_in_batches(
    reward: RewardModel,
    requests: Sequence[RewardRequest],
    batch_size: int,
    desc: str = "scoring",
    track: Track | None = None,
) -> list[RewardResult]:
    """Results in request order, `batch_size` requests per `score` call. Dense rewards score episodes
    longer than `spec.max_frames` on a subsample and get per-frame values for every frame back."""
    budget = reward.spec.max_frames if reward.spec.dense else None
    results: list[RewardResult] = []
    for start in (track or untracked)(range(0, len(requests), batch_size), desc):
        batch = list(requests[start : start + batch_size])
        long = [i for i, request in enumerate(batch) if budget is not None and request.num_frames > budget]
        if not long:
            results.extend(reward.score(batch))
            continue
        # only episodes over the budget go through subsampling (whose interpolation fills unscored frames)
        short = [i for i in range(len(batch)) if i not in set(long)]
        scored = dict(zip(long, score_episodes(reward, [batch[i] for i in long])))
        scored |= dict(zip(short, reward.score([batch[i] for i in short]) if short else []))
        results.extend(scored[i] for i in range(len(batch)))
    return results


def evaluate_progress(
    reward: RewardModel,
    dataset: EpisodeDataset,
    batch_size: int,
    rng: np.random.Generator,
    track: Track | None = None,
    clip_frames: int | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Progress metrics on an episode dataset, and per-episode curves for plotting.

    Unscored (NaN) frames and episodes are left out of each metric and counted in the metrics.
    clip_frames: the clip length the reward trained on; adds `step_correlation_at_clip_frames`, the same
    metric on the episodes subsampled to that length. Far above `step_correlation`, the reward holds
    only at its training length, and a consumer that streams whole episodes gets the worse figure.
    """
    if not reward.spec.dense:
        raise ValueError(f"{reward.spec.name} returns no per-frame progress; progress metrics need it")
    records = list(dataset)
    requests = [dataset.to_request(record) for record in records]
    results = _with_progress(score_in_batches(reward, requests, batch_size, "episodes", track), requests)
    experts = [i for i, record in enumerate(records) if _is_expert(record)]
    randoms = [i for i, record in enumerate(records) if record.policy == "random"]
    reversed_clips = [dataset.to_request(records[i], range(records[i].num_frames - 1, -1, -1)) for i in experts]
    reversed_results = _with_progress(
        score_in_batches(reward, reversed_clips, batch_size, "reversed clips", track), reversed_clips
    )
    frozen_clips = [dataset.to_request(records[i], [0] * records[i].num_frames) for i in experts]
    frozen_results = _with_progress(
        score_in_batches(reward, frozen_clips, batch_size, "first frame throughout", track), frozen_clips
    )
    pixel_changes = [np.abs(results[i].progress - frozen.progress) for i, frozen in zip(experts, frozen_results)]
    instructions = dataset.instructions
    # a single-task dataset has no other instruction to swap in: its instruction metrics are NaN
    swapped = experts if len(set(instructions)) > 1 else []
    mismatched = [
        replace(requests[i], text=mismatched_instruction(records[i].instruction, instructions, rng)) for i in swapped
    ]
    mismatched_results = score_in_batches(reward, mismatched, batch_size, "mismatched instructions", track)
    matched_rewards = np.array([results[i].reward for i in swapped], dtype=np.float64)
    mismatched_rewards = np.array([result.reward for result in mismatched_results], dtype=np.float64)
    both_scored = np.isfinite(matched_rewards) & np.isfinite(mismatched_rewards)
    final_rewards = np.array([r.reward for r in results], dtype=np.float64)
    scored_episodes = np.isfinite(final_rewards)
    metrics = {
        "voc_expert": mean_voc([results[i].progress for i in experts]) if experts else float("nan"),
        "voc_reversed": mean_voc([result.progress for result in reversed_results]) if experts else float("nan"),
        "voc_random": mean_voc([results[i].progress for i in randoms]) if randoms else float("nan"),
        "frame_pair_accuracy": frame_pair_accuracy([r.progress for r in results], [rec.progress for rec in records]),
        "progress_mae": float(np.nanmean([progress_mae(r.progress, rec.progress) for r, rec in zip(results, records)])),
        "step_correlation": step_correlation([r.progress for r in results], [rec.progress for rec in records]),
        "success_auc": success_auc(
            final_rewards[scored_episodes], np.array([rec.success for rec in records])[scored_episodes]
        )
        if scored_episodes.any()
        else float("nan"),
        # how much per-frame progress moves when every frame shows the first one: near 0, the RM scores by
        # frame position, not by what it sees
        "pixel_sensitivity": _nanmean(np.concatenate(pixel_changes)) if pixel_changes else float("nan"),
        "reward_matched_instruction": _nanmean(matched_rewards),
        "reward_mismatched_instruction": _nanmean(mismatched_rewards),
        "mismatch_accuracy": float((matched_rewards[both_scored] > mismatched_rewards[both_scored]).mean())
        if both_scored.any()
        else float("nan"),
        # how much the final reward moves at all when the instruction changes: near 0, the RM ignores the text
        # (an accuracy near ½ cannot tell ignoring from noisy use)
        "instruction_sensitivity": _nanmean(np.abs(matched_rewards - mismatched_rewards)[both_scored]),
        **_per_policy(records, results, final_rewards),
        **_head_metrics(reward, records, results),
        "num_episodes": len(records),
        "num_expert_episodes": len(experts),
        "num_unscored_frames": int(sum(np.isnan(r.progress).sum() for r in results)),
        "num_unscored_episodes": int((~scored_episodes).sum()),
    }
    if clip_frames is not None:
        metrics["step_correlation_at_clip_frames"] = _step_correlation_at_length(
            reward, dataset, records, clip_frames, batch_size, track
        )
    if metrics["num_unscored_frames"]:
        logger.warning(
            "%s left %d frame(s) in %d episode(s) unscored; metrics leave them out",
            reward.spec.name,
            metrics["num_unscored_frames"],
            sum(bool(np.isnan(r.progress).any()) for r in results),
        )
    curves = [
        {"title": f"{rec.policy or 'episode'} {rec.episode_id}", "predicted": r.progress, "label": rec.progress}
        for r, rec in zip(results, records)
    ]
    return metrics, curves


def evaluate_pair_dataset(
    reward: RewardModel, pairs: PairDataset, batch_size: int, track: Track | None = None
) -> dict[str, float]:
    """Pairwise accuracy of `prefer`; pairs it could not judge (NaN) are left out and counted."""
    chosen, rejected = zip(*(pairs.to_requests(pair) for pair in pairs))
    probabilities = np.concatenate(
        [
            np.asarray(reward.prefer(chosen[start : start + batch_size], rejected[start : start + batch_size]), float)
            for start in (track or untracked)(range(0, len(chosen), batch_size), "pairs")
        ]
    )
    ties = np.array([pair.tie for pair in pairs])
    judged = ~np.isnan(probabilities)
    return {
        "pair_accuracy": pairwise_accuracy(probabilities[judged], np.ones(int(judged.sum()), bool), ties[judged])
        if judged.any()
        else float("nan"),
        "num_pairs": len(probabilities),
        "num_unscored_pairs": int((~judged).sum()),
    }


def run_eval(config: EvalRMConfig, track: Track | None = None, reward: RewardModel | None = None) -> dict:
    """Evaluate `reward` (default: built from config.reward); writes metrics.json and returns the metrics.

    `track` shows progress (the CLI passes tqdm).
    """
    reward = reward or build_reward(config.reward)
    evaluate_pairs = (not reward.spec.dense) if config.evaluate_pairs is None else config.evaluate_pairs
    rng = np.random.default_rng(config.seed)
    metrics: dict[str, Any] = {"reward": reward.spec.name, "version": reward.spec.version}
    if reward.spec.dense and config.opengvl is not None:
        metrics |= evaluate_opengvl(reward, config.opengvl, config.batch_size, config.output_dir, track)
    if reward.spec.dense and (config.episodes is not None or config.opengvl is None):
        episodes = _eval_episodes(config, track)
        progress_metrics, curves = evaluate_progress(
            reward, episodes, config.batch_size, rng, track, config.clip_frames
        )
        metrics |= progress_metrics
        experts_first = sorted(curves, key=lambda curve: not curve["title"].startswith("expert"))
        plot_progress_curves(config.output_dir / "progress_curves.png", experts_first, config.max_curves)
    if evaluate_pairs:
        pairs = open_pairs(
            config.pairs, config.synthetic, config.output_dir / "data" / "pairs", "shapes-heldout-pairs", track
        )
        metrics |= evaluate_pair_dataset(reward, pairs, config.batch_size, track)
    elif not reward.spec.dense:
        raise ValueError(
            f"{reward.spec.name} returns no per-frame progress; progress metrics need it (and evaluate_pairs is false)"
        )
    write_json(config.output_dir / "metrics.json", metrics)
    logger.info(
        "%s: %s", metrics["reward"], ", ".join(f"{k}={v:.3f}" for k, v in metrics.items() if isinstance(v, float))
    )
    logger.info("wrote %s", config.output_dir / "metrics.json")
    return metrics


def _eval_episodes(config: EvalRMConfig, track: Track | None):
    if config.format == "lerobot":
        return LeRobotEpisodes(config.episodes, config.lerobot, config.lerobot.eval_episodes)
    return open_episodes(
        config.episodes, config.synthetic, config.output_dir / "data" / "episodes", "shapes-heldout", track
    )


def evaluate_opengvl(
    reward: RewardModel, root: Path, batch_size: int, output_dir: Path, track: Track | None = None
) -> dict[str, Any]:
    """OpenGVL's benchmark on an OpenGVL-style set (`vlm_rewards.data.opengvl`): each episode's starting frame
    then its shuffled frames in one request; the per-frame progress of the shuffled frames, put back in time
    order, scored with VOC (0 for constant or unscored predictions, as OpenGVL does). Writes
    opengvl_predictions.jsonl (per episode: predicted completion in percent in the order shown, VOC).

    Episodes that show more frames than the reward's `spec.max_frames` are left out (subsampling a shuffled
    clip would change what is asked) and counted with unreadable records in `opengvl_num_skipped`."""
    episodes, skipped = read_opengvl_set(root)
    budget = reward.spec.max_frames
    for episode in episodes:
        if budget is not None and episode.num_shown > budget:
            skipped[f"episode {episode.episode_index}"] = f"shows {episode.num_shown} frames, the reward takes {budget}"
    kept = [episode for episode in episodes if budget is None or episode.num_shown <= budget]
    if not kept:
        raise ValueError(f"{root}: no episode to score ({skipped})")
    if skipped:
        logger.warning("%s: left out %d episode(s): %s", root, len(skipped), skipped)
    requests = [episode.request(Path(root).name) for episode in kept]
    results = _with_progress(score_in_batches(reward, requests, batch_size, "OpenGVL episodes", track), requests)
    vocs, errors, records = [], [], []
    for episode, result in zip(kept, results):
        shown = np.asarray(result.progress[-len(episode.frames) :], dtype=np.float64)
        vocs.append(voc(shown[np.argsort(episode.shuffled_indices, kind="stable")]))
        errors.append(progress_mae(shown, episode.completion / 100.0))
        records.append({"episode_index": episode.episode_index, "instruction": episode.instruction,
                        "shuffled_frames_indices": episode.shuffled_indices.tolist(),
                        "predicted_percentages": [None if np.isnan(v) else 100 * v for v in shown.tolist()],
                        "voc": vocs[-1]})  # fmt: skip
    with atomic_path(output_dir / "opengvl_predictions.jsonl") as temporary:
        temporary.write_text("".join(json.dumps(record) + "\n" for record in records))
    return {
        "opengvl_voc": float(np.mean(vocs)),
        "opengvl_voc_median": float(np.median(vocs)),
        "opengvl_progress_mae": _nanmean(np.array(errors)),
        "opengvl_num_episodes": len(kept),
        "opengvl_num_unscored_episodes": int(sum(bool(np.isnan(r.progress).any()) for r in results)),
        "opengvl_num_skipped": len(skipped),
    }


def _per_policy(records: list, results: list, final_rewards: np.ndarray) -> dict[str, float]:
    """The mean final reward each policy earns, and how well the steps follow the labels on its episodes
    (a policy's own states: an RL policy's rollouts, where shaping needs the steps right)."""
    metrics = {}
    for policy in sorted({record.policy for record in records if record.policy}):
        mine = [i for i, record in enumerate(records) if record.policy == policy]
        metrics[f"reward_policy_{policy}"] = _nanmean(final_rewards[mine])
        metrics[f"step_correlation_policy_{policy}"] = step_correlation(
            [results[i].progress for i in mine], [records[i].progress for i in mine]
        )
    return metrics


def _head_metrics(reward: RewardModel, records: list[EpisodeRecord], results: list[RewardResult]) -> dict[str, float]:
    """Success-head AUROC (final frame vs the episode outcome; per frame vs `frame_success`) and stage accuracy,
    for rewards with those components. Per-frame metrics read the results' per-frame info and leave out
    episodes without it (an episode scored on a subsample) or without labels; NaN when nothing is left."""
    metrics = {}
    if "success" in reward.spec.components:
        final = np.array([result.components["success"] for result in results], dtype=np.float64)
        scored = np.isfinite(final)
        outcomes = np.array([record.success for record in records])[scored]
        metrics["success_head_auroc_final"] = success_auc(final[scored], outcomes) if scored.any() else float("nan")
        pairs = _frame_pairs(records, results, "success_per_frame", "frame_success")
        metrics["success_head_auroc_frame"] = success_auc(*pairs) if len(pairs[0]) else float("nan")
    if "stage" in reward.spec.components:
        pairs = _frame_pairs(records, results, "stage_per_frame", "stage")
        metrics["stage_accuracy"] = stage_accuracy(*pairs) if len(pairs[0]) else float("nan")
    return metrics


def _frame_pairs(records: list[EpisodeRecord], results: list[RewardResult], info_key: str, label: str):
    """(predicted, label) over the frames of every episode that has both, the prediction finite."""
    predicted, labels = [], []
    for record, result in zip(records, results):
        values, known = result.info.get(info_key), getattr(record, label)
        if values is None or known is None or len(values) != record.num_frames:
            continue
        values = np.asarray(values, dtype=np.float64)
        finite = np.isfinite(values)
        predicted.append(values[finite])
        labels.append(np.asarray(known)[finite])
    return (np.concatenate(predicted), np.concatenate(labels)) if predicted else (np.array([]), np.array([]))


def _step_correlation_at_length(
    reward: RewardModel,
    dataset: EpisodeDataset,
    records: list[EpisodeRecord],
    num_frames: int,
    batch_size: int,
    track: Track | None,
) -> float:
    """`step_correlation` of the episodes subsampled to `num_frames` evenly spaced frames."""
    kept = [subsample_indices(record.num_frames, num_frames) for record in records]
    requests = [dataset.to_request(record, indices) for record, indices in zip(records, kept)]
    results = _with_progress(
        score_in_batches(reward, requests, batch_size, f"{num_frames}-frame clips", track), requests
    )
    return step_correlation([r.progress for r in results], [rec.progress[i] for rec, i in zip(records, kept)])


def _with_progress(results: list[RewardResult], requests: Sequence[RewardRequest]) -> list[RewardResult]:
    """An errored result without progress gets all-NaN progress (every frame unscored)."""
    return [
        replace(result, progress=np.full(request.num_frames, np.nan)) if result.progress is None else result
        for result, request in zip(results, requests)
    ]


def _nanmean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else float("nan")


def _is_expert(record: EpisodeRecord) -> bool:
    return record.policy == "expert" if record.policy is not None else record.success


def frame_pair_accuracy(predicted: Sequence[np.ndarray], labels: Sequence[np.ndarray], min_gap: float = 0.1) -> float:
    """Within each episode, how often two frames whose labels differ by ≥ min_gap are ordered right.

    Pairs with an unscored (NaN) frame are left out; NaN when no pair is left.
    """
    predicted_gaps, label_gaps = [], []
    for values, label in zip(predicted, labels):
        values = np.asarray(values, dtype=np.float64)
        earlier, later = np.triu_indices(len(label), k=1)
        label_gap = label[later] - label[earlier]
        keep = (np.abs(label_gap) >= min_gap) & ~np.isnan(values[later]) & ~np.isnan(values[earlier])
        predicted_gaps.append(values[later][keep] - values[earlier][keep])
        label_gaps.append(label_gap[keep])
    # P(later frame ahead) is 1, 0, or 0.5 for a predicted tie, which pairwise_accuracy gives half credit
    p_later_ahead = 0.5 + 0.5 * np.sign(np.concatenate(predicted_gaps))
    if len(p_later_ahead) == 0:
        return float("nan")
    return pairwise_accuracy(p_later_ahead, np.concatenate(label_gaps) > 0)
