"""The one reward interface.

Every reward (local VLM, rule-based, embedding, remote client, composite) is a `RewardModel`; every
consumer (RL wrapper, GRPO trainer, annotator, server) takes a `RewardModel`.

- `RewardRequest`: one sample — a clip of frames (T=1 for an image), the instruction or prompt,
  optional reference/goal frames, extra camera views, a bookkeeping key and, for a subsampled clip,
  the source frame index of each frame.
- `RewardResult`: the scalar `reward`, per-frame `progress` for dense rewards, named `components`,
  JSON-safe `info`, and an `error` that must accompany any NaN.
- `RewardSpec`: what a consumer may rely on before calling — value range, capability flags (dense,
  causal, batch-invariant, deterministic), required inputs, component names, input limits.
- `RewardSession`: streams of frames scored as they arrive (RL); for causal rewards its values equal
  scoring the whole prefix.

Rewards are pure functions of their requests under a fixed `spec.version`; normalisation belongs to
the consumer (`vlm_rewards.normalization`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

logger = logging.getLogger(__name__)
REFERENCE = "reference"  # a `requires` entry: the request must carry reference/goal frames
VIEW_PREFIX = "view:"  # a `requires` entry "view:<name>": the request must carry that camera view
EXAMPLE_TEXTS = ("move the red circle to the top left", "push the blue square to the center")


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
    text: the task instruction (progress rewards) or the generation prompt (preference rewards).
    reference: optional (R, H, W, 3) uint8 reference or goal frames.
    views: optional extra cameras, name -> (T, H, W, 3) uint8, same T as `frames`.
    key: optional (source, episode, frame) for idempotent bookkeeping.
    frame_index: optional (T,) strictly increasing indices of these frames in their source episode,
        for a subsampled clip (see `vlm_rewards.subsample`); None means frames 0..T-1.
    """

    frames: np.ndarray
    text: str
    reference: np.ndarray | None = None
    views: Mapping[str, np.ndarray] = field(default_factory=dict)
    key: SampleKey | None = None
    frame_index: np.ndarray | None = None

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    def prefix(self, length: int) -> RewardRequest:
        """The request for the first `length` frames (views and frame_index cut alike)."""
        return replace(
            self,
            frames=self.frames[:length],
            views={name: view[:length] for name, view in self.views.items()},
            frame_index=None if self.frame_index is None else self.frame_index[:length],
        )

    def shifted(self, dy: int, dx: int) -> RewardRequest:
        """The request with every frame and view moved by dy rows and dx columns (positive: down, right), edges
        repeated into the gap; the reference stays as it is."""
        return replace(
            self,
            frames=_shift_clip(self.frames, dy, dx),
            views={n: _shift_clip(v, dy, dx) for n, v in self.views.items()},
        )

    def take(self, indices: Sequence[int] | np.ndarray) -> RewardRequest:
        """The request for the frames at `indices` (increasing; views alike), with `frame_index` saying
        which frames of the source episode they are."""
        indices = np.asarray(indices)
        source = np.arange(self.num_frames) if self.frame_index is None else np.asarray(self.frame_index)
        return replace(
            self,
            frames=self.frames[indices],
            views={name: view[indices] for name, view in self.views.items()},
            frame_index=source[indices],
        )


