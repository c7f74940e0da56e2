"""The `six_pairs` benchmark: its three-way pair split, the shipped base generator and the demo's report."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from vlm_rewards.config import load_job_config
from vlm_rewards.data.synthetic import COLORS, SHAPES
from vlm_rewards.evaluation.metrics import bootstrap_ci
from vlm_rewards.fingerprint import sha256_file
from vlm_rewards.generation import demo, pretrain
from vlm_rewards.generation.config import ALGORITHM_CONFIGS, BenchmarkConfig, GRPOConfig, PretrainConfig, PromptFile
from vlm_rewards.generation.export import export_base
from vlm_rewards.generation.models import build_tiny_generator, load_tiny_generator, save_tiny_generator
from vlm_rewards.generation.prompts import load_prompts
from vlm_rewards.generation.sampling import sample_deterministic
from vlm_rewards.generation.shapes_t2i import ShapePrompt, check_pair_splits, prompts, verify
from vlm_rewards.generation.train import run_grpo

ROOT = Path(__file__).parents[1]
BASE = ROOT / "data" / "models" / "shapes-base"
CONFIGS_DIR = ROOT / "configs" / "grpo"
VERIFIER = {"kind": "function", "function": "vlm_rewards.generation.shapes_t2i:verifier_score", "value_range": [0, 1]}
SPLITS = ("train", "grpo", "unseen")
DEMO_TRAINING = {"seed", "model", "sampling", "rewards", "train", "temperature"}  # what a demo run learns from

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def pairs_of(prompt_list: list[str]) -> set[tuple[str, str]]:
    return {(p.color, p.shape) for p in map(ShapePrompt.parse, prompt_list)}


def test_six_pairs_split_by_pair_keeping_every_colour_and_shape_in_base_training():
    split = {name: prompts(name, "six_pairs") for name in SPLITS}
    assert {name: len(value) for name, value in split.items()} == {"train": 60, "grpo": 15, "unseen": 15}
    assert sorted(sum(split.values(), [])) == sorted(prompts()) and prompts("held_out", "six_pairs") == sorted(
        split["grpo"] + split["unseen"], key=prompts().index
    )
    pairs = {name: pairs_of(value) for name, value in split.items()}
    assert len(pairs["grpo"]) == len(pairs["unseen"]) == 3 and len(pairs["train"]) == 12
    assert not (pairs["grpo"] & pairs["unseen"] or pairs["train"] & (pairs["grpo"] | pairs["unseen"]))
    check_pair_splits(split)  # the shipped definition passes its own check
    for held_out in ("grpo", "unseen"):  # each held-out pair in every region
        assert len(split[held_out]) == 5 * len(pairs[held_out])
        assert {shape for _, shape in pairs[held_out]} == set(SHAPES)  # each split tests every shape
    # every colour is still drawn with two shapes, every shape with four colours
    assert {color: sum(c == color for c, _ in pairs["train"]) for color in COLORS} == dict.fromkeys(COLORS, 2)
    assert {shape: sum(s == shape for _, s in pairs["train"]) for shape in SHAPES} == dict.fromkeys(SHAPES, 4)


def test_a_colour_shape_pair_in_two_splits_is_refused_whatever_the_regions():
    with pytest.raises(ValueError, match="pair 'red circle' crosses splits: .*'grpo' and .*'unseen'"):
        check_pair_splits({"grpo": ["a red circle in the top left"], "unseen": ["a red circle in the center"]})
    check_pair_splits({"grpo": ["a red circle in the top left"], "unseen": ["a red square in the top left"]})
    with pytest.raises(ValueError, match="split 'unseen': only the 'six_pairs' holdout has it"):
        prompts("unseen", "pairs")


def test_the_demo_refuses_a_run_trained_on_an_unseen_or_base_pair():
    for prompt in ("a green triangle in the center", "a red square in the center"):
        config = GRPOConfig.model_validate({"train": {"prompts": [prompt], "eval_prompts": []}})
        with pytest.raises(ValueError, match="crosses splits"):
            demo.check_run_prompts(config)
    demo.check_run_prompts(GRPOConfig.model_validate({"train": {"prompts": prompts("grpo", "six_pairs")}}))


def test_shipped_configs_read_the_base_and_its_prompt_files():
    base = load_job_config(PretrainConfig, CONFIGS_DIR / "shapes_base_six_pairs.yaml")
    assert base.holdout == "six_pairs" and base.train_split == "train"
    for name in SPLITS:  # the files `pretrain ship` wrote are the splits
        assert [r.text for r in load_prompts(PromptFile(path=BASE / "prompts" / f"{name}.txt"))] == prompts(
            name, "six_pairs"
        )
    config = load_job_config(GRPOConfig, CONFIGS_DIR / "shapes_six_pairs.yaml")
    assert Path(config.model.trained_tiny) == Path("data/models/shapes-base")
    assert Path(config.train.prompts.path) == Path("data/models/shapes-base/prompts/grpo.txt")
    assert Path(config.train.eval_prompts.path) == Path("data/models/shapes-base/prompts/unseen.txt")


@pytest.mark.parametrize("algorithm", ["rwr", "grpo", "nft"])
def test_each_demo_config_trains_its_benchmark_arm_where_make_grpo_demo_reads_it(algorithm, monkeypatch):
    monkeypatch.chdir(ROOT)
    config_class = ALGORITHM_CONFIGS[algorithm]
    demo_config = load_job_config(config_class, f"configs/{algorithm}/shapes_demo.yaml")
    assert demo_config.output_dir == Path("runs/grpo_demo") / algorithm  # the Makefile's runs/grpo_demo/<algorithm>
    assert (demo_config.eval_every, demo_config.checkpoint_every, demo_config.resume) == (0, 2, False)
    assert demo_config.keep_checkpoints * demo_config.checkpoint_every >= demo_config.train.epochs  # keeps them all
    if algorithm == "rwr":  # the benchmark's RWR arm, whose unseen rise the replicate re-ran
        arm = load_job_config(config_class, BenchmarkConfig().arms["rwr"].config)
        assert demo_config.model_dump(include=DEMO_TRAINING) == arm.model_dump(include=DEMO_TRAINING)
    assert Path(demo_config.model.trained_tiny) == Path("data/models/shapes-base")
    assert Path(demo_config.train.prompts.path) == Path("data/models/shapes-base/prompts/grpo.txt")


def test_the_shipped_base_loads_by_path_and_draws_the_prompted_shapes():
    weights = sorted(BASE.rglob("*.safetensors"))
    assert sum(path.stat().st_size for path in BASE.rglob("*")) <= 6 * 2**20
    card = (BASE / "README.md").read_text()
    for path in weights:  # the card's checksums are those of the files shipped
        assert sha256_file(path) in card
        assert {tensor.dtype for tensor in load_file(path).values()} == {torch.float16}
    generator = load_tiny_generator(BASE)
    assert next(generator.denoiser.parameters()).dtype == torch.float32 and generator.latent_shape == (3, 32, 32)
    train = prompts("train", "six_pairs")[::12]  # five of the base's own prompts, one image each
    images = sample_deterministic(generator, train, 10, seed=0)
    assert images.shape == (5, 32, 32, 3) and images.dtype == np.uint8
    assert sum(verify(image, prompt).correct for image, prompt in zip(images, train)) >= 3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_export_loads_back_in_fp32_with_the_same_images(tmp_path, dtype):
    generator = build_tiny_generator("flow", resolution=8, seed=3)
    save_tiny_generator(generator, tmp_path / "fp32")
    export_base(tmp_path / "fp32", tmp_path / "half", dtype)
    weights = load_file(tmp_path / "half" / "denoiser" / "diffusion_pytorch_model.safetensors")
    assert {str(tensor.dtype) for tensor in weights.values()} == {f"torch.{dtype}"}
    half = load_tiny_generator(tmp_path / "half")
    assert next(half.denoiser.parameters()).dtype == torch.float32
    prompt_list = ["a red circle", "a blue square"]
    full_images = sample_deterministic(generator, prompt_list, 4, seed=0).astype(int)
    half_images = sample_deterministic(half, prompt_list, 4, seed=0).astype(int)
    assert np.abs(full_images - half_images).max() <= 3  # rounding the weights moves pixels by a few levels
    assert json.loads((tmp_path / "half" / "export.json").read_text())["format"] == dtype
    with pytest.raises(ValueError, match="export dtype 'int8': expected one of"):
        export_base(tmp_path / "fp32", tmp_path / "int8", "int8")


@pytest.fixture(scope="module")
def tiny_six_pairs_base(tmp_path_factory):
    """A 3-step `six_pairs` base on 16 px, shipped with `pretrain ship` into its own folder."""
    folder = tmp_path_factory.mktemp("six_pairs")
    config = {
        "output_dir": str(folder / "run"), "holdout": "six_pairs", "steps": 3, "batch_size": 4, "warmup_steps": 1,
        "eval_num_steps": 2, "eval_images_per_prompt": 1,
        "model": {"resolution": 16, "layers": 1, "heads": 2, "head_dim": 8, "text_dim": 16, "patch_size": 2},
    }  # fmt: skip
    history = pretrain.run_pretrain(PretrainConfig.model_validate(config))
    assert {"eval/train/accuracy", "eval/grpo/accuracy", "eval/unseen/accuracy"} <= set(history)
    (folder / "base.json").write_text(json.dumps(config))
    result = CliRunner().invoke(pretrain.app, ["ship", str(folder / "base.json"), "--output", str(folder / "shipped")])
    assert result.exit_code == 0, result.output
    return folder / "shipped"


def test_ship_writes_the_model_its_prompt_splits_and_a_card_with_checksums(tiny_six_pairs_base):
    card = (tiny_six_pairs_base / "README.md").read_text()
    weights = sorted(tiny_six_pairs_base.rglob("*.safetensors"))
    assert len(weights) == 2 and all(sha256_file(path) in card for path in weights)
    assert "| unseen | 15 |" in card and "vlmr pretrain-generator" in card
    for name in SPLITS:
        assert [
            r.text for r in load_prompts(PromptFile(path=tiny_six_pairs_base / "prompts" / f"{name}.txt"))
        ] == prompts(name, "six_pairs")
    assert load_tiny_generator(tiny_six_pairs_base).latent_shape == (3, 16, 16)


def test_demo_report_evaluates_the_base_and_each_checkpoint_on_every_split(tiny_six_pairs_base, tmp_path):
    config = GRPOConfig.model_validate(
        {
            "output_dir": str(tmp_path / "grpo"),
            "model": {"family": "flow", "trained_tiny": str(tiny_six_pairs_base)},
            "sampling": {"num_steps": 2, "eval_num_steps": 2, "window_size": 1},
            "rewards": {"trained": [{"name": "verifier", "config": VERIFIER}]},
            "train": {"prompts": prompts("grpo", "six_pairs")[:2], "eval_prompts": [], "epochs": 2, "group_size": 2,
                      "sample_batch_size": 4, "batches_per_epoch": 1, "train_batch_size": 4},
            "eval_every": 0, "checkpoint_every": 1, "keep_checkpoints": 5, "export": {"formats": []},
        }
    )  # fmt: skip
    run_grpo(config)
    arguments = [str(tmp_path / "grpo"), "--output", str(tmp_path / "report"), "--images", "2", "--train-images", "1"]
    result = CliRunner().invoke(demo.app, arguments)
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert [row["epoch"] for row in results["evaluations"]] == [0, 1, 2]
    for row in results["evaluations"]:
        for name in ("grpo", "unseen", "train"):
            assert row[name]["low"] <= row[name]["accuracy"] <= row[name]["high"]
            assert (tmp_path / "report" / "grids" / f"{name}_epoch_{row['epoch']:04d}.png").is_file()
    report = (tmp_path / "report" / "report.md").read_text()
    assert report.count("\n| 0 | ") == 1 and "\n| 2 | " in report and "What this budget can and cannot show" in report
    assert "paired over prompts" in report
    assert (tmp_path / "report" / "curves.png").is_file()


def test_the_demo_change_is_paired_over_prompts():
    """Prompts of very different difficulty, each up by 0.125: the per-evaluation intervals overlap, the paired
    interval of the change does not hold 0; an evaluation against itself changes by exactly 0."""
    base = {"per_prompt": [0.0, 0.125, 0.25, 0.5, 0.625, 0.75, 0.875] * 2}
    trained = {"per_prompt": [value + 0.125 for value in base["per_prompt"]]}
    change = demo.paired_change(base, trained, seed=0)
    assert change["change"] == pytest.approx(0.125) and change["low"] == change["high"] == pytest.approx(0.125)
    noisy = {"per_prompt": [value + delta for value, delta in zip(trained["per_prompt"], [0.125, -0.125] * 7)]}
    change = demo.paired_change(base, noisy, seed=0)
    noisy_low, _ = bootstrap_ci(noisy["per_prompt"], np.mean, 2000, 0)
    _, base_high = bootstrap_ci(base["per_prompt"], np.mean, 2000, 0)
    assert noisy_low < base_high and 0 < change["low"] < 0.125 < change["high"]
    assert demo.paired_change(base, base, seed=0) == {"change": 0.0, "low": 0.0, "high": 0.0}
