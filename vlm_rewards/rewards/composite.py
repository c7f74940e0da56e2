"""Weighted sum of rewards.

reward = Σ wᵢ rᵢ over the parts; when every part is dense, progress = Σ wᵢ progressᵢ per frame. Each
part's raw reward is kept in `components` under its name. A composite is as pure as its parts: it
keeps no statistics (normalise in the consumer, `vlm_rewards.normalization`), and its capability
flags are those all its parts share.

A part that fails on a sample (NaN with an error) follows `on_error`: `propagate` (default) makes the
composite's value NaN too, with the part's error; `zero` counts the part as 0 and keeps its error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pydantic

from vlm_rewards.config import Settings
from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import (
    EXAMPLE_TEXTS,
    BaseReward,
    RewardModel,
    RewardRequest,
    RewardResult,
    RewardSession,
    RewardSpec,
    example_texts_of,
    validate_clip,
)
from vlm_rewards.registry import build_reward, current_config_folder, register

OnError = Literal["propagate", "zero"]


class Component(Settings):
    reward: str | dict[str, Any]
    """A shipped config name, a YAML path (relative to the YAML naming it), or an inline config."""
    weight: float = 1.0
    """The component's weight in the sum."""
    name: str | None = None
    """Its key in the results' components; None: the component reward's own name."""

    @pydantic.field_validator("weight")
    @classmethod
    def _finite(cls, weight: float) -> float:
        if not math.isfinite(weight):
            raise ValueError(f"weight must be a finite number, got {weight}")
        return weight


@register("composite")
class CompositeReward(BaseReward):
    class Params(Settings):
        name: str = "composite"
        """The reward's name in results, logs and reports."""
        components: list[Component] = pydantic.Field(min_length=1)
        """The rewards summed, each with its weight."""
        on_error: OnError = "propagate"
        """A component's error fails the request (propagate) or counts that component as 0 (zero)."""

    def __init__(
        self,
        rewards: list[RewardModel],
        weights: list[float],
        name: str = "composite",
        names: list[str | None] | None = None,
        on_error: OnError = "propagate",
    ):
        if len(rewards) != len(weights) or not rewards:
            raise ValueError(
                f"composite {name!r}: got {len(rewards)} rewards and {len(weights)} weights; "
                "expected the same non-zero number of each"
            )
        if not all(math.isfinite(w) for w in weights):
            raise ValueError(f"composite {name!r}: weights {weights} must be finite numbers")
        self.rewards, self.weights, self.on_error = rewards, [float(w) for w in weights], on_error
        self.names = [given or reward.spec.name for given, reward in zip(names or [None] * len(rewards), rewards)]
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"composite {name!r}: component names {self.names} must be unique (set `name`)")
        specs = [reward.spec for reward in rewards]
        dense = all(spec.dense for spec in specs)
        self.spec = RewardSpec(
            name=name,
            version=fingerprint([(s.version, w, n) for s, w, n in zip(specs, self.weights, self.names)], on_error),
            value_range=_weighted_range(specs, self.weights),
            dense=dense,
            causal=dense and all(spec.causal for spec in specs),
            batch_invariant=all(spec.batch_invariant for spec in specs),
            deterministic=all(spec.deterministic for spec in specs),
            requires=tuple(sorted({requirement for spec in specs for requirement in spec.requires})),
            components=tuple(self.names),
            frame_size=_intersect_frame_sizes([spec.frame_size for spec in specs]),
            max_frames=min((s.max_frames for s in specs if s.max_frames is not None), default=None),
            max_text_length=min((s.max_text_length for s in specs if s.max_text_length is not None), default=None),
        )

    @classmethod
    def from_params(cls, params: Params) -> CompositeReward:
        folder = current_config_folder()
        return cls(
            [build_reward(component.reward, relative_to=folder) for component in params.components],
            weights=[component.weight for component in params.components],
            name=params.name,
            names=[component.name for component in params.components],
            on_error=params.on_error,
        )

    def open_session(
        self, texts: Sequence[str], references: Sequence[np.ndarray | None] | None = None
    ) -> RewardSession:
        """Dense causal parts stream in their own sessions (a KV cache, a distance track), combined per
        frame; otherwise each append rescores the prefix."""
        if not self.spec.causal:
            return super().open_session(texts, references)
        sessions: list[RewardSession] = []
        try:
            for reward in self.rewards:
                sessions.append(reward.open_session(texts, references))
        except Exception:
            for session in sessions:  # a later part refused: release what the earlier ones hold
                session.close()
            raise
        return CompositeSession(self, sessions)

    def example_texts(self) -> tuple[str, ...]:
        """The instructions of the first part that declares its own (every part scores the same texts)."""
        own = (texts for texts in map(example_texts_of, self.rewards) if texts != EXAMPLE_TEXTS)
        return next(own, EXAMPLE_TEXTS)

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        part_results = [reward.score(requests) for reward in self.rewards]
        return [self._combine(i, [results[i] for results in part_results]) for i in range(len(requests))]

    def _combine(self, index: int, parts: list[RewardResult]) -> RewardResult:
        errors = [f"{name}: {part.error}" for name, part in zip(self.names, parts) if part.error]
        rewards = np.array([part.reward for part in parts], dtype=np.float64)
        progress = None
        if self.spec.dense:
            progress = self._weighted(np.stack([part.progress for part in parts]))
        return RewardResult(
            reward=float(self._weighted(rewards)),
            progress=progress,
            components=dict(zip(self.names, rewards.tolist())),
            error="; ".join(errors) or None,
        )

    def _weighted(self, values: np.ndarray) -> np.ndarray:
        """Σ wᵢ valuesᵢ over the first axis, NaN parts following `on_error`."""
        if self.on_error == "zero":
            values = np.nan_to_num(values, nan=0.0)
        return np.tensordot(self.weights, values, axes=1)


class CompositeSession(RewardSession):
    """The parts' sessions side by side; each append returns the weighted sum of their progress."""

    def __init__(self, composite: CompositeReward, sessions: list[RewardSession]):
        self.composite, self.sessions = composite, sessions

    @property
    def num_frames(self) -> list[int]:
        return self.sessions[0].num_frames

    def reset(self, index: int, text: str, reference: np.ndarray | None = None) -> None:
        for session in self.sessions:
            session.reset(index, text, reference)

    def append(
        self, frames: Sequence[np.ndarray], views: Sequence[Mapping[str, np.ndarray]] | None = None
    ) -> list[np.ndarray]:
        for i, new in enumerate(frames):  # refused by every part before any part's stream moves on
            validate_clip(new, f"frames[{i}]", self.composite.spec)
        parts = [session.append(frames, views) for session in self.sessions]
        return [self.composite._weighted(np.stack(stream)) for stream in zip(*parts)]

    def close(self) -> None:
        for session in self.sessions:
            session.close()


def _weighted_range(specs: list[RewardSpec], weights: list[float]) -> tuple[float, float]:
    low = high = 0.0
    for spec, weight in zip(specs, weights):
        if weight == 0:
            continue
        ends = sorted((weight * spec.value_range[0], weight * spec.value_range[1]))
        low, high = low + ends[0], high + ends[1]
    return low, high


def _intersect_frame_sizes(sizes: list[tuple[int, int] | None]) -> tuple[int, int] | None:
    given = [size for size in sizes if size is not None]
    if not given:
        return None
    return (max(low for low, _ in given), min(high for _, high in given))