def _shift_clip(clip: np.ndarray, dy: int, dx: int) -> np.ndarray:
    pad = max(abs(dy), abs(dx))
    padded = np.pad(clip, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge")
    return padded[:, pad - dy : pad - dy + clip.shape[1], pad - dx : pad - dx + clip.shape[2]]


@dataclass(frozen=True)
class RewardResult:
    """What a reward says about one sample.

    reward: the scalar reward.
    progress: (T,) per-frame progress for dense rewards, None otherwise.
    components: per-part values of a composite, by name, in the order `spec.components` lists them.
    info: JSON-safe extras (a judge's answer, logits, P(yes)); never read by consumers' math.
    error: why something is NaN. NaN anywhere (reward, progress, components) requires an error; a
        result with an error may still carry finite values (e.g. a judge that parsed some frames).
    """

    reward: float
    progress: np.ndarray | None = None
    components: Mapping[str, float] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict; NaN becomes null."""
        return {
            "reward": _finite_or_none(self.reward),
            "progress": None if self.progress is None else [_finite_or_none(v) for v in self.progress],
            "components": {name: _finite_or_none(value) for name, value in self.components.items()},
            "info": json_safe(self.info),
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RewardResult:
        progress = data.get("progress")
        return cls(
            reward=_none_to_nan(data["reward"]),
            progress=None if progress is None else np.array([_none_to_nan(v) for v in progress], dtype=np.float64),
            components={name: _none_to_nan(value) for name, value in (data.get("components") or {}).items()},
            info=dict(data.get("info") or {}),
            error=data.get("error"),
        )


@dataclass(frozen=True)
class RewardSpec:
    """What a consumer needs to know before calling a reward.

    version: a fingerprint of everything that changes outputs (weights, preprocessing, config);
        outputs with different versions never mix.
    value_range: bounds of the reward and of every progress value.
    dense: results carry per-frame `progress`.
    causal: progress[t] depends only on frames <= t, the text and the reference, so scoring a
        growing clip frame by frame (a `RewardSession`) equals scoring the whole prefix.
    batch_invariant: a result depends neither on its batch-mates nor on earlier calls.
    deterministic: the same request always gets the same result.
    requires: inputs the reward cannot work without: "reference", "view:<name>".
    components: the names in `RewardResult.components`, in order (composites).
    frame_size: (min_side, max_side) in pixels the reward accepts, or None for any size.
    max_frames: the longest clip the reward accepts, or None for no limit.
    max_text_length: the longest text in characters, or None for no limit.
    """

    name: str
    version: str
    value_range: tuple[float, float] = (-math.inf, math.inf)
    dense: bool = False
    causal: bool = False
    batch_invariant: bool = True
    deterministic: bool = True
    requires: tuple[str, ...] = ()
    components: tuple[str, ...] = ()
    frame_size: tuple[int, int] | None = None
    max_frames: int | None = None
    max_text_length: int | None = None

    def __post_init__(self) -> None:
        low, high = self.value_range
        if not low <= high:
            raise ValueError(f"spec {self.name!r}: value_range {self.value_range} must have low <= high")
        for requirement in self.requires:
            if requirement != REFERENCE and not requirement.startswith(VIEW_PREFIX):
                raise ValueError(
                    f"spec {self.name!r}: requires entry {requirement!r}; expected 'reference' or 'view:<name>'"
                )
        if self.causal and not self.dense:
            raise ValueError(f"spec {self.name!r}: causal=True needs dense=True (causality is about progress)")

    def to_json(self) -> dict[str, Any]:
        data = {item.name: getattr(self, item.name) for item in fields(self)}
        return json_safe(data | {"value_range": [_float_to_json(v) for v in self.value_range]})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RewardSpec:
        data = dict(data)
        data["value_range"] = tuple(_float_from_json(v) for v in data["value_range"])
        for name in ("requires", "components"):
            data[name] = tuple(data.get(name) or ())
        for name in ("frame_size",):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        return cls(**data)


class RewardSession(ABC):
    """B streams of frames (one per env), each a clip growing as frames arrive.

    `append` scores the new frames of every stream in one call; for a causal reward the values equal
    what `score` gives for the same frames as part of the whole prefix.
    """

    last_components: list[dict[str, float]] | None = None
    """After `append`: per stream the `RewardResult.components` of the stream's clip so far (its last new
    frame), for sessions that report them; None for sessions that do not."""

    @abstractmethod
    def append(
        self, frames: Sequence[np.ndarray], views: Sequence[Mapping[str, np.ndarray]] | None = None
    ) -> list[np.ndarray]:
        """frames[i]: (k_i >= 1, H, W, 3) uint8 new frames of stream i (views alike); returns per stream
        the (k_i,) progress (dense rewards) or reward after each new frame."""

    @abstractmethod
    def reset(self, index: int, text: str, reference: np.ndarray | None = None) -> None:
        """Start stream `index` afresh (its env began a new episode)."""

    @property
    @abstractmethod
    def num_frames(self) -> list[int]:
        """Frames appended so far, per stream."""

    def close(self) -> None:  # noqa: B027 - an optional hook: most sessions hold nothing to release
        """Release what the session holds (caches); the default holds nothing that needs it."""

    def __enter__(self) -> RewardSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@runtime_checkable
class RewardModel(Protocol):
    spec: RewardSpec

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]: ...

    async def ascore(self, requests: Sequence[RewardRequest]) -> list[RewardResult]: ...

    def prefer(self, a: Sequence[RewardRequest], b: Sequence[RewardRequest]) -> np.ndarray: ...

    def open_session(
        self, texts: Sequence[str], references: Sequence[np.ndarray | None] | None = None
    ) -> RewardSession: ...


class BaseReward(ABC):
    """Validates requests and results around `_score`; subclasses implement `_score` and set `spec`.

    `prefer` defaults to the Bradley–Terry reading of the scalar reward, P(a > b) = σ(r_a − r_b);
    rewards with a native pairwise judgement override `_prefer`. `ascore` runs `score` in a worker
    thread; `open_session` rescores each stream's prefix (rewards with a cache override it).
    `example_texts` gives instructions the reward accepts, for example requests (a server's warm-up,
    `check_reward`); rewards that refuse some texts override it.
    """

    spec: RewardSpec

    def score(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        validate_requests(requests, self.spec)
        results = self._score(list(requests))
        validate_results(results, requests, self.spec)
        return results

    async def ascore(self, requests: Sequence[RewardRequest]) -> list[RewardResult]:
        return await asyncio.to_thread(self.score, requests)

    def prefer(self, a: Sequence[RewardRequest], b: Sequence[RewardRequest]) -> np.ndarray:
        if len(a) != len(b):
            raise ValueError(f"prefer(a, b): a has {len(a)} requests and b has {len(b)}; expected equal lengths")
        validate_requests(a, self.spec, name="a")
        validate_requests(b, self.spec, name="b")
        return np.asarray(self._prefer(list(a), list(b)), dtype=np.float64)

    def open_session(
        self, texts: Sequence[str], references: Sequence[np.ndarray | None] | None = None
    ) -> RewardSession:
        return RescoringSession(self, texts, references)

    def example_texts(self) -> tuple[str, ...]:
        """Instructions this reward accepts (any text here: generic instructions)."""
        return EXAMPLE_TEXTS

    @abstractmethod
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]: ...

    def _prefer(self, a: list[RewardRequest], b: list[RewardRequest]) -> np.ndarray:
        rewards = np.array([r.reward for r in self._score(a + b)], dtype=np.float64)
        return 1.0 / (1.0 + np.exp(rewards[len(a) :] - rewards[: len(a)]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name!r}, version={self.spec.version!r})"


class RescoringSession(RewardSession):
    """A session for any reward: each append scores the grown prefixes in one `score` call.

    Dense rewards: one request per stream (the whole prefix), the last k progress values returned.
    Others: one request per new frame (the prefix ending there), its reward returned. Cost grows with
    the prefix (O(T) per step); rewards that can cache override `open_session`.
    """

    def __init__(
        self, reward: RewardModel, texts: Sequence[str], references: Sequence[np.ndarray | None] | None = None
    ):
        references = stream_references(texts, references)
        self.reward = reward
        self._streams = [_Stream(text, reference) for text, reference in zip(texts, references)]

    @property
    def num_frames(self) -> list[int]:
        return [stream.num_frames for stream in self._streams]

    def reset(self, index: int, text: str, reference: np.ndarray | None = None) -> None:
        self._streams[index] = _Stream(text, reference)

    def append(
        self, frames: Sequence[np.ndarray], views: Sequence[Mapping[str, np.ndarray]] | None = None
    ) -> list[np.ndarray]:
        views = append_views(frames, views, len(self._streams))
        for i, (stream, new, new_views) in enumerate(zip(self._streams, frames, views)):
            stream.extend(new, new_views, f"frames[{i}]")
        requests, owners = [], []
        for i, (stream, new) in enumerate(zip(self._streams, frames)):
            whole = stream.request()
            if self.reward.spec.dense:
                requests.append(whole)
                owners.append((i, len(new)))
            else:
                first = whole.num_frames - len(new) + 1
                requests.extend(whole.prefix(length) for length in range(first, whole.num_frames + 1))
                owners.extend((i, 1) for _ in range(len(new)))
        results = self.reward.score(requests)
        values: list[list[float]] = [[] for _ in self._streams]
        self.last_components = [{} for _ in self._streams]
        for (stream_index, count), result in zip(owners, results):
            self.last_components[stream_index] = dict(result.components)  # the stream's last request's
            if self.reward.spec.dense:
                values[stream_index].extend(result.progress[-count:])
            else:
                values[stream_index].append(result.reward)
        return [np.asarray(v, dtype=np.float64) for v in values]


def example_texts_of(reward: RewardModel) -> tuple[str, ...]:
    """Instructions `reward` accepts: its `example_texts()`, or generic ones for a reward without that method."""
    return reward.example_texts() if isinstance(reward, BaseReward) else EXAMPLE_TEXTS


def append_views(
    frames: Sequence[np.ndarray], views: Sequence[Mapping[str, np.ndarray]] | None, num_streams: int
) -> list[Mapping[str, np.ndarray]]:
    """`append`'s arguments checked: one frame array and one view dict (none given: empty) per stream."""
    views = [{}] * len(frames) if views is None else list(views)
    if not len(frames) == len(views) == num_streams:
        raise ValueError(f"append: {len(frames)} frame arrays and {len(views)} view dicts for {num_streams} streams")
    return views


