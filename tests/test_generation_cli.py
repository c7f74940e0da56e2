"""`vlmr grpo` and the shipped configs/grpo/*.yaml."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from vlm_rewards.cli import app
from vlm_rewards.config import load_job_config
from vlm_rewards.generation.config import GRPOConfig, ModelSettings, PretrainConfig
from vlm_rewards.generation.models import build_tiny_generator, check_generator, save_tiny_generator
from vlm_rewards.generation.train import build_generator

CONFIGS_DIR = Path(__file__).parents[1] / "configs" / "grpo"
# `vlmr pretrain-generator` configs; the rest are `vlmr grpo` ones
PRETRAIN_CONFIGS = {"shapes_base", "shapes_base_pairs", "shapes_base_six_pairs"}
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


# ----------------------------------------------------------------------------- checkpoints, resume and logs


def vlmr_grpo(output_dir: Path, *overrides: str):
    """`vlmr grpo configs/grpo/tiny_flow.yaml` cut to a second per epoch, with `overrides` after."""
    quick = ["sampling.num_steps=3", "sampling.window_starts=[0, 2]", "train.batches_per_epoch=1", "eval_every=1"]
    arguments = ["grpo", str(CONFIGS_DIR / "tiny_flow.yaml"), f"output_dir={output_dir}", *quick, *overrides]
    return CliRunner().invoke(app, arguments)


def saved_epochs(output_dir: Path) -> list[int]:
    return sorted(int(path.name.removeprefix("epoch_")) for path in (output_dir / "checkpoints").glob("epoch_*"))


def logged_epochs(output_dir: Path) -> list[int]:
    return [json.loads(line)["epoch"] for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished one-epoch run of tiny_flow.yaml; tests resume copies of it."""
    output_dir = tmp_path_factory.mktemp("grpo") / "run"
    result = vlmr_grpo(output_dir, "train.epochs=1")
    assert result.exit_code == 0, result.output
    return output_dir


def copy_of(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["train.epochs=2"], [2]),  # the config file's own smoke command: checkpoint_every 5 > epochs
        (["train.epochs=3", "checkpoint_every=2"], [2, 3]),
        (["train.epochs=1", "checkpoint_every=0"], [1]),
    ],
)
def test_vlmr_grpo_always_saves_the_last_epoch(tmp_path, overrides, expected):
    result = vlmr_grpo(tmp_path, "eval_every=0", *overrides)
    assert result.exit_code == 0, result.output
    assert saved_epochs(tmp_path) == expected
    assert (tmp_path / "checkpoints" / f"epoch_{expected[-1]:06d}" / "complete").is_file()


def test_vlmr_grpo_resume_truncates_metrics_to_the_checkpoint(tmp_path):
    result = vlmr_grpo(tmp_path, "train.epochs=3", "checkpoint_every=2")
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    shutil.rmtree(tmp_path / "checkpoints" / "epoch_000003")  # killed after logging epoch 3, before saving it
    result = vlmr_grpo(tmp_path, "train.epochs=3", "checkpoint_every=2")
    assert result.exit_code == 0, result.output
    assert logged_epochs(tmp_path) == [0, 1, 2, 3]  # epoch 3 logged once: by the run that saved it
    assert (tmp_path / "metrics.jsonl").read_text().splitlines()[:3] == lines[:3]
    assert saved_epochs(tmp_path) == [2, 3]


def test_vlmr_grpo_without_resume_starts_a_fresh_log_and_drops_the_earlier_checkpoints(tmp_path):
    result = vlmr_grpo(tmp_path, "train.epochs=3", "checkpoint_every=1", "keep_checkpoints=3")
    assert result.exit_code == 0 and saved_epochs(tmp_path) == [1, 2, 3], result.output
    result = vlmr_grpo(tmp_path, "train.epochs=1", "resume=false")
    assert result.exit_code == 0, result.output
    assert logged_epochs(tmp_path) == [0, 1] and saved_epochs(tmp_path) == [1]


