"""Prompt datasets: the train and eval prompts of a generation job, from inline lists or files.

Three file formats (`PromptFile.format`):
- "text": one prompt per line; blank lines and lines starting with "#" are skipped;
- "jsonl": one JSON object per line, `{"prompt": ..., ...}`; the other keys are kept as the prompt's metadata;
- "geneval": GenEval's `evaluation_metadata.jsonl` (`{"tag": ..., "include": [{"class": ..., "count": ...}],
  "exclude": [...], "prompt": ...}`), checked for that structure; tag, include and exclude are the metadata.

Train and eval prompts are separate sources (`train.prompts`, `train.eval_prompts`). When either is a file,
loading refuses a prompt found in both (compared lower-cased, whitespace collapsed), naming both sources and
the first shared prompts. Two inline lists are not checked: smoke configs evaluate on their training prompts.

The reward interface takes no per-item metadata (`RewardRequest` has the prompt text only), so the trainer
uses the prompts' text; the metadata stays on the `PromptRecord`s `load_prompts` returns, for a caller
(e.g. a GenEval-style scorer) that matches images to records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlm_rewards.generation.config import GRPOConfig, PromptFile, PromptSource

SUFFIXES = {".txt": "text", ".jsonl": "jsonl"}
GENEVAL_KEYS = ("tag", "include")
SHOWN_SHARED = 3  # shared prompts named in the error


@dataclass(frozen=True)
class PromptRecord:
    """One prompt, where it came from ("file:line", or "inline[i]"), and its metadata (JSONL's other keys)."""

    text: str
    origin: str
    metadata: dict[str, Any] = field(default_factory=dict)


def load_prompts(source: PromptSource) -> list[PromptRecord]:
    """The records of an inline list or a prompt file; an empty source or prompt is a ValueError."""
    if isinstance(source, PromptFile):
        return read_prompt_file(source.path, source.format)
    records = [PromptRecord(text.strip(), f"inline[{i}]") for i, text in enumerate(source)]
    for record in records:
        if not record.text:
            raise ValueError(f"{record.origin}: an empty prompt")
    return records


def read_prompt_file(path: str | Path, format: str = "auto") -> list[PromptRecord]:
    """A prompt file's records in file order; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file {path}: no such file")
    lines = path.read_text(encoding="utf-8").splitlines()
    format = detect_format(path, lines) if format == "auto" else format
    if format == "text":
        records = [
            PromptRecord(line.strip(), f"{path}:{number}")
            for number, line in enumerate(lines, 1)
            if line.strip() and not line.lstrip().startswith("#")
        ]
    elif format in ("jsonl", "geneval"):
        records = [
            json_record(line, f"{path}:{number}", format == "geneval")
            for number, line in enumerate(lines, 1)
            if line.strip()
        ]
    else:
        raise ValueError(f"prompt file {path}: format {format!r}; expected 'auto', 'text', 'jsonl' or 'geneval'")
    if not records:
        raise ValueError(f"prompt file {path}: no prompts in it")
    return records


def detect_format(path: Path, lines: list[str]) -> str:
    """By the suffix: .txt is "text"; .jsonl is "geneval" when its first object has tag and include, else "jsonl"."""
    format = SUFFIXES.get(path.suffix.lower())
    if format is None:
        raise ValueError(
            f"prompt file {path}: cannot tell its format from the suffix {path.suffix!r}; use .txt or .jsonl, "
            "or set format (text, jsonl or geneval)"
        )
    first = next((line for line in lines if line.strip()), None)
    if format == "jsonl" and first is not None:
        try:
            item = json.loads(first)
        except ValueError:
            return format  # json_record reports it with the line number
        if isinstance(item, dict) and all(key in item for key in GENEVAL_KEYS):
            return "geneval"
    return format


def json_record(line: str, origin: str, geneval: bool) -> PromptRecord:
    """One JSONL line: its "prompt" and, as metadata, every other key (GenEval's structure checked)."""
    try:
        item = json.loads(line)
    except ValueError as error:
        raise ValueError(f"{origin}: not valid JSON ({error})") from None
    if not isinstance(item, dict):
        raise ValueError(f"{origin}: expected a JSON object with a 'prompt', got {type(item).__name__}")
    text = item.pop("prompt", None)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{origin}: expected a non-empty string 'prompt', got {text!r}")
    if geneval:
        check_geneval(item, origin)
    return PromptRecord(text.strip(), origin, item)


def check_geneval(item: dict[str, Any], origin: str) -> None:
    """GenEval metadata: a string tag, a non-empty include list and an optional exclude list of
    {"class": str, "count": int, ...} objects (color and position are optional keys of an object)."""
    if not isinstance(item.get("tag"), str):
        raise ValueError(f"{origin}: GenEval metadata needs a string 'tag', got {item.get('tag')!r}")
    for key in ("include", "exclude"):
        objects = item.get(key, [])
        if not isinstance(objects, list) or (key == "include" and not objects):
            raise ValueError(f"{origin}: GenEval '{key}' must be a list of objects, got {objects!r}")
        for thing in objects:
            if (
                not isinstance(thing, dict)
                or not isinstance(thing.get("class"), str)
                or not isinstance(thing.get("count"), int)
            ):
                raise ValueError(f"{origin}: GenEval '{key}' entry {thing!r}: expected {{'class': str, 'count': int}}")


def load_prompt_splits(config: GRPOConfig) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """(train, eval) records; when either source is a file, a prompt in both is a ValueError."""
    train, evaluation = config.train.prompts, config.train.eval_prompts
    train_records = load_prompts(train)
    eval_records = load_prompts(evaluation) if evaluation else []
    if isinstance(train, PromptFile) or isinstance(evaluation, PromptFile):
        check_disjoint(train_records, eval_records, source_name(train), source_name(evaluation))
    return train_records, eval_records


def check_disjoint(first: list[PromptRecord], second: list[PromptRecord], first_name: str, second_name: str) -> None:
    """No prompt (lower-cased, whitespace collapsed) in both splits; the error names both and the first shared."""
    seen = {normalized(record.text): record for record in first}
    shared = [(seen[normalized(record.text)], record) for record in second if normalized(record.text) in seen]
    if shared:
        examples = "; ".join(f"{a.text!r} ({a.origin} and {b.origin})" for a, b in shared[:SHOWN_SHARED])
        raise ValueError(
            f"train.prompts ({first_name}) and train.eval_prompts ({second_name}) share {len(shared)} prompt(s), "
            f"e.g. {examples}; a prompt may be in one split only"
        )


def resolve_prompts(config: GRPOConfig) -> GRPOConfig:
    """The config with both prompt sources loaded into lists of texts (the splits checked): what the trainer
    samples, and what its checkpoints record, so resuming notices a prompt file that changed."""
    train_records, eval_records = load_prompt_splits(config)
    texts = {"prompts": [r.text for r in train_records], "eval_prompts": [r.text for r in eval_records]}
    return config.model_copy(update={"train": config.train.model_copy(update=texts)})


def normalized(text: str) -> str:
    return " ".join(text.lower().split())


def source_name(source: PromptSource) -> str:
    return str(source.path) if isinstance(source, PromptFile) else "the inline list"
