"""Rule-based rewards: no learning, useful as baselines, sanity checks and co-rewards."""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pydantic

from vlm_rewards.config import Settings
from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import (
    REFERENCE,
    BaseReward,
    RewardRequest,
    RewardResult,
    RewardSession,
    RewardSpec,
    stream_references,
    validate_clip,
)
from vlm_rewards.registry import register


class DistanceProgress(BaseReward):
    """Dense progress from a distance, read in each frame, to what the request asks for.

    progress_t = 1 − d_t / d_0, clipped to [0, 1]; 1 throughout when d_0 = 0. A frame whose distance cannot
    be read (NaN) keeps the previous frame's; a clip whose first frame cannot be read gets progress 0.
    Progress at t needs only d_0 and d_t, so sessions keep those per stream and read each new frame once:
    O(1) work a step in the RL loop, never rescoring the prefix. Subclasses say what the frames are
    measured against (`_goal`) and how (`_distances`).
    """

    distance_name = "distance"  # the `info` key of the last frame's distance

    @abstractmethod
    def _goal(self, text: str, reference: np.ndarray | None, text_name: str, reference_name: str) -> Any:
        """What the frames are measured against, from a request's text and reference (names for errors)."""

    @abstractmethod
    def _distances(self, frames: np.ndarray, goal: Any, where: str) -> np.ndarray:
        """(T,) distance of each of `frames` (named `where` in errors) to `goal`; NaN where unreadable."""

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        results = []
        for i, request in enumerate(requests):
            goal = self._goal(request.text, request.reference, f"requests[{i}].text", f"requests[{i}].reference")
            track = _DistanceTrack()
            distances = self._distances(request.frames, goal, f"requests[{i}].frames")
            progress = track.extend(distances, request.frames.shape[1:])
            results.append(RewardResult(float(progress[-1]), progress, info={self.distance_name: track.last}))
        return results

    def open_session(
        self, texts: Sequence[str], references: Sequence[np.ndarray | None] | None = None
    ) -> RewardSession:
        return DistanceSession(self, texts, references)


class DistanceSession(RewardSession):
    """One `DistanceProgress` stream per env: each new frame's distance is read once and compared with d_0."""

    def __init__(
        self, reward: DistanceProgress, texts: Sequence[str], references: Sequence[np.ndarray | None] | None = None
    ):
        references = stream_references(texts, references)
        self.reward = reward
        self._goals = [self._goal(i, text, reference) for i, (text, reference) in enumerate(zip(texts, references))]
        self._tracks = [_DistanceTrack() for _ in texts]

    def _goal(self, index: int, text: str, reference: np.ndarray | None) -> Any:
        if REFERENCE in self.reward.spec.requires and reference is None:
            raise ValueError(f"references[{index}]: {self.reward.spec.name} needs a goal image, got None")
        return self.reward._goal(text, reference, f"texts[{index}]", f"references[{index}]")

    @property
    def num_frames(self) -> list[int]:
        return [track.num_frames for track in self._tracks]

    def reset(self, index: int, text: str, reference: np.ndarray | None = None) -> None:
        self._goals[index] = self._goal(index, text, reference)
        self._tracks[index] = _DistanceTrack()

    def append(
        self, frames: Sequence[np.ndarray], views: Sequence[Mapping[str, np.ndarray]] | None = None
    ) -> list[np.ndarray]:
        if len(frames) != len(self._tracks):
            raise ValueError(f"append: {len(frames)} frame arrays for {len(self._tracks)} streams")
        distances = []
        for i, (new, goal, track) in enumerate(zip(frames, self._goals, self._tracks)):
            validate_clip(new, f"frames[{i}]", self.reward.spec)
            track.check_shape(new, f"frames[{i}]")
            distances.append(self.reward._distances(new, goal, f"frames[{i}]"))
        # every stream's frames are read before any state changes: a refused call leaves the session as it was
        return [
            track.extend(d, new.shape[1:]).astype(np.float64) for track, d, new in zip(self._tracks, distances, frames)
        ]