@pytest.mark.parametrize(
    ("override", "changed"),
    [
        ("train.prompts=[a red circle, a purple star]", "train.prompts"),
        ("model.tiny.layers=2", "model.tiny.layers"),
        ("model.lora.r=4", "model.lora.r"),
        ("seed=1", "seed"),
    ],
)
def test_vlmr_grpo_refuses_to_resume_with_changed_settings_and_names_them(finished_run, tmp_path, override, changed):
    output_dir = copy_of(finished_run, tmp_path)
    result = vlmr_grpo(output_dir, "train.epochs=2", override)
    assert result.exit_code == 2, result.output
    error = result.output[result.output.index("error: cannot resume") :]
    assert f" {changed}: " in error and "resume=false" in error
    assert logged_epochs(output_dir) == [0, 1] and saved_epochs(output_dir) == [1]  # the run is left as it was


def test_vlmr_grpo_resumes_with_more_epochs_and_other_evaluation_settings(finished_run, tmp_path):
    output_dir = copy_of(finished_run, tmp_path)
    changes = ["train.epochs=2", "eval_every=2", "keep_checkpoints=3", "train.eval_prompts=[a green triangle]"]
    result = vlmr_grpo(output_dir, *changes)
    assert result.exit_code == 0, result.output
    assert logged_epochs(output_dir) == [0, 1, 2] and saved_epochs(output_dir) == [1, 2]


def test_vlmr_grpo_refuses_to_resume_when_the_trained_tiny_model_changed_shape(tmp_path):
    model = tmp_path / "base"
    save_tiny_generator(build_tiny_generator("flow", head_dim=8), model)
    result = vlmr_grpo(tmp_path / "run", "train.epochs=1", f"model.trained_tiny={model}")
    assert result.exit_code == 0, result.output
    shutil.rmtree(model)
    save_tiny_generator(build_tiny_generator("flow", head_dim=4), model)  # re-pretrained, same folder
    result = vlmr_grpo(tmp_path / "run", "train.epochs=2", f"model.trained_tiny={model}")
    assert result.exit_code == 2, result.output
    error = result.output[result.output.index("error: cannot resume") :]
    assert "its weights do not fit this model: size mismatch" in error


@pytest.mark.parametrize(
    ("job", "override"),
    [
        ("grpo", "train.epochs=-1"),
        ("grpo", "train.epochs=0"),
        ("grpo", "train.batches_per_epoch=0"),
        ("grpo", "train.train_batch_size=0"),
        ("grpo", "train.inner_epochs=0"),
        ("grpo", "sampling.num_steps=0"),
        ("grpo", "checkpoint_every=-1"),
        ("grpo", "keep_checkpoints=0"),
        ("rwr", "train.epochs=-1"),
        ("pretrain-generator", "steps=-1"),
        ("pretrain-generator", "warmup_steps=0"),
        ("pretrain-generator", "batch_size=0"),
    ],
)
def test_counts_that_would_train_nothing_are_refused(tmp_path, job, override):
    result = CliRunner().invoke(app, [job, f"output_dir={tmp_path}", override])
    assert result.exit_code == 2, result.output
    assert f"{override.split('=')[0]}: Input should be greater than" in result.output
    assert not (tmp_path / "metrics.jsonl").exists()


CUDA_REWARD = "rewards.trained=[{name: rm, config: {kind: trained_rm, model: runs/rm/model, device: cuda}}]"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize(
    ("job", "override", "message"),
    [
        ("grpo", CUDA_REWARD, "device 'cuda': CUDA is not available on this machine"),
        ("rwr", CUDA_REWARD, "device 'cuda': CUDA is not available on this machine"),
        # the generation jobs choose no device themselves (accelerate does; pretraining runs on CPU)
        ("grpo", "device=cuda", "device: Extra inputs are not permitted"),
        ("pretrain-generator", "device=cuda", "device: Extra inputs are not permitted"),
    ],
)
def test_a_cuda_device_without_cuda_is_refused_when_the_job_starts(tmp_path, job, override, message):
    result = CliRunner().invoke(app, [job, f"output_dir={tmp_path}", override])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
