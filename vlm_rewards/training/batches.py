"""Training batches drawn as a pure function of (seed, step, rank).

Resuming at step N therefore sees exactly the batches an uninterrupted run would have seen, with no
sampler state to save, and every data-parallel rank draws its own samples.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from vlm_rewards.data.episodes import EpisodeDataset, PairDataset
from vlm_rewards.data.labels import mismatched_instruction, reversed_clip, rewound_clip, stalled_clip
from vlm_rewards.interface import RewardRequest
from vlm_rewards.subsample import subsample_indices
from vlm_rewards.training.config import Augment


def step_rng(seed: int, step: int, rank: int) -> np.random.Generator:
    return np.random.default_rng([seed, step, rank])


@dataclass
class ProgressBatch:
    requests: list[RewardRequest]
    labels: torch.Tensor  # (B, T_max) progress labels, 0 past each clip's end
    success: torch.Tensor  # (B, T_max) per-frame success labels 1., 0., or −1 unknown (and past each clip's end)
    stage: torch.Tensor  # (B, T_max) long per-frame stage labels, −1 unknown (and past each clip's end)
    goal_offset: torch.Tensor  # (B, T_max, 2) per-frame goal offsets, NaN unknown (and past each clip's end)


@dataclass
class PreferenceBatch:
    chosen: list[RewardRequest]
    rejected: list[RewardRequest]
    margins: torch.Tensor  # (B,)
    ties: torch.Tensor  # (B,) bool


class ProgressBatches:
    """Episodes with synthetic negatives: mismatched instructions, reversed, rewound, stalled clips.

    max_frames: the model's frame budget. A longer episode is first subsampled with
    `subsample_indices` (evenly spaced, first and last frame in, labels at those frames), as the
    model is later asked about long episodes; augmentations then act on that clip, and a clip they
    lengthen past the budget is subsampled again.

    Per-frame success and stage labels (for the success and stage heads) follow their frames as progress
    labels do; a clip paired with another instruction is labelled not successful, its stage unknown.
    """

    def __init__(
        self,
        dataset: EpisodeDataset,
        batch_size: int,
        augment: Augment,
        seed: int,
        max_frames: int | None = None,
        clip_frames: int | None = None,
        clip_shuffle: bool = False,
    ):
        self.dataset, self.batch_size, self.augment, self.seed = dataset, batch_size, augment, seed
        self.max_frames, self.clip_frames, self.clip_shuffle = max_frames, clip_frames, clip_shuffle
        self.episode_ids = dataset.episode_ids
        self.instructions = dataset.instructions

    def batch(self, step: int, rank: int = 0) -> ProgressBatch:
        rng = step_rng(self.seed, step, rank)
        chosen = rng.choice(self.episode_ids, size=self.batch_size)
        samples = [self._sample(int(episode_id), rng) for episode_id in chosen]
        max_frames = max(len(labels) for _, labels, *_ in samples)
        labels = torch.zeros(len(samples), max_frames)
        success = torch.full((len(samples), max_frames), -1.0)
        stage = torch.full((len(samples), max_frames), -1, dtype=torch.long)
        goal_offset = torch.full((len(samples), max_frames, 2), float("nan"))
        for row, (_, sample_labels, sample_success, sample_stage, sample_offset) in enumerate(samples):
            labels[row, : len(sample_labels)] = torch.as_tensor(sample_labels)
            success[row, : len(sample_success)] = torch.as_tensor(sample_success)
            stage[row, : len(sample_stage)] = torch.as_tensor(sample_stage)
            goal_offset[row, : len(sample_offset)] = torch.as_tensor(sample_offset)
        return ProgressBatch([sample[0] for sample in samples], labels, success, stage, goal_offset)

    def _sample(self, episode_id: int, rng: np.random.Generator) -> tuple[RewardRequest, np.ndarray, ...]:
        """(request, progress, success, stage, goal offset labels) of one clip drawn from the episode."""
        record = self.dataset[episode_id]
        # The label functions only index along time, so running them on frame indices gives one
        # order to apply to the main frames and every extra view alike.
        base = subsample_indices(record.num_frames, self.max_frames)
        progress = record.progress[base]
        augment, draw = self.augment, rng.random()
        if draw < augment.mismatch:
            text = mismatched_instruction(record.instruction, self.instructions, rng)
            indices = self._cap(base, rng)
            request = shifted(replace(self.dataset.to_request(record, indices), text=text), augment.shift, rng)
            unknown_offset = np.full((len(indices), 2), np.nan)
            return (
                request,
                np.zeros(len(indices), np.float32),
                np.zeros(len(indices)),
                np.full(len(indices), -1),
                unknown_offset,
            )
        draw -= augment.mismatch
        if draw < augment.reverse:
            indices, labels = reversed_clip(base, progress)
        elif draw < augment.reverse + augment.rewind:
            indices, labels = rewound_clip(base, progress, rng)
        elif draw < augment.reverse + augment.rewind + augment.stall:
            indices, labels = stalled_clip(base, progress, rng)
        elif draw < augment.reverse + augment.rewind + augment.stall + augment.subsample:
            kept = np.sort(rng.choice(len(base), size=rng.integers(1, len(base) + 1), replace=False))
            indices, labels = base[kept], progress[kept]
        else:
            indices, labels = base, progress
        indices, labels = np.asarray(indices), np.asarray(labels, dtype=np.float32)
        if self.max_frames is not None and len(indices) > self.max_frames:
            keep = subsample_indices(len(indices), self.max_frames)
            indices, labels = indices[keep], labels[keep]
        keep = self._cap(np.arange(len(indices)), rng)
        frames = indices[keep]
        success = np.full(len(frames), -1.0) if record.frame_success is None else record.frame_success[frames] * 1.0
        stage = np.full(len(frames), -1) if record.stage is None else record.stage[frames]
        offset = np.full((len(frames), 2), np.nan) if record.goal_offset is None else record.goal_offset[frames]
        request = shifted(self.dataset.to_request(record, frames), self.augment.shift, rng)
        return request, labels[keep], success, stage, offset

    def _cap(self, positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """`positions` cut to `clip_frames`: the first, then a random subset of the rest, in order or
        (`clip_shuffle`) shuffled."""
        size = len(positions) if self.clip_frames is None else min(len(positions), self.clip_frames)
        if len(positions) <= size and not (self.clip_shuffle and size > 2):
            return positions
        rest = rng.choice(np.arange(1, len(positions)), size=size - 1, replace=False)
        return positions[np.concatenate([[0], rest if self.clip_shuffle else np.sort(rest)])]


def shifted(request: RewardRequest, max_shift: int, rng: np.random.Generator) -> RewardRequest:
    """The clip's frames and views moved by one random offset in −max_shift..max_shift pixels per axis, edges
    repeated (as returned when max_shift is 0)."""
    if not max_shift:
        return request
    dy, dx = rng.integers(-max_shift, max_shift + 1, size=2)
    return request.shifted(int(dy), int(dx))


class PreferenceBatches:
    def __init__(self, dataset: PairDataset, batch_size: int, seed: int):
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed

    def batch(self, step: int, rank: int = 0) -> PreferenceBatch:
        rng = step_rng(self.seed, step, rank)
        pairs = [self.dataset[int(i)] for i in rng.choice(self.dataset.pair_ids, size=self.batch_size)]
        chosen, rejected = zip(*(self.dataset.to_requests(pair) for pair in pairs))
        return PreferenceBatch(
            list(chosen),
            list(rejected),
            torch.tensor([pair.margin for pair in pairs], dtype=torch.float32),
            torch.tensor([pair.tie for pair in pairs], dtype=torch.bool),
        )
