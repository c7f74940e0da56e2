"""`vlmr grpo` and the shipped configs/grpo/*.yaml."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from generation.config import GRPOConfig
from generation.models import check_generator
from generation.train import build_generator
from vlm_rewards.cli import app
from vlm_rewards.config import load_job_config

CONFIGS_DIR = Path(__file__).parents[1] / "configs" / "grpo"
CONFIGS = sorted(CONFIGS_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[path.stem for path in CONFIGS])
def test_shipped_grpo_configs_validate(path):
    config = load_job_config(GRPOConfig, path)
    assert config.rewards.trained
    if config.model.pretrained is None:
        check_generator(build_generator(config.model))  # the tiny model of each family is a supported one


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
    assert metrics[0]["epoch"] == 1 and "gold/brightness/mean" in metrics[0]


def test_vlmr_grpo_reports_a_bad_config_without_a_traceback(tmp_path):
    result = CliRunner().invoke(app, ["grpo", f"output_dir={tmp_path}", "train.group_size=3"])
    assert result.exit_code == 2 and "does not divide" in result.output
