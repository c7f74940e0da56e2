"""Prompt datasets: text, JSONL and GenEval files, the train/eval split check, and the shipped example pair."""

import json
from pathlib import Path

import pytest

from vlm_rewards.config import load_job_config
from vlm_rewards.generation.config import GRPOConfig, PromptFile
from vlm_rewards.generation.prompts import load_prompt_splits, read_prompt_file, resolve_prompts

ROOT = Path(__file__).parents[1]
GENEVAL = [
    {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"},
    {
        "tag": "counting",
        "include": [{"class": "clock", "count": 2}],
        "exclude": [{"class": "clock", "count": 3}],
        "prompt": "a photo of two clocks",
    },
    {
        "tag": "position",
        "include": [{"class": "cup", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}],
        "prompt": "a photo of a dog left of a cup",
    },
]


def write(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def config(train, evaluation) -> GRPOConfig:
    return GRPOConfig.model_validate({"train": {"prompts": train, "eval_prompts": evaluation}})


def test_a_text_file_skips_comments_and_blank_lines_and_names_each_prompts_line(tmp_path):
    path = write(tmp_path / "p.txt", ["# header", "", "a red circle", "  # indented comment", " a blue square  "])
    records = read_prompt_file(path)
    assert [(r.text, r.origin, r.metadata) for r in records] == [
        ("a red circle", f"{path}:3", {}),
        ("a blue square", f"{path}:5", {}),
    ]


def test_jsonl_keeps_every_other_key_as_metadata(tmp_path):
    path = write(tmp_path / "p.jsonl", [{"prompt": "a cat", "id": 7, "style": ["photo"]}, "", {"prompt": "a dog"}])
    records = read_prompt_file(path)
    assert [(r.text, r.metadata) for r in records] == [("a cat", {"id": 7, "style": ["photo"]}), ("a dog", {})]


def test_geneval_metadata_is_detected_and_kept(tmp_path):
    records = read_prompt_file(write(tmp_path / "evaluation_metadata.jsonl", GENEVAL))
    assert [r.text for r in records] == [item["prompt"] for item in GENEVAL]
    assert records[1].metadata == {key: value for key, value in GENEVAL[1].items() if key != "prompt"}


@pytest.mark.parametrize(
    ("name", "lines", "format", "message"),
    [
        ("p.jsonl", [{"prompt": "a cat"}, "{not json"], "auto", r"p.jsonl:2: not valid JSON"),
        ("p.jsonl", [{"text": "a cat"}], "auto", r"p.jsonl:1: expected a non-empty string 'prompt'"),
        ("p.jsonl", [["a cat"]], "jsonl", r"p.jsonl:1: expected a JSON object"),
        ("p.jsonl", [{"prompt": "a cat", "tag": "colors"}], "geneval", r"p.jsonl:1: GenEval 'include'"),
        ("p.jsonl", [{**GENEVAL[0], "include": [{"class": "bench"}]}], "auto", r"p.jsonl:1: GenEval 'include' entry"),
        ("p.jsonl", [{**GENEVAL[0], "exclude": {"class": "bench"}}], "auto", r"p.jsonl:1: GenEval 'exclude'"),
        ("p.csv", ["a cat"], "auto", r"p.csv: cannot tell its format from the suffix '.csv'"),
        ("p.txt", ["# only a comment", ""], "auto", r"p.txt: no prompts in it"),
    ],
)
def test_bad_prompt_files_are_refused_naming_the_file_and_line(tmp_path, name, lines, format, message):
    path = write(tmp_path / name, lines)
    with pytest.raises(ValueError, match=message):
        read_prompt_file(path, format)


def test_a_missing_file_is_refused_when_the_run_loads_its_prompts(tmp_path):
    with pytest.raises(ValueError, match=r"missing.txt: no such file"):
        load_prompt_splits(config(str(tmp_path / "missing.txt"), []))


def test_a_bare_path_string_is_a_prompt_file_and_inline_lists_still_work(tmp_path):
    assert config("prompts/train.txt", ["a cat"]).train.prompts == PromptFile(path=Path("prompts/train.txt"))
    inline = config(["a cat", "a dog"], ["a cat"])  # two inline lists may share prompts (smoke configs do)
    assert resolve_prompts(inline).train == inline.train


def test_split_files_are_loaded_into_the_lists_the_trainer_samples(tmp_path):
    train = write(tmp_path / "train.txt", ["a red circle", "a blue square"])
    test = write(tmp_path / "test.jsonl", GENEVAL[:1])
    resolved = resolve_prompts(config(str(train), {"path": str(test), "format": "geneval"}))
    assert resolved.train.prompts == ["a red circle", "a blue square"]
    assert resolved.train.eval_prompts == ["a photo of a bench"]


@pytest.mark.parametrize("evaluation_inline", [False, True])
def test_a_prompt_in_both_splits_is_refused_naming_both_sources_and_the_shared_prompts(tmp_path, evaluation_inline):
    train = write(tmp_path / "train.txt", ["a red circle", "a blue square", "a green star"])
    evaluation = ["A  Blue square", "a yellow star", "a green star"]  # compared lower-cased, spaces collapsed
    if not evaluation_inline:
        evaluation = str(write(tmp_path / "test.txt", evaluation))
    with pytest.raises(ValueError) as error:
        load_prompt_splits(config(str(train), evaluation))
    message = str(error.value)
    assert str(train) in message and ("the inline list" if evaluation_inline else "test.txt") in message
    assert "share 2 prompt(s)" in message and "'a blue square'" in message and f"{train}:2" in message


def test_the_shipped_prompt_files_and_their_config_load_as_disjoint_splits(monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's paths are relative to the repository root, where vlmr runs
    config = load_job_config(GRPOConfig, ROOT / "configs" / "grpo" / "shapes_prompt_files.yaml")
    train_records, eval_records = load_prompt_splits(config)
    assert len(train_records) == 10 and len(eval_records) == 5
    assert eval_records[0].metadata["include"] == [{"class": "triangle", "count": 1, "color": "purple"}]
