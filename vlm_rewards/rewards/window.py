"""Any dense reward made history-free: each frame is scored in a short clip of its own.

A progress RM that streams a whole episode reads frame t with frames 0..t-1 in its context, so its
value is a function of the history, not of the state the frame shows. An RL critic sees only the
state; a potential that differs between two paths to the same state looks like noise to it.
`FrameWindowReward` scores frame t as the clip

    [frame 0] + frames[t − window + 1 .. t]        (frame 0 only with `keep_first`)

and returns the wrapped reward's progress at the clip's last frame. Frame 0 shows the episode's
layout (where the objects and targets started), which an RL state holds too. The result is causal
by construction, and a session does O(window) model work per frame, however long the episode.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pydantic

from vlm_rewards.config import Settings
from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import (
    BaseReward,
    RewardModel,
    RewardRequest,
    RewardResult,
    RewardSession,
    append_views,
    check_stream_continues,
    example_texts_of,
    stream_references,
    validate_clip,
)
from vlm_rewards.registry import build_reward, current_config_folder, register


@register("frame_window")
class FrameWindowReward(BaseReward):
    class Params(Settings):
        reward: str | dict[str, Any]
        """A dense reward: shipped name, YAML path (relative to this YAML) or inline config."""
        window: int = pydantic.Field(1, ge=1)
        """Frames up to and including the scored one."""
        keep_first: bool = True
        """Put the episode's first frame before the window."""
        name: str | None = None
        """The reward's name in results, logs and reports; None: <wrapped name>_window<N>[_first]."""

    def __init__(self, reward: RewardModel, window: int = 1, keep_first: bool = True, name: str | None = None):
        if not reward.spec.dense:
            raise ValueError(f"frame_window: reward {reward.spec.name!r} is not dense; expected per-frame progress")
        if window < 1:
            raise ValueError(f"frame_window: window {window}; expected at least 1 frame")
        longest = window + int(keep_first)
        if reward.spec.max_frames is not None and reward.spec.max_frames < longest:
            raise ValueError(
                f"frame_window: clips of {longest} frames, {reward.spec.name!r} takes at most {reward.spec.max_frames}"
            )
        self.reward, self.window, self.keep_first = reward, window, keep_first
        self.spec = replace(
            reward.spec,
            name=name or f"{reward.spec.name}_window{window}{'_first' if keep_first else ''}",
            version=fingerprint(reward.spec.version, window, keep_first),
            causal=True,
            max_frames=None,
        )

    @classmethod
    def from_params(cls, params: Params) -> FrameWindowReward:
        inner = build_reward(params.reward, relative_to=current_config_folder())
        return cls(inner, window=params.window, keep_first=params.keep_first, name=params.name)

    def example_texts(self) -> tuple[str, ...]:
        """The wrapped reward's."""
        return example_texts_of(self.reward)

    def window_indices(self, t: int) -> list[int]:
        """The frames of the clip that scores frame t."""
        recent = list(range(max(0, t - self.window + 1), t + 1))
        return [0, *recent] if self.keep_first and recent[0] > 0 else recent

    def open_session(
        self, texts: Sequence[str], references: Sequence[np.ndarray | None] | None = None
    ) -> RewardSession:
        return FrameWindowSession(self, texts, references)

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        clips = [request.take(self.window_indices(t)) for request in requests for t in range(request.num_frames)]
        results = iter(self.reward.score(clips))
        return [_per_frame([next(results) for _ in range(request.num_frames)]) for request in requests]


class FrameWindowSession(RewardSession):
    """Per stream: its first frame and the last `window` frames; one batched `score` per append."""

    def __init__(self, owner: FrameWindowReward, texts: Sequence[str], references: Sequence[np.ndarray | None] | None):
        self.owner = owner
        self._streams = [
            _WindowStream(text, reference, owner.window)
            for text, reference in zip(texts, stream_references(texts, references), strict=True)
        ]

    @property
    def num_frames(self) -> list[int]:
        return [stream.count for stream in self._streams]

    def reset(self, index: int, text: str, reference: np.ndarray | None = None) -> None:
        self._streams[index] = _WindowStream(text, reference, self.owner.window)

    def append(
        self, frames: Sequence[np.ndarray], views: Sequence[Mapping[str, np.ndarray]] | None = None
    ) -> list[np.ndarray]:
        views = append_views(frames, views, len(self._streams))
        for i, (stream, new, new_views) in enumerate(zip(self._streams, frames, views)):  # before any stream moves on
            validate_clip(new, f"frames[{i}]", self.owner.spec)
            if stream.first is not None:
                check_stream_continues(new, new_views, stream.first[0].shape, stream.first[1], f"frames[{i}]")
        clips, counts = [], []
        for stream, new, new_views in zip(self._streams, frames, views):
            counts.append(len(new))
            for t in range(len(new)):
                clips.append(stream.push(new[t], {name: view[t] for name, view in new_views.items()}, self.owner))
        results = iter(self.owner.reward.score(clips))
        return [np.array([next(results).progress[-1] for _ in range(count)], dtype=np.float64) for count in counts]


class _WindowStream:
    def __init__(self, text: str, reference: np.ndarray | None, window: int):
        self.text, self.reference, self.count = text, reference, 0
        self.first: tuple[np.ndarray, dict[str, np.ndarray]] | None = None
        self.recent: deque[tuple[np.ndarray, dict[str, np.ndarray]]] = deque(maxlen=window)

    def push(self, frame: np.ndarray, views: dict[str, np.ndarray], owner: FrameWindowReward) -> RewardRequest:
        """Take the next frame; the clip that scores it."""
        if self.first is None:
            self.first = (frame, views)
        self.recent.append((frame, views))
        kept = list(self.recent)
        if len(owner.window_indices(self.count)) > len(kept):  # frame 0 leads, out of the window by now
            kept.insert(0, self.first)
        self.count += 1
        return RewardRequest(
            frames=np.stack([frame for frame, _ in kept]),
            text=self.text,
            reference=self.reference,
            views={name: np.stack([frame_views[name] for _, frame_views in kept]) for name in views},
        )


def _per_frame(window_results: list[RewardResult]) -> RewardResult:
    """One request's result from the results of its frames' clips (each read at its last frame); the
    reward and a composite's components are the last frame's, as its progress is."""
    progress = np.array([result.progress[-1] for result in window_results], dtype=np.float64)
    errors = sorted({result.error for result in window_results if result.error})
    last = window_results[-1]
    return RewardResult(float(progress[-1]), progress, last.components, error="; ".join(errors) or None)