def check_stream_continues(
    frames: np.ndarray, views: Mapping[str, Any], frame_shape: tuple[int, ...], view_names: Iterable[str], where: str
) -> None:
    """New frames of a stream have the frame shape and the view names the stream began with."""
    if frames.shape[1:] != frame_shape:
        raise ValueError(f"{where}: frames of shape {frames.shape[1:]}, the stream began with {frame_shape}")
    if set(views) != set(view_names):
        raise ValueError(f"{where}: views {sorted(views)}, the stream began with {sorted(view_names)}")


def stream_references(texts: Sequence[str], references: Sequence[np.ndarray | None] | None) -> list[np.ndarray | None]:
    """`open_session`'s arguments checked: one reference per text (None for all when not given)."""
    if isinstance(texts, str) or len(texts) == 0:
        raise ValueError("open_session: texts: expected a non-empty sequence of instructions, one per stream")
    references = [None] * len(texts) if references is None else list(references)
    if len(references) != len(texts):
        raise ValueError(f"open_session: {len(texts)} texts but {len(references)} references")
    return references


class _Stream:
    def __init__(self, text: str, reference: np.ndarray | None):
        self.text, self.reference = text, reference
        self.frames: list[np.ndarray] = []
        self.views: dict[str, list[np.ndarray]] = {}

    @property
    def num_frames(self) -> int:
        return sum(len(chunk) for chunk in self.frames)

    def extend(self, frames: np.ndarray, views: Mapping[str, np.ndarray], where: str) -> None:
        validate_clip(frames, where)
        if self.frames:
            check_stream_continues(frames, views, self.frames[0].shape[1:], self.views, where)
        self.frames.append(frames)
        for name, view in views.items():
            self.views.setdefault(name, []).append(view)

    def request(self) -> RewardRequest:
        return RewardRequest(
            frames=np.concatenate(self.frames),
            text=self.text,
            reference=self.reference,
            views={name: np.concatenate(chunks) for name, chunks in self.views.items()},
        )


