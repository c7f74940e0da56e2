"""Files shipped with the package: the configs/ folder, the tokenizer corpus and the pretrained backbone.

In the git checkout `configs/`, `data/corpus/` and `data/models/` live at the top level (where users look);
`vlm_rewards/_shipped/{configs,corpus,models}` are committed symlinks to them, declared
as package data, so a wheel carries copies of their contents and an editable install follows the links.
Either way the files are found through `importlib.resources`, never relative to the source tree.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.resources
from importlib.resources.abc import Traversable
from pathlib import Path

__all__ = ["SHIPPED_BACKBONE", "corpus_file", "reward_configs", "shipped", "shipped_backbone", "shipped_configs"]

SHIPPED_BACKBONE = "simworld"
"""The name that stands for the shipped backbone wherever a backbone folder or hub id is expected."""

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


def shipped_backbone() -> Path:
    """The simulated world's pretrained backbone (`data/models/simworld-backbone`, built by
    `vlmr pretrain-backbone configs/pretrain/backbone.yaml`): a folder that loads like a hub checkpoint."""
    folder = shipped("models", "simworld-backbone")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{folder}: the shipped backbone is missing; rebuild it with "
            "`vlmr pretrain-backbone configs/pretrain/backbone.yaml`"
        )
    return folder
