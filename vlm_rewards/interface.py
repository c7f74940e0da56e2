"""The one reward interface.

Every reward model (local VLM, rule-based, CLIP-like, remote client, composite) is a `RewardModel`;
every consumer (RL wrapper, GRPO trainer, annotator, server) takes a `RewardModel`. A request holds
one sample: a clip of frames (T=1 for a single image), the instruction or prompt, optional
reference/goal frames and extra camera views, and an optional key for bookkeeping. A result holds
the scalar reward, optional per-frame progress and an `aux` dict of whatever else the model knows.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

OutputKind = Literal["progress", "preference", "scalar"]


@dataclass(frozen=True)
class SampleKey:
    """Where a sample comes from, so batch jobs can key outputs and redo only what is missing."""

    source: str
    episode: int | str
    frame: int = 0


@dataclass(frozen=True)
class RewardRequest:
    """One sample to score.

    frames: (T, H, W, 3) uint8 clip, oldest frame first; a single image is T=1.
    text: the task instruction (progress models) or the generation prompt (preference models).
    reference: optional (R, H, W, 3) uint8 reference or goal frames.
    views: optional extra cameras, name -> (T, H, W, 3) uint8, same T as `frames`.
    key: optional (source, episode, frame) for idempotent bookkeeping.
    """

    frames: np.ndarray
    text: str
    reference: np.ndarray | None = None
    views: Mapping[str, np.ndarray] = field(default_factory=dict)
    key: SampleKey | None = None

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])


@dataclass
class RewardResult:
    """What a model says about one sample.

    reward: the scalar reward. NaN only when the model could not produce a value, and then
        `aux["error"]` says why (e.g. a judge whose answer could not be parsed).
    progress: optional (T,) per-frame progress; NaN marks a frame the model could not score.
    aux: anything else (per-objective scores, P(yes), logits, raw answers).
    """

    reward: float
    progress: np.ndarray | None = None
    aux: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardSpec:
    """What a consumer needs to know before calling a model.

    version: a fingerprint of weights + preprocessing; outputs with different versions never mix.
    frame_size: (min_side, max_side) in pixels the model accepts, or None for any size.
    max_frames: the longest clip the model accepts, or None for no limit.
    """

    name: str
    version: str
    output: OutputKind
    value_range: tuple[float, float]
    frame_size: tuple[int, int] | None = None
    max_frames: int | None = None


@runtime_checkable
class RewardModel(Protocol):
    spec: RewardSpec

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]: ...

    def prefer(self, a: Sequence[RewardRequest], b: Sequence[RewardRequest]) -> np.ndarray: ...


class BaseReward(ABC):
    """Validates inputs and outputs around `_score`; subclasses implement only `_score`.

    `prefer` defaults to the Bradley–Terry reading of the scalar reward, P(a > b) = σ(r_a − r_b);
    models with a native pairwise judgement override `_prefer`.
    """

    spec: RewardSpec

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        validate_requests(requests, self.spec)
        results = self._score(list(requests))
        validate_results(results, len(requests), self.spec.name)
        return results

    def prefer(self, a: Sequence[RewardRequest], b: Sequence[RewardRequest]) -> np.ndarray:
        if len(a) != len(b):
            raise ValueError(f"prefer(a, b): a has {len(a)} requests and b has {len(b)}; expected equal lengths")
        validate_requests(a, self.spec, name="a")
        validate_requests(b, self.spec, name="b")
        return np.asarray(self._prefer(list(a), list(b)), dtype=np.float64)

    @abstractmethod
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]: ...

    def _prefer(self, a: list[RewardRequest], b: list[RewardRequest]) -> np.ndarray:
        rewards = np.array([r.reward for r in self._score(a + b)], dtype=np.float64)
        return 1.0 / (1.0 + np.exp(rewards[len(a) :] - rewards[: len(a)]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name!r}, version={self.spec.version!r})"


def validate_clip(array: Any, name: str, spec: RewardSpec | None = None) -> None:
    """Check one (T, H, W, 3) uint8 clip and raise a ValueError naming `name` if it is not one."""
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{name}: expected a numpy array of shape (T, H, W, 3), got {type(array).__name__}")
    if array.dtype != np.uint8:
        raise ValueError(f"{name}: expected dtype uint8 (0..255 RGB), got {array.dtype}")
    if array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"{name}: expected shape (T, H, W, 3), got {array.shape} (rank {array.ndim})")
    if array.shape[0] == 0:
        raise ValueError(f"{name}: empty clip, expected at least one frame")
    if array.shape[1] == 0 or array.shape[2] == 0:
        raise ValueError(f"{name}: frames of size {array.shape[1]}x{array.shape[2]}, expected non-empty frames")
    if spec is None:
        return
    if spec.frame_size is not None:
        low, high = spec.frame_size
        if min(array.shape[1:3]) < low or max(array.shape[1:3]) > high:
            raise ValueError(
                f"{name}: frames of size {array.shape[1]}x{array.shape[2]}; {spec.name} expects sides "
                f"between {low} and {high} pixels"
            )


def validate_requests(requests: Sequence[RewardRequest], spec: RewardSpec, name: str = "requests") -> None:
    if isinstance(requests, RewardRequest) or not isinstance(requests, Sequence):
        raise ValueError(f"{name}: expected a sequence of RewardRequest, got {type(requests).__name__}")
    if len(requests) == 0:
        raise ValueError(f"{name}: empty batch, expected at least one RewardRequest")
    for i, request in enumerate(requests):
        where = f"{name}[{i}]"
        if not isinstance(request, RewardRequest):
            raise ValueError(f"{where}: expected a RewardRequest, got {type(request).__name__}")
        validate_clip(request.frames, f"{where}.frames", spec)
        if spec.max_frames is not None and request.num_frames > spec.max_frames:
            raise ValueError(
                f"{where}.frames: clip of {request.num_frames} frames; {spec.name} takes at most {spec.max_frames}"
            )
        if not isinstance(request.text, str) or not request.text.strip():
            raise ValueError(f"{where}.text: expected a non-empty instruction or prompt, got {request.text!r}")
        if request.reference is not None:
            validate_clip(request.reference, f"{where}.reference", spec)
        for view_name, view in request.views.items():
            validate_clip(view, f"{where}.views[{view_name!r}]", spec)
            if view.shape[0] != request.num_frames:
                raise ValueError(
                    f"{where}.views[{view_name!r}]: {view.shape[0]} frames, expected {request.num_frames} "
                    "(the same T as frames)"
                )


def validate_results(results: Sequence[RewardResult], expected: int, model_name: str) -> None:
    if len(results) != expected:
        raise ValueError(f"{model_name} returned {len(results)} results for {expected} requests")
    for i, result in enumerate(results):
        if not math.isfinite(result.reward) and "error" not in result.aux:
            raise ValueError(
                f"{model_name}: result[{i}].reward is {result.reward}; a non-finite reward needs aux['error']"
            )