def score_each(
    reward: RewardModel, requests: Sequence[RewardRequest], errors: tuple[type[Exception], ...] = (ValueError,)
) -> list[RewardResult | Exception]:
    """`reward.score(requests)` for batch jobs: if the batch raises one of `errors`, each request is scored
    alone, so one bad request does not sink its batch-mates. Per request, its result or the error it raised."""
    try:
        return list(reward.score(requests))
    except errors as error:
        if len(requests) == 1:
            return [error]
        logger.warning("a batch of %d requests raised (%s); scoring them one by one", len(requests), error)
    outcomes: list[RewardResult | Exception] = []
    for request in requests:
        try:
            outcomes.extend(reward.score([request]))
        except errors as error:
            outcomes.append(error)
    return outcomes


# ----------------------------------------------------------------------------- validation


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
    if spec is None or spec.frame_size is None:
        return
    low, high = spec.frame_size
    if min(array.shape[1:3]) < low or max(array.shape[1:3]) > high:
        raise ValueError(
            f"{name}: frames of size {array.shape[1]}x{array.shape[2]}; {spec.name} expects sides "
            f"between {low} and {high} pixels"
        )


def validate_requests(requests: Sequence[RewardRequest], spec: RewardSpec, name: str = "requests") -> None:
    """Check a batch against `spec`; a ValueError names the first bad field, e.g. `requests[3].text`."""
    if isinstance(requests, RewardRequest) or not isinstance(requests, Sequence):
        raise ValueError(f"{name}: expected a sequence of RewardRequest, got {type(requests).__name__}")
    if len(requests) == 0:
        raise ValueError(f"{name}: empty batch, expected at least one RewardRequest")
    for i, request in enumerate(requests):
        validate_request(request, spec, f"{name}[{i}]")


