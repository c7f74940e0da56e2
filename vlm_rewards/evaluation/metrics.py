"""Reward-model metrics: value-order correlation, pairwise accuracy, success AUC, progress error, stage accuracy;
and the seeded bootstrap interval the result reports share."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np
import scipy.stats
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score


def voc(values: np.ndarray) -> float:
    """Value-order correlation: Spearman's ρ between predicted per-frame values and frame order.

    1 for values that rise with time (an expert's progress), −1 for values that fall. As in OpenGVL,
    predictions that are constant, contain NaN or have fewer than two frames score 0.0: they say
    nothing about order, and a model must not gain from failing to answer.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError(f"voc expects a (T,) array of per-frame values, got shape {values.shape}")
    if len(values) < 2 or np.isnan(values).any() or np.all(values == values[0]):
        return 0.0
    return float(spearmanr(np.arange(len(values)), values).statistic)


def mean_voc(episodes: Sequence[np.ndarray]) -> float:
    """Mean VOC over episodes, each a (T,) array of predicted values."""
    if len(episodes) == 0:
        raise ValueError("mean_voc needs at least one episode")
    return float(np.mean([voc(values) for values in episodes]))


def pairwise_accuracy(p_first_better: np.ndarray, first_is_better: np.ndarray, tie: np.ndarray | None = None) -> float:
    """Fraction of pairs where the model prefers the better item.

    p_first_better: the model's P(first > second) per pair; exactly 0.5 is a predicted tie and earns
        half credit, so a model that always answers 0.5 scores 0.5, like a coin.
    first_is_better: the label per pair. tie: optional bool per pair; labelled ties have no right
        answer and are left out. Returns NaN (with a warning) when no pair is left.
    """
    p_first_better = np.asarray(p_first_better, dtype=np.float64)
    first_is_better = np.asarray(first_is_better, dtype=bool)
    keep = np.ones(len(first_is_better), bool) if tie is None else ~np.asarray(tie, dtype=bool)
    if not (p_first_better.shape == first_is_better.shape == keep.shape) or p_first_better.ndim != 1:
        raise ValueError(
            f"expected three (N,) arrays, got shapes {p_first_better.shape}, {first_is_better.shape}, {keep.shape}"
        )
    if np.isnan(p_first_better).any():
        raise ValueError("p_first_better contains NaN; drop or fill pairs the model could not judge")
    if not keep.any():
        warnings.warn("pairwise_accuracy: no untied pairs, returning NaN", stacklevel=2)
        return float("nan")
    predicted = np.sign(p_first_better[keep] - 0.5)  # 1: first, -1: second, 0: tie
    labelled = np.where(first_is_better[keep], 1.0, -1.0)
    credit = np.where(predicted == 0, 0.5, predicted == labelled)
    return float(credit.mean())


def success_auc(scores: np.ndarray, success: np.ndarray) -> float:
    """ROC AUC of per-episode scores (e.g. the final reward) for telling successes from failures.

    With only one class present AUC is undefined: returns NaN with a warning rather than raising,
    so evaluation over small or lopsided splits keeps going.
    """
    scores = np.asarray(scores, dtype=np.float64)
    success = np.asarray(success, dtype=bool)
    if scores.shape != success.shape or scores.ndim != 1:
        raise ValueError(f"expected two (N,) arrays, got shapes {scores.shape} and {success.shape}")
    if not np.isfinite(scores).all():
        raise ValueError("scores contain NaN or inf; drop episodes the model could not score")
    if success.all() or not success.any():
        warnings.warn(
            f"success_auc: all {len(success)} episodes are {'successes' if success.all() else 'failures'}; "
            "AUC is undefined, returning NaN",
            stacklevel=2,
        )
        return float("nan")
    return float(roc_auc_score(success, scores))


def stage_accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of frames whose predicted stage equals the label, over frames with a known label (≥ 0);
    NaN when none is known."""
    predicted, labels = np.asarray(predicted), np.asarray(labels)
    if predicted.shape != labels.shape or predicted.ndim != 1:
        raise ValueError(f"expected two (N,) arrays, got shapes {predicted.shape} and {labels.shape}")
    known = labels >= 0
    return float((predicted[known] == labels[known]).mean()) if known.any() else float("nan")


def progress_mae(predicted: np.ndarray, label: np.ndarray) -> float:
    """Mean absolute error between predicted and labelled progress over frames the model scored.

    NaN predictions (frames the model could not score) are left out; all-NaN gives NaN.
    """
    predicted = np.asarray(predicted, dtype=np.float64)
    label = np.asarray(label, dtype=np.float64)
    if predicted.shape != label.shape:
        raise ValueError(f"predicted has shape {predicted.shape}, label has shape {label.shape}")
    scored = ~np.isnan(predicted)
    if not scored.any():
        return float("nan")
    return float(np.abs(predicted[scored] - label[scored]).mean())


def step_correlation(predicted: Sequence[np.ndarray], labels: Sequence[np.ndarray]) -> float:
    """How well frame-to-frame changes of predicted progress follow the labelled ones, beyond frame position.

    Potential-based shaping pays γΦ(s') − Φ(s), about the change of predicted progress, every step. The
    changes at step t of every episode are taken relative to their mean over the episodes that have a
    step t, on both sides, then correlated (Pearson) over all steps. Without that, a reward that rises with
    frame position alone scores well, since true progress also rises early in most episodes; with it, such
    a reward scores 0. Steps with a NaN prediction are left out; NaN if the labels leave nothing to follow.
    """
    changes = [
        (np.diff(np.asarray(p, dtype=np.float64)), np.diff(np.asarray(label, dtype=np.float64)))
        for p, label in zip(predicted, labels, strict=True)
    ]
    predicted_residuals, label_residuals = [], []
    for step in range(max((len(p) for p, _ in changes), default=0)):
        at_step = np.array([(p[step], label[step]) for p, label in changes if len(p) > step and not np.isnan(p[step])])
        if len(at_step) > 1:
            predicted_residuals.append(at_step[:, 0] - at_step[:, 0].mean())
            label_residuals.append(at_step[:, 1] - at_step[:, 1].mean())
    no_spread = 1e-12  # residuals of changes that are alike at every step are zero up to rounding
    if not label_residuals or np.concatenate(label_residuals).std() < no_spread:
        return float("nan")
    predicted_steps, label_steps = np.concatenate(predicted_residuals), np.concatenate(label_residuals)
    if predicted_steps.std() < no_spread:
        return 0.0
    return float(np.corrcoef(predicted_steps, label_steps)[0, 1])


def bootstrap_ci(
    values: Sequence[float], statistic: Callable[..., np.ndarray], resamples: int, seed: int = 0
) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of `statistic` (called with an `axis`) over `values`, resampled with
    replacement from a seeded generator, so a report is reproducible."""
    values = np.asarray(values, dtype=float)
    if np.all(values == values[0]):  # every resample gives the same value (the bootstrap would warn)
        return float(values[0]), float(values[0])
    result = scipy.stats.bootstrap(
        (values,), statistic, vectorized=True, confidence_level=0.95, n_resamples=resamples,
        method="percentile", rng=np.random.default_rng(seed),
    )  # fmt: skip
    return float(result.confidence_interval.low), float(result.confidence_interval.high)