class _DistanceTrack:
    """What progress 1 − d_t / d_0 needs of a clip seen so far: d_0, the last readable distance, its length."""

    def __init__(self) -> None:
        self.start = self.last = math.nan
        self.num_frames = 0
        self.frame_shape: tuple[int, ...] | None = None

    def check_shape(self, frames: np.ndarray, where: str) -> None:
        """Later frames must keep the shape of the stream's first ones."""
        if self.frame_shape is not None and frames.shape[1:] != self.frame_shape:
            raise ValueError(f"{where}: frames of shape {frames.shape[1:]}, the stream began with {self.frame_shape}")

    def extend(self, distances: np.ndarray, frame_shape: tuple[int, ...]) -> np.ndarray:
        """Progress of the next frames (each of `frame_shape`), given their distances."""
        distances = _carry_forward(np.concatenate([[self.last], distances]))[1:]
        if self.num_frames == 0:
            self.start, self.frame_shape = distances[0], frame_shape
        self.num_frames += len(distances)
        self.last = float(distances[-1])
        if np.isnan(self.start):  # a marker missing from the first frame: no progress can be read
            return np.zeros_like(distances)
        if self.start == 0:
            return np.ones_like(distances)
        return np.clip(1.0 - distances / self.start, 0.0, 1.0)


@register("goal_pixel_progress")
class GoalPixelProgress(DistanceProgress):
    """Progress toward a goal image by pixel distance.

    d_t is the mean absolute RGB difference between frame t and the goal, the request's last reference
    frame; progress follows `DistanceProgress`. reward = progress of the last frame.
    """

    distance_name = "goal_distance"

    class Params(Settings):
        name: str = "goal_pixel_progress"
        """The reward's name in results, logs and reports."""

    def __init__(self, name: str = "goal_pixel_progress"):
        self.spec = RewardSpec(
            name=name,
            version=fingerprint("goal_pixel_progress", 1),
            value_range=(0.0, 1.0),
            dense=True,
            causal=True,
            requires=(REFERENCE,),
        )

    @classmethod
    def from_params(cls, params: Params) -> GoalPixelProgress:
        return cls(params.name)

    def _goal(self, text: str, reference: np.ndarray | None, text_name: str, reference_name: str) -> np.ndarray:
        validate_clip(reference, reference_name)
        return reference[-1].astype(np.float32)

    def _distances(self, frames: np.ndarray, goal: np.ndarray, where: str) -> np.ndarray:
        if goal.shape != frames.shape[1:]:
            raise ValueError(
                f"{where}: frames of shape {frames.shape[1:]}, expected the goal image's shape {goal.shape}"
            )
        return np.abs(frames.astype(np.float32) - goal).mean(axis=(1, 2, 3))


@register("motion_penalty")
class MotionPenalty(BaseReward):
    """−scale × mean absolute change between consecutive frames (in [0, 1] per pixel): discourages jerk."""

    class Params(Settings):
        name: str = "motion_penalty"
        """The reward's name in results, logs and reports."""
        scale: float = pydantic.Field(1.0, gt=0)
        """Weight of the mean absolute frame-to-frame change (pixels in [0, 1]); rewards lie in [-scale, 0]."""

    def __init__(self, name: str = "motion_penalty", scale: float = 1.0):
        self.scale = scale
        self.spec = RewardSpec(name=name, version=fingerprint("motion_penalty", scale), value_range=(-scale, 0.0))

    @classmethod
    def from_params(cls, params: Params) -> MotionPenalty:
        return cls(params.name, params.scale)

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        results = []
        for request in requests:
            frames = request.frames.astype(np.float32) / 255.0
            motion = float(np.abs(np.diff(frames, axis=0)).mean()) if len(frames) > 1 else 0.0
            results.append(RewardResult(reward=-self.scale * motion, info={"motion": motion}))
        return results


RGB = tuple[int, int, int]
Marker = Literal["effector"] | pydantic.PositiveInt