def validate_request(request: RewardRequest, spec: RewardSpec, where: str) -> None:
    if not isinstance(request, RewardRequest):
        raise ValueError(f"{where}: expected a RewardRequest, got {type(request).__name__}")
    validate_clip(request.frames, f"{where}.frames", spec)
    if spec.max_frames is not None and request.num_frames > spec.max_frames:
        raise ValueError(
            f"{where}.frames: clip of {request.num_frames} frames; {spec.name} takes at most {spec.max_frames} "
            "(subsample long episodes with vlm_rewards.subsample)"
        )
    if not isinstance(request.text, str) or not request.text.strip():
        raise ValueError(f"{where}.text: expected a non-empty instruction or prompt, got {request.text!r}")
    if spec.max_text_length is not None and len(request.text) > spec.max_text_length:
        raise ValueError(
            f"{where}.text: {len(request.text)} characters; {spec.name} takes at most {spec.max_text_length}"
        )
    if request.reference is not None:
        validate_clip(request.reference, f"{where}.reference", spec)
    elif REFERENCE in spec.requires:
        raise ValueError(f"{where}.reference: {spec.name} needs reference/goal frames, got None")
    if not isinstance(request.views, Mapping):
        raise ValueError(
            f"{where}.views: expected a mapping of view name -> frames, got {type(request.views).__name__}"
        )
    for view_name, view in request.views.items():
        validate_clip(view, f"{where}.views[{view_name!r}]", spec)
        if view.shape[0] != request.num_frames:
            raise ValueError(
                f"{where}.views[{view_name!r}]: {view.shape[0]} frames, expected {request.num_frames} "
                "(the same T as frames)"
            )
    for requirement in spec.requires:
        view_name = requirement.removeprefix(VIEW_PREFIX)
        if requirement.startswith(VIEW_PREFIX) and view_name not in request.views:
            raise ValueError(
                f"{where}.views: {spec.name} needs the camera view {view_name!r}, got {sorted(request.views)}"
            )
    if request.frame_index is not None:
        index = np.asarray(request.frame_index)
        if (
            index.shape != (request.num_frames,)
            or not np.issubdtype(index.dtype, np.integer)
            or index.min() < 0
            or np.any(np.diff(index) <= 0)
        ):
            raise ValueError(
                f"{where}.frame_index: expected {request.num_frames} strictly increasing non-negative integers "
                f"(one per frame), got {request.frame_index!r}"
            )


