"""Job configs: a YAML file validated by a pydantic model, with dotted overrides from the command line.

`vlmr train-rm configs/train_rm/progress_tiny.yaml optim.lr=3e-4 data.synthetic_train.num_frames=8`:
each override is `dotted.key=value`, the value parsed as YAML (numbers, booleans, lists). Every field
has a default, so a job also runs with no file at all (the embedded defaults).

YAML files are read strictly (`safe_load_strict`): a key given twice in one mapping is an error naming
the file, line and key, not "the last one wins".

A file may start from another: `extends: carry_transfer.yaml` (a path relative to the file) loads that file
first and merges this one over it, section by section; a list or a value replaces the base's whole.
Paths inside the base that are relative to its folder (a composite reward's parts) are then read relative
to the extending file's folder.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import pydantic
import yaml

ConfigT = TypeVar("ConfigT", bound=pydantic.BaseModel)


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping."""


def _construct_strict_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    # Only the mapping's own keys count: a `<<: *anchor` merge may be overridden on purpose.
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # the base constructor reports unhashable keys
        line = key_node.start_mark.line + 1
        if key in first_line:
            raise ValueError(
                f"{loader.origin}:{line}: duplicate key {key!r} (first given on line {first_line[key]}); "
                "remove one of them"
            )
        first_line[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_strict_mapping)


def safe_load_strict(text: str, origin: str = "<yaml>") -> Any:
    """`yaml.safe_load`, except that a duplicate key raises a ValueError naming `origin`, line and key.

    Invalid YAML raises `yaml.YAMLError` as safe_load does.
    """
    loader = _StrictLoader(text)
    loader.origin = origin
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path, replaced: Collection[str] = ()) -> dict[str, Any]:
    """A YAML mapping read with `safe_load_strict`, merged over the file it `extends` (its top-level keys in
    `replaced` taken whole, not merged); errors name the file."""
    return _load_extending(Path(path), chain=(), replaced=replaced)


def _load_extending(path: Path, chain: tuple[Path, ...], replaced: Collection[str]) -> dict[str, Any]:
    loaded = _load_mapping(path)
    base = loaded.pop("extends", None)
    if base is None:
        return loaded
    if not isinstance(base, str) or not base:
        raise ValueError(f"{path}: extends: expected the path of a YAML file, got {base!r}")
    base_path = (path.parent / base).resolve()
    chain = (*chain, path.resolve())
    if base_path in chain:
        cycle = " -> ".join(str(step) for step in (*chain, base_path))
        raise ValueError(f"{path}: extends makes a cycle ({cycle})")
    try:
        return deep_merge(_load_extending(base_path, chain, replaced), loaded, replaced)
    except ValueError as error:
        raise ValueError(f"{path}: extends {base}: {error}") from None


def _load_mapping(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"{path}: no such config file")
    try:
        loaded = safe_load_strict(path.read_text(), origin=str(path))
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not valid YAML ({error})") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not a text file ({error})") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: expected a YAML mapping at the top level, got {type(loaded).__name__}")
    return loaded


def require_output_dir(value: Path) -> Path:
    """An output folder a job may write into: not empty or "." (`output_dir=` parses to "."), which would
    scatter outputs into the working folder, and not an existing file."""
    if str(value).strip() in ("", "."):
        raise ValueError("output_dir must name a folder; an empty value or '.' would write into the current folder")
    if value.exists() and not value.is_dir():
        raise ValueError(f"output_dir {str(value)!r} is a file; expected a folder (new or from an earlier run)")
    return value


OutputDir = Annotated[Path, pydantic.AfterValidator(require_output_dir)]


class Settings(pydantic.BaseModel):
    """Base of every settings section: unknown keys are errors, so a typo never silently uses a default.

    Each field is documented where it is declared, by the docstring under it (as a dataclass attribute
    docstring); pydantic keeps it as the field's description, so `vlmr <job> --help`-style listings and
    JSON schemas show it.
    """

    model_config = pydantic.ConfigDict(extra="forbid", use_attribute_docstrings=True)


REPLACED_BY_FILE = {"replaced_by_file": True}
"""`pydantic.Field(json_schema_extra=REPLACED_BY_FILE)`: a job config file that sets the field replaces its default
instead of merging into it."""


class JobConfig(Settings):
    """Base of every job's top-level config (a YAML file plus `dotted.key=value` overrides)."""


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
    nested section keeps the section's other defaults; a field declared with `REPLACED_BY_FILE` (a map of named
    items, such as a benchmark's arms) is taken whole from the file, or from the file it extends, that sets it.
    """
    replaced = {
        name for name, field in model.model_fields.items() if (field.json_schema_extra or {}).get("replaced_by_file")
    }
    given = load_yaml_file(path, replaced) if path is not None else {}
    data = deep_merge(model().model_dump(), given, replaced)
    origin = str(path) if path is not None else f"{model.__name__} defaults"
    try:
        return model.model_validate(apply_overrides(data, overrides))
    except pydantic.ValidationError as error:
        raise ValueError(f"{origin}: {format_validation_error(error)}") from None


def deep_merge(base: dict[str, Any], update: dict[str, Any], replaced: Collection[str] = ()) -> dict[str, Any]:
    """`base` with `update` merged in, section by section; `update`'s values of the keys in `replaced` are taken
    whole."""
    merged = _deep_copy(base)
    for key, value in update.items():
        if key not in replaced and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def changed_settings(saved: Any, current: Any, may_change: Sequence[str] = (), prefix: str = "") -> list[str]:
    """`key: saved -> current` for every dotted setting that differs between two dumped configs, except
    the keys in `may_change` and everything under them (a run's resume check)."""
    if prefix.removesuffix(".") in may_change:
        return []
    if isinstance(saved, dict) and isinstance(current, dict):
        names = sorted(saved.keys() | current.keys())
        return [
            change
            for name in names
            for change in changed_settings(saved.get(name), current.get(name), may_change, f"{prefix}{name}.")
        ]
    return [] if saved == current else [f"{prefix.removesuffix('.')}: {saved!r} -> {current!r}"]


def dump_config(config: pydantic.BaseModel) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def _deep_copy(data: dict[str, Any]) -> dict[str, Any]:
    return {key: _deep_copy(value) if isinstance(value, dict) else value for key, value in data.items()}


def format_validation_error(error: pydantic.ValidationError) -> str:
    """A pydantic error as `dotted.key: message; ...`."""
    problems = []
    for item in error.errors():
        location = ".".join(str(part) for part in item["loc"]) or "<root>"
        problems.append(f"{location}: {item['msg']}")
    return "; ".join(problems)
