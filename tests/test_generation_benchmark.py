"""`vlmr generation-benchmark`: arms over seeds and the base over noise seeds, one report, resumable, equal images."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from tests.test_config_structure import undocumented_fields
from vlm_rewards.cli import app
from vlm_rewards.config import load_job_config
from vlm_rewards.generation import benchmark
from vlm_rewards.generation.config import BenchmarkConfig, GRPOConfig
from vlm_rewards.generation.models import build_tiny_generator, save_tiny_generator
from vlm_rewards.generation.shapes_t2i import prompts

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).parents[1]
REDNESS = {"kind": "function", "function": "vlm_rewards.generation.rule_rewards:redness", "value_range": [-1, 1]}
GOLD = {"kind": "function", "function": "vlm_rewards.generation.shapes_t2i:accuracy", "value_range": [0, 1]}
RUNS = ["grpo_seed0", "grpo_seed1", "nft_seed0", "nft_seed1", "rwr_seed0", "rwr_seed1"]
BASES = ["base_seed100", "base_seed101"]


@pytest.fixture
def arms(tmp_path) -> Path:
    """A random 16 px base and one-epoch GRPO, NFT and RWR configs on it (4 sampled images each) in tmp_path."""
    save_tiny_generator(build_tiny_generator("flow", resolution=16, seed=0), tmp_path / "base")
    grpo = {
        "model": {"family": "flow", "trained_tiny": str(tmp_path / "base")},
        "sampling": {"num_steps": 2, "eval_num_steps": 2, "window_size": 1},
        "rewards": {"trained": [{"name": "redness", "config": REDNESS}], "gold": [{"name": "gold", "config": GOLD}]},
        "train": {"prompts": prompts("grpo", "six_pairs")[:2], "eval_prompts": [], "epochs": 1, "group_size": 2,
                  "sample_batch_size": 4, "batches_per_epoch": 1, "train_batch_size": 4, "lr": 1e-2},
        "eval_every": 0, "export": {"formats": []},
    }  # fmt: skip
    nft = {
        "extends": "grpo.yaml",
        "sampling": {"noise_level": 0.0, "window_size": None},
        "nft": {"timesteps_per_sample": 1},
    }
    for name, config in {"grpo": grpo, "nft": nft, "rwr": {"extends": "grpo.yaml", "temperature": 0.5}}.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def benchmark_config(folder: Path, **changes) -> BenchmarkConfig:
    arms = {
        name: {"algorithm": name, "config": str(folder / f"{name}.yaml"), "seeds": [0, 1]}
        for name in ("grpo", "nft", "rwr")
    }
    settings = {"output_dir": str(folder / "out"), "arms": arms, "base_seeds": [100, 101], "eval_seed": 100,
                "images": {"grpo": 1, "unseen": 1, "train": 1}}  # fmt: skip
    return BenchmarkConfig.model_validate(settings | changes)


def completed(folder: Path) -> dict[str, int]:
    """Each run checkpoint's `complete` marker and its modification time."""
    return {str(path): path.stat().st_mtime_ns for path in sorted(folder.glob("*_seed*/checkpoints/*/complete"))}


def evaluations(folder: Path) -> dict[str, int]:
    """Each saved evaluation and its modification time."""
    return {str(path): path.stat().st_mtime_ns for path in sorted(folder.glob("evaluations/*/evaluation.json"))}