def validate_results(results: Sequence[RewardResult], requests: Sequence[RewardRequest], spec: RewardSpec) -> None:
    """Check what a reward returned against its requests and spec; a ValueError names the result."""
    if not isinstance(results, Sequence) or len(results) != len(requests):
        count = len(results) if isinstance(results, Sequence) else type(results).__name__
        raise ValueError(f"{spec.name} returned {count} results for {len(requests)} requests")
    for i, (result, request) in enumerate(zip(results, requests)):
        validate_result(result, request.num_frames, spec, f"{spec.name}: result[{i}]")


def validate_result(result: RewardResult, num_frames: int, spec: RewardSpec, where: str) -> None:
    if not isinstance(result, RewardResult):
        raise ValueError(f"{where}: expected a RewardResult, got {type(result).__name__}")
    if not isinstance(result.reward, float | int) or isinstance(result.reward, bool):
        raise ValueError(f"{where}.reward: expected a float, got {type(result.reward).__name__}")
    values = [np.array([result.reward], dtype=np.float64)]
    if spec.dense:
        if not isinstance(result.progress, np.ndarray) or result.progress.shape != (num_frames,):
            shape = getattr(result.progress, "shape", result.progress)
            raise ValueError(f"{where}.progress: {spec.name} is dense; expected shape ({num_frames},), got {shape}")
        values.append(result.progress.astype(np.float64))
    elif result.progress is not None:
        raise ValueError(f"{where}.progress: {spec.name} is not dense; expected None")
    if tuple(result.components) != spec.components:
        raise ValueError(f"{where}.components: names {list(result.components)}, the spec lists {list(spec.components)}")
    values.append(np.array(list(result.components.values()), dtype=np.float64))
    combined = np.concatenate(values)
    if np.isinf(combined).any():
        raise ValueError(f"{where}: infinite values; a reward must return finite values or NaN with an error")
    if np.isnan(combined).any() and not result.error:
        raise ValueError(f"{where}: NaN in reward/progress/components needs an error saying why")
    low, high = spec.value_range
    scored = values[0] if not spec.dense else np.concatenate(values[:2])
    scored = scored[~np.isnan(scored)]
    if scored.size and (scored.min() < low or scored.max() > high):
        raise ValueError(
            f"{where}: values {scored.min():.6g}..{scored.max():.6g} outside the spec's value range [{low}, {high}]"
        )
    if result.error is not None and not isinstance(result.error, str):
        raise ValueError(f"{where}.error: expected a string or None, got {type(result.error).__name__}")
    try:
        json.dumps(json_safe(result.info), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}.info: not JSON-safe ({error})") from None


# ----------------------------------------------------------------------------- JSON


def json_safe(value: Any) -> Any:
    """`value` with numpy scalars/arrays as Python numbers/lists, tuples as lists, NaN/inf as None.

    Raises TypeError for anything JSON cannot hold (objects, bytes).
    """
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [json_safe(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return _finite_or_none(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def _none_to_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _float_to_json(value: float) -> float | str:
    """Spec bounds keep their infinities: "inf" / "-inf" as strings."""
    return value if math.isfinite(value) else str(value)


def _float_from_json(value: float | str) -> float:
    return float(value)
