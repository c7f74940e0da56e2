"""Progress display for long library loops, injected by the caller.

Library code takes `track: Track | None` and loops over `(track or untracked)(items, description)`; the
CLI passes a tqdm bar (`vlm_rewards.cli.tqdm_track`), tests and library callers pass nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

ItemT = TypeVar("ItemT")


class Track(Protocol):
    def __call__(self, items: Iterable[ItemT], description: str = "", total: int | None = None) -> Iterable[ItemT]: ...


def untracked(items: Iterable[ItemT], description: str = "", total: int | None = None) -> Iterable[ItemT]:
    """The default `Track`: the items, with no display."""
    return items
