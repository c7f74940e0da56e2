"""Progress labels for clips without geometric ground truth, and negatives built from expert clips.

Label curves map T frames to progress in [0, 1]. Clip transforms take an expert clip with its labels
and return new (frames, progress) of the same length T whose labels follow the frames: a frame keeps
the label it had in the source clip, wherever it lands. Two negatives need no function here:
a clip paired with another task's instruction is labelled `zero_progress(T)` at every frame
(the ReWiND convention), and `mismatched_instruction` picks that other instruction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def time_progress(num_frames: int) -> np.ndarray:
    """Progress growing linearly from 0 at the first frame to 1 at the last."""
    _check_length(num_frames, minimum=2)
    return np.linspace(0.0, 1.0, num_frames, dtype=np.float32)


def zero_progress(num_frames: int) -> np.ndarray:
    """All-zero progress: the label of a clip paired with an instruction it does not carry out."""
    _check_length(num_frames, minimum=1)
    return np.zeros(num_frames, dtype=np.float32)


def visual_change(frames: np.ndarray) -> np.ndarray:
    """(T,) mean absolute pixel change from the previous frame; 0 for the first frame."""
    steps = np.abs(np.diff(frames.astype(np.float32), axis=0)).mean(axis=tuple(range(1, frames.ndim)))
    return np.concatenate([[0.0], steps]).astype(np.float32)


def stage_budget_progress(
    stage_ends: Sequence[int],
    budgets: Sequence[float],
    num_frames: int,
    change: np.ndarray | None = None,
) -> np.ndarray:
    """Progress for a task split into subtasks, each owning a share (budget) of the total progress.

    Stage k runs from the end of stage k − 1 (frame 0 for the first stage) to frame `stage_ends[k]`,
    the last stage ending at the last frame. At its end progress reaches the sum of budgets up to k;
    budgets are normalised to sum to 1. Inside a stage progress rises linearly, or, given per-frame
    `change` weights (e.g. `visual_change(frames)`), in proportion to the change accumulated so far,
    so frames where nothing moves get no progress (as in ProcVLM). A stage without change stays linear.
    """
    _check_length(num_frames, minimum=2)
    ends = np.asarray(stage_ends, dtype=np.int64)
    shares = np.asarray(budgets, dtype=np.float64)
    if len(ends) == 0 or len(ends) != len(shares):
        raise ValueError(f"need one budget per stage, got {len(ends)} stage ends and {len(shares)} budgets")
    if ends[0] < 1 or np.any(np.diff(ends) < 1) or ends[-1] != num_frames - 1:
        raise ValueError(
            f"stage_ends must increase strictly from ≥ 1 to the last frame {num_frames - 1}, got {list(ends)}"
        )
    if np.any(shares < 0) or shares.sum() <= 0:
        raise ValueError(f"budgets must be ≥ 0 with a positive sum, got {list(shares)}")
    weights = np.ones(num_frames) if change is None else np.asarray(change, dtype=np.float64)
    if weights.shape != (num_frames,) or np.any(weights < 0):
        raise ValueError(f"change must be {num_frames} non-negative weights, got shape {weights.shape}")

    shares = shares / shares.sum()
    progress = np.zeros(num_frames)
    reached, start = 0.0, 0
    for end, share in zip(ends, shares):
        # weights[t] is the change from frame t - 1 to t, so a stage spends weights[start + 1 : end + 1]
        steps = weights[start + 1 : end + 1]
        if steps.sum() == 0:
            steps = np.ones_like(steps)
        progress[start + 1 : end + 1] = reached + share * np.cumsum(steps) / steps.sum()
        reached, start = reached + share, end
    return np.clip(progress, 0.0, 1.0).astype(np.float32)


def reversed_clip(frames: np.ndarray, progress: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The clip played backwards; an expert's rising progress becomes a falling one."""
    _check_clip(frames, progress)
    return frames[::-1].copy(), progress[::-1].copy()


def rewound_clip(frames: np.ndarray, progress: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """ReWiND's rewind: play forward to a random frame k, then backward for a random r steps.

    The clip is frames s..k then k − 1..k − r, with s = k + r + 1 − T (near the start) so that it
    keeps T frames. Rewinds last 1 to (T − 1) // 2 steps; an expert's labels rise, then fall.
    """
    _check_clip(frames, progress, minimum=3)
    num_frames = len(frames)
    rewind_steps = int(rng.integers(1, (num_frames - 1) // 2 + 1))
    turn = int(rng.integers(num_frames - 1 - rewind_steps, num_frames))
    start = turn + rewind_steps + 1 - num_frames
    indices = np.r_[start : turn + 1, turn - 1 : turn - 1 - rewind_steps : -1]
    return frames[indices], progress[indices]


def stalled_clip(frames: np.ndarray, progress: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Hold a random frame for 2 to T // 2 extra steps, then resample the clip back to T frames.

    The held frame keeps its label, so progress is flat over the stall (at least two frames long
    after resampling) and the clip still ends on the last frame.
    """
    _check_clip(frames, progress, minimum=4)
    num_frames = len(frames)
    held = int(rng.integers(num_frames - 1))
    hold_steps = int(rng.integers(2, num_frames // 2 + 1))
    stretched = np.r_[np.arange(held + 1), np.full(hold_steps, held), np.arange(held + 1, num_frames)]
    indices = stretched[np.round(np.linspace(0, len(stretched) - 1, num_frames)).astype(np.int64)]
    return frames[indices], progress[indices]


def mismatched_instruction(instruction: str, candidates: Sequence[str], rng: np.random.Generator) -> str:
    """A random candidate that differs from `instruction`, for a wrong-instruction negative."""
    others = sorted(set(candidates) - {instruction})
    if not others:
        raise ValueError(f"no candidate instruction differs from {instruction!r}")
    return others[int(rng.integers(len(others)))]


def _check_length(num_frames: int, minimum: int) -> None:
    if num_frames < minimum:
        raise ValueError(f"need at least {minimum} frames, got {num_frames}")


def _check_clip(frames: np.ndarray, progress: np.ndarray, minimum: int = 1) -> None:
    if len(frames) != len(progress):
        raise ValueError(f"{len(frames)} frames but {len(progress)} progress labels")
    _check_length(len(frames), minimum)
