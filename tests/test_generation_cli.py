"""`vlmr grpo` and the shipped configs/grpo/*.yaml."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from generation.config import GRPOConfig, ModelSettings
from generation.models import check_generator
from generation.pretrain import PretrainConfig
from generation.train import build_generator
from vlm_rewards.cli import app
from vlm_rewards.config import load_job_config

CONFIGS_DIR = Path(__file__).parents[1] / "configs" / "grpo"
# `vlmr pretrain-generator` configs; the rest are `vlmr grpo` ones
PRETRAIN_CONFIGS = {"shapes_base", "shapes_base_pairs"}
CONFIGS = sorted(path for path in CONFIGS_DIR.glob("*.yaml") if path.stem not in PRETRAIN_CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=[path.stem for path in CONFIGS])
def test_shipped_grpo_configs_validate(path):
    config = load_job_config(GRPOConfig, path)
    assert config.rewards.trained
    if config.model.pretrained is None and config.model.trained_tiny is None:
        check_generator(build_generator(config.model))  # the tiny model of each family is a supported one


@pytest.mark.parametrize("name", sorted(PRETRAIN_CONFIGS))
def test_shipped_pretrain_configs_validate(name):
    config = load_job_config(PretrainConfig, CONFIGS_DIR / f"{name}.yaml")
    check_generator(build_generator(ModelSettings(family=config.family, tiny=config.model)))


@pytest.mark.parametrize("name", ["tiny_flow", "tiny_flux"])
def test_vlmr_grpo_runs_a_tiny_config(tmp_path, name):
    result = CliRunner().invoke(
        app,
        [
            "grpo",
            str(CONFIGS_DIR / f"{name}.yaml"),
            f"output_dir={tmp_path}",
            "train.epochs=1",
            "sampling.num_steps=3",
            "sampling.window_starts=[0, 2]",
            "eval_every=1",
            "checkpoint_every=1",
        ],
    )
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in metrics] == [0, 1]  # epoch 0: the starting model's evaluation
    assert "eval/gold/brightness" in metrics[0] and "gold/brightness/mean" in metrics[1]


def test_vlmr_grpo_reports_a_bad_config_without_a_traceback(tmp_path):
    result = CliRunner().invoke(app, ["grpo", f"output_dir={tmp_path}", "train.group_size=3"])
    assert result.exit_code == 2 and "does not divide" in result.output


def test_vlmr_pretrain_generator_writes_a_model_folder_grpo_can_name(tmp_path):
    tiny = ["model.resolution=16", "model.layers=1", "model.heads=2", "model.head_dim=8", "model.patch_size=2"]
    quick = [
        "steps=2",
        "batch_size=2",
        "warmup_steps=1",
        "eval_every=0",
        "eval_images_per_prompt=1",
        "eval_num_steps=1",
    ]
    arguments = ["pretrain-generator", str(CONFIGS_DIR / "shapes_base.yaml"), f"output_dir={tmp_path}", *tiny, *quick]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "model" / "tiny_generator.json").is_file()
    config = load_job_config(
        GRPOConfig, CONFIGS_DIR / "shapes_verifier.yaml", [f"model.trained_tiny={tmp_path / 'model'}"]
    )
    check_generator(build_generator(config.model))
