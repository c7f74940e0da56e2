"""Job configs: a YAML file validated by a pydantic model, with dotted overrides from the command line.

`vlmr train-rm configs/train_rm/progress_tiny.yaml train.lr=3e-4 data.num_frames=8`: each override is
`dotted.key=value`, the value parsed as YAML (numbers, booleans, lists). Every field has a default,
so a job also runs with no file at all (the embedded defaults).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from vlm_rewards.registry import format_validation_error, load_yaml

ConfigT = TypeVar("ConfigT", bound=pydantic.BaseModel)


class JobConfig(pydantic.BaseModel):
    """Base of every job config: unknown keys are errors, so a typo never silently uses a default."""

    model_config = pydantic.ConfigDict(extra="forbid")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `a.b.c=value` override set (value parsed as YAML)."""
    result = _deep_copy(data)
    for override in overrides:
        key, separator, raw_value = override.partition("=")
        if not separator or not key.strip():
            raise ValueError(f"override {override!r}: expected dotted.key=value")
        *parents, leaf = key.strip().split(".")
        node = result
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"override {override!r}: {part!r} is a value, not a section")
            node = child
        node[leaf] = parse_value(raw_value)
    return result


def parse_value(raw: str) -> Any:
    """YAML scalars and lists; also `3e-4`, which YAML 1.1 would leave as a string."""
    if not raw.strip():
        return ""
    value = yaml.safe_load(raw)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def load_job_config(model: type[ConfigT], path: str | Path | None = None, overrides: Sequence[str] = ()) -> ConfigT:
    """Validate a job config from an optional YAML file plus overrides; errors name the file and key.

    The file and the overrides are merged into the model's full defaults, so overriding one key of a
    nested section keeps the section's other defaults.
    """
    data = deep_merge(model().model_dump(), load_yaml(path) if path is not None else {})
    origin = str(path) if path is not None else f"{model.__name__} defaults"
    try:
        return model.model_validate(apply_overrides(data, overrides))
    except pydantic.ValidationError as error:
        raise ValueError(f"{origin}: {format_validation_error(error)}") from None


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = _deep_copy(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def dump_config(config: pydantic.BaseModel) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def _deep_copy(data: dict[str, Any]) -> dict[str, Any]:
    return {key: _deep_copy(value) if isinstance(value, dict) else value for key, value in data.items()}
