"""Files shipped with the package: the configs/ folder and the tokenizer corpus.

In the git checkout `configs/` and `data/corpus/` live at the top level (where users look);
`vlm_rewards/_shipped/configs` and `vlm_rewards/_shipped/corpus` are committed symlinks to them, declared
as package data, so a wheel carries copies of their contents and an editable install follows the links.
Either way the files are found through `importlib.resources`, never relative to the source tree.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.resources
from importlib.resources.abc import Traversable
from pathlib import Path

__all__ = ["corpus_file", "reward_configs", "shipped", "shipped_configs"]

_extracted = contextlib.ExitStack()
atexit.register(_extracted.close)


def shipped(*parts: str) -> Path:
    """A shipped file or folder as a filesystem path (`shipped("configs", "rewards")`).

    Installed wheels and checkouts give real paths; from a zip import the resource is extracted to a
    temporary location that lives until the interpreter exits.
    """
    resource: Traversable = importlib.resources.files("vlm_rewards").joinpath("_shipped", *parts)
    if isinstance(resource, Path):
        return resource.resolve()
    return Path(_extracted.enter_context(importlib.resources.as_file(resource)))


def shipped_configs() -> Path:
    """The shipped `configs/` folder (job configs for demo, train-rm, eval-rm and reward configs)."""
    return shipped("configs")


def reward_configs() -> Path:
    """The shipped reward configs (`configs/rewards/*.yaml`), which `build_reward` finds by bare name."""
    return shipped("configs", "rewards")


def corpus_file() -> Path:
    """The instruction corpus the tiny test tokenizer is trained on (`data/corpus/instructions.txt`)."""
    return shipped("corpus", "instructions.txt")