@register("marker_progress")
class MarkerProgress(DistanceProgress):
    """Scripted progress in scenes of flat colour markers: how much closer two markers have come, in pixels.

    The markers are the effector and the colours the instruction names, counted in the order they appear
    (`between`: ("effector", 1) for "reach the red target"; (1, 2) for "push the red block to the blue
    zone"). d_t is the distance between the centroids of their pixels in frame t; progress follows
    `DistanceProgress`, so a frame in which either marker is hidden keeps the previous frame's distance.
    A pixel belongs to the palette entry nearest to it in RGB, if that is within `tolerance`. It reads
    only frames and text, so it goes through the same reward path as a learned RM: the robotics
    experiments use it as the upper bound of what a frame-reading progress reward can give RL.
    """

    distance_name = "marker_distance"

    class Params(Settings):
        name: str = "marker_progress"
        """The reward's name in results, logs and reports."""
        palette: dict[str, RGB | list[RGB]] = pydantic.Field(min_length=1)
        """Colour word -> its RGB as rendered, or several (e.g. a lit block's and a flat zone's shade)."""
        effector: RGB
        """The effector marker's RGB as rendered."""
        between: tuple[Marker, Marker] = ("effector", 1)
        """The two markers whose distance is measured: "effector" or k, the k-th colour the text names."""
        colours_named: int = pydantic.Field(1, ge=1)
        """How many palette colours every text names."""
        tolerance: float = pydantic.Field(40.0, gt=0)
        """RGB distance within which a pixel is a marker's."""
        border: int = pydantic.Field(0, ge=0)
        """Pixels at each frame edge that are ignored (walls, frames)."""

        @pydantic.model_validator(mode="after")
        def _between_named_colours(self) -> MarkerProgress.Params:
            if len(set(self.between)) != 2 or any(m != "effector" and m > self.colours_named for m in self.between):
                raise ValueError(
                    f"between {self.between}: expected two different markers, each 'effector' or a colour "
                    f"number up to colours_named={self.colours_named}"
                )
            return self

    def __init__(self, params: Params):
        self.params = params
        self.words = list(params.palette)
        shades = [(i, rgb) for i, value in enumerate(params.palette.values()) for rgb in _as_list(value)]
        self.effector = len(self.words)
        self.shade_marker = np.array([i for i, _ in shades] + [self.effector])
        self.shades = np.array([rgb for _, rgb in shades] + [params.effector], dtype=np.float32)
        self.spec = RewardSpec(
            name=params.name,
            version=fingerprint("marker_progress", params.model_dump()),
            value_range=(0.0, 1.0),
            dense=True,
            causal=True,
        )

    @classmethod
    def from_params(cls, params: Params) -> MarkerProgress:
        return cls(params)

    def example_texts(self) -> tuple[str, ...]:
        """Instructions naming `colours_named` different palette colours ("move the red to the blue")."""
        count, words = self.params.colours_named, self.words
        return tuple(
            "move the " + " to the ".join(words[(first + k) % len(words)] for k in range(count))
            for first in range(min(3, len(words)))
        )

    def _goal(self, text: str, reference: np.ndarray | None, text_name: str, reference_name: str) -> tuple[int, int]:
        """The two markers to measure (palette indices; `self.effector` for the effector)."""
        named = [self.words.index(word) for word in text.lower().split() if word in self.words]
        if len(named) != self.params.colours_named or len(set(named)) != len(named):
            raise ValueError(
                f"{text_name}: {text!r} names {len(named)} palette colours; expected {self.params.colours_named}, "
                f"all different, of {self.words}"
            )
        first, second = (self.effector if m == "effector" else named[m - 1] for m in self.params.between)
        return first, second

    def _distances(self, frames: np.ndarray, goal: tuple[int, int], where: str) -> np.ndarray:
        places = [self._centroids(frame, goal) for frame in frames]
        return np.array([np.linalg.norm(a - b) for a, b in places])

    def _centroids(self, frame: np.ndarray, markers: tuple[int, ...]) -> list[np.ndarray]:
        """Each marker's pixel centroid (row, col) in one frame; NaN where none of its pixels is visible."""
        border = self.params.border
        pixels = frame[border : frame.shape[0] - border, border : frame.shape[1] - border].astype(np.float32)
        distance = np.linalg.norm(pixels[:, :, None, :] - self.shades, axis=-1)
        shade = distance.argmin(-1)
        within = np.take_along_axis(distance, shade[..., None], axis=-1)[..., 0] <= self.params.tolerance
        nearest = np.where(within, self.shade_marker[shade], -1)
        centroids = []
        for marker in markers:
            rows, cols = np.nonzero(nearest == marker)
            centroids.append(np.array([rows.mean(), cols.mean()]) if len(rows) else np.full(2, np.nan))
        return centroids


def _as_list(shades: RGB | list[RGB]) -> list[RGB]:
    return shades if isinstance(shades, list) else [shades]


def _carry_forward(values: np.ndarray) -> np.ndarray:
    """NaNs replaced by the last finite value before them (leading NaNs stay)."""
    values = values.copy()
    for t in range(1, len(values)):
        if np.isnan(values[t]):
            values[t] = values[t - 1]
    return values