def test_benchmark_reports_every_run_and_a_rerun_continues_without_redoing_anything(arms, monkeypatch):
    config = benchmark_config(arms)
    out = config.output_dir

    def interrupted(*_):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:  # the first call is killed when it reaches the RWR runs
        patch.setitem(benchmark.ALGORITHMS, "rwr", interrupted)
        with pytest.raises(KeyboardInterrupt):
            benchmark.run_benchmark(config)
    first = completed(out)
    assert len(first) == 4 and not (out / "report.md").exists()

    done = benchmark.run_benchmark(config)  # the re-run trains only what is missing
    assert done["trained"] == ["rwr_seed0", "rwr_seed1"] and done["evaluated"] == BASES + RUNS
    assert {key: value for key, value in completed(out).items() if key in first} == first

    results = json.loads((out / "results.json").read_text())
    assert [row["name"] for row in results["runs"]] == BASES + RUNS
    assert results["sampled_images"] == {"grpo": 4, "nft": 4, "rwr": 4}
    assert {row["noise_seed"] for row in results["runs"] if row["arm"] != "base"} == {100}
    assert {row["epoch"] for row in results["runs"] if row["arm"] != "base"} == {1}  # the last checkpoint
    assert list(results["summary"]) == ["base", "grpo", "nft", "rwr"]
    for group, splits in results["summary"].items():
        rows = [row for row in results["runs"] if row["arm"] == group]
        for split in ("grpo", "unseen", "train"):
            for metric in ("accuracy", "fill"):
                cell = splits[split][metric]
                assert cell["n"] == 2 and cell["mean"] == pytest.approx(np.mean([row[split][metric] for row in rows]))
                assert cell["low"] <= cell["mean"] <= cell["high"]
    report = (out / "report.md").read_text()
    for row in results["runs"]:  # every evaluation has its line
        assert f"\n| {row['arm']} | {row['seed']} | {row['noise_seed']} | {row['epoch']} | " in report
    assert "## Gold accuracy" in report and "## Fill" in report and "(checked equal)" in report
    assert (out / "benchmark.png").stat().st_size > 0
    assert (out / "evaluations" / "nft_seed1" / "grids" / "unseen_epoch_0001.png").is_file()

    # through the CLI: nothing left to train or evaluate, nothing rewritten
    (arms / "benchmark.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    checkpointed, evaluated = completed(out), evaluations(out)
    result = CliRunner().invoke(app, ["generation-benchmark", str(arms / "benchmark.yaml")])
    assert result.exit_code == 0, result.output
    assert "'trained': []" in result.output and "'evaluated': []" in result.output
    assert completed(out) == checkpointed and evaluations(out) == evaluated

    (out / "evaluations" / "grpo_seed1" / "evaluation.json").unlink()  # a missing evaluation is redone alone
    assert benchmark.run_benchmark(config)["evaluated"] == ["grpo_seed1"]
    changed = benchmark_config(arms, images={"grpo": 2, "unseen": 1, "train": 1})  # so is one with other settings
    assert benchmark.run_benchmark(changed)["evaluated"] == BASES + RUNS

    grpo = yaml.safe_load((arms / "grpo.yaml").read_text())
    (arms / "grpo.yaml").write_text(yaml.safe_dump(grpo | {"train": grpo["train"] | {"lr": 0.5}}))
    with pytest.raises(ValueError, match=r"grpo_seed0: finished with other settings: train.lr: 0.01 -> 0.5"):
        benchmark.run_benchmark(config)


def test_arms_sampling_different_numbers_of_images_are_refused_before_anything_trains(arms):
    (arms / "nft.yaml").write_text((arms / "nft.yaml").read_text() + "train: {epochs: 2}\n")
    expected = (
        r"arms sample different numbers of images in training: grpo .*= 4; nft .*: 2 epochs x 1 batches x 4 images = 8"
    )
    with pytest.raises(ValueError, match=expected):
        benchmark.run_benchmark(benchmark_config(arms))
    assert not (arms / "out").exists()


def test_arms_from_different_base_models_are_refused(arms):
    save_tiny_generator(build_tiny_generator("flow", resolution=16, seed=1), arms / "other")
    (arms / "rwr.yaml").write_text(
        yaml.safe_dump({"extends": "grpo.yaml", "model": {"trained_tiny": str(arms / "other")}})
    )
    with pytest.raises(
        ValueError, match=r"arms 'grpo' .* and 'rwr' .* differ in their base model .*model.trained_tiny"
    ):
        benchmark.run_benchmark(benchmark_config(arms))


def test_aggregation_of_hand_made_numbers():
    def row(arm, accuracy, fill):
        return {"arm": arm} | {split: {"accuracy": accuracy, "fill": fill} for split in ("grpo", "unseen", "train")}

    rows = [
        row("base", 0.4, 0.9),
        row("base", 0.5, 0.9),
        row("base", 0.6, 0.9),
        row("grpo", 0.7, 0.5),
        row("grpo", 0.9, 0.7),
    ]
    summary = benchmark.aggregate(rows)
    assert list(summary) == ["base", "grpo"]
    base, grpo = summary["base"]["unseen"], summary["grpo"]["train"]
    assert base["accuracy"]["mean"] == pytest.approx(0.5) and base["accuracy"]["n"] == 3
    assert 0.4 <= base["accuracy"]["low"] < 0.5 < base["accuracy"]["high"] <= 0.6  # a resampled mean stays in range
    assert base["fill"] == {"mean": pytest.approx(0.9), "low": 0.9, "high": 0.9, "n": 3}  # no spread, no interval
    assert grpo["accuracy"]["mean"] == pytest.approx(0.8) and grpo["fill"]["mean"] == pytest.approx(0.6)
    assert (grpo["accuracy"]["low"], grpo["accuracy"]["high"]) == pytest.approx((0.7, 0.9))  # two seeds: the extremes
    assert benchmark.summarize([0.1, 0.2, 0.9]) == benchmark.summarize([0.1, 0.2, 0.9])  # seeded: reproducible


def test_shipped_benchmark_config_compares_the_three_arms_at_equal_images(monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's paths are relative to the repository root
    config = load_job_config(BenchmarkConfig, "configs/experiments/generation/six_pairs.yaml")
    assert config == BenchmarkConfig()  # the defaults are the shipped benchmark
    assert undocumented_fields(BenchmarkConfig) == []
    assert {name: len(arm.seeds) for name, arm in config.arms.items()} == {"grpo": 5, "nft": 5, "rwr": 3}
    assert len(config.base_seeds) >= 5 and config.eval_seed not in (7, *config.arms["grpo"].seeds)
    runs = benchmark.load_runs(config)
    assert {run.name: benchmark.sampled_images(run.config) for run in runs} == dict.fromkeys(
        [run.name for run in runs],
        10 * 5 * 48,  # 10 epochs of 5 groups of 48 images: 2,400 a run, as the docs say
    )
    assert {type(run.config).__name__ for run in runs} == {"GRPOConfig", "NFTConfig", "RWRConfig"}
    assert runs[-1].config.output_dir == Path("runs/six_pairs/rwr_seed2") and runs[-1].config.resume


def test_a_config_file_s_arms_replace_the_default_arms(tmp_path):
    path = tmp_path / "one_arm.yaml"
    path.write_text(yaml.safe_dump({"arms": {"mine": {"algorithm": "grpo", "config": "x.yaml", "seeds": [5, 6]}}}))
    config = load_job_config(BenchmarkConfig, path)
    assert list(config.arms) == ["mine"] and config.base_seeds == BenchmarkConfig().base_seeds  # the rest merges
    assert list(load_job_config(BenchmarkConfig, path, ["arms.mine.seeds=[5, 7]"]).arms) == ["mine"]
    child = tmp_path / "child.yaml"  # a file that extends one with arms replaces them too
    child.write_text(
        yaml.safe_dump(
            {"extends": "one_arm.yaml", "arms": {"yours": {"algorithm": "nft", "config": "y.yaml", "seeds": [5, 6]}}}
        )
    )
    assert list(load_job_config(BenchmarkConfig, child).arms) == ["yours"]


def test_the_graded_replicate_reruns_the_demo_s_training_on_seeds_nothing_else_used(monkeypatch):
    monkeypatch.chdir(ROOT)
    replicate = load_job_config(BenchmarkConfig, "configs/experiments/generation/six_pairs_graded.yaml")
    shipped, demo = BenchmarkConfig(), load_job_config(GRPOConfig, "configs/grpo/shapes_demo.yaml")
    run = benchmark.load_runs(replicate)[0]
    arm = replicate.arms["grpo_graded"]
    assert len(arm.seeds) == 5 and not {*arm.seeds} & {demo.seed, *shipped.arms["grpo"].seeds}
    noise = {replicate.eval_seed, *replicate.base_seeds}
    assert not noise & {7, 1000, shipped.eval_seed, *shipped.base_seeds} and replicate.images == shipped.images
    assert run.config.rewards == demo.rewards and run.config.train == demo.train  # the demo's training
    graded = load_job_config(GRPOConfig, arm.config).model_dump()
    plain = load_job_config(GRPOConfig, shipped.arms["grpo"].config).model_dump()
    assert {key for key in plain if plain[key] != graded[key]} == {"output_dir", "rewards"}


def test_the_rwr_replicate_reruns_the_benchmark_s_rwr_arm_on_other_seeds_with_the_graded_replicate_s_noise(
    monkeypatch,
):
    monkeypatch.chdir(ROOT)
    replicate = load_job_config(BenchmarkConfig, "configs/experiments/generation/six_pairs_rwr.yaml")
    graded = load_job_config(BenchmarkConfig, "configs/experiments/generation/six_pairs_graded.yaml")
    shipped = BenchmarkConfig()
    (arm,) = replicate.arms.values()
    assert (arm.algorithm, arm.config) == (shipped.arms["rwr"].algorithm, shipped.arms["rwr"].config)
    assert len(arm.seeds) == 5 and not {*arm.seeds} & {*shipped.arms["rwr"].seeds}
    assert (replicate.eval_seed, replicate.base_seeds) == (graded.eval_seed, graded.base_seeds)  # one base row
    assert replicate.images == shipped.images and replicate.checkpoint == shipped.checkpoint


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"eval_seed": 1}, "eval_seed 1 is a training seed of arm 'grpo'"),
        ({"eval_seed": 7}, "noise seed 7 chose the demo's settings"),
        ({"base_seeds": [7, 8]}, "noise seed 7 chose the demo's settings"),
        ({"base_seeds": [8, 8]}, r"base_seeds \[8, 8\]: each noise seed once"),
        ({"arms": {"base": {"algorithm": "grpo", "config": "x.yaml", "seeds": [0, 1]}}}, "name 'base'"),
        ({"arms": {"grpo": {"algorithm": "grpo", "config": "x.yaml", "seeds": [0]}}}, "at least 2 items"),
    ],
)
def test_benchmark_config_refuses_seeds_that_would_not_be_honest(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        benchmark_config(tmp_path, **change)
