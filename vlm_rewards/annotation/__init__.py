"""Reward annotation of video datasets (`vlmr annotate`): resumable, fault-tolerant, local or on Ray Data.

See docs/annotation.md. Sources (`sources`), decoding (`decode`), batched scoring through the reward
interface (`scoring`), the output folder (`outputs`), the engines (`runner`, `ray_engine`), the report
(`report`).

The engine is imported on first use: decode workers import `vlm_rewards.annotation.decode` in fresh
processes, and must not pay for the engine, Ray and the report at start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AnnotateConfig": "vlm_rewards.annotation.config",
    "AnnotationSummary": "vlm_rewards.annotation.runner",
    "run_annotation": "vlm_rewards.annotation.runner",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
