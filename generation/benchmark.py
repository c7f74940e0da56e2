"""`vlmr generation-benchmark`: issue #37's generation benchmark, from one config by one command.

For each arm (an algorithm, GRPO, DiffusionNFT or RWR, and its run config) and each of its training seeds, a run
in output_dir/<arm>_seed<S>, trained in-process by the trainer its `vlmr` command calls, one run at a time. Every
run config is read and checked before anything trains: the arms sample the same number of images in training
(`sampled_images`), start from the same base model and train on no pair of the `unseen` or `train` splits.
Each run's last checkpoint is then evaluated on the three `six_pairs` splits (`generation.demo`'s evaluation:
ODE samples from the config's `eval_seed`), the base on each of `base_seeds`, and the means over seeds with
95 % percentile-bootstrap intervals over seeds go to output_dir/report.md, results.json and benchmark.png.

Resumable: a run is finished when `benchmark_run.json` in its folder records its settings (written after its
last epoch); an unfinished one resumes from its checkpoints; an evaluation in output_dir/evaluations/<name> is
kept while its settings (noise seed, images, checkpoint epoch, steps) are unchanged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlm_rewards.config import changed_settings, load_job_config
from vlm_rewards.evaluation.metrics import bootstrap_ci
from vlm_rewards.generation.config import ALGORITHM_CONFIGS, BASE_GROUP, BenchmarkConfig, GRPOConfig
from vlm_rewards.generation.demo import BOOTSTRAP_RESAMPLES, SPLITS, check_run_prompts, evaluate_checkpoints
from vlm_rewards.generation.nft import run_nft
from vlm_rewards.generation.prompts import resolve_prompts
from vlm_rewards.generation.rwr import run_rwr
from vlm_rewards.generation.train import RESUME_MAY_CHANGE, checkpoints, run_grpo
from vlm_rewards.io import atomic_path, write_json
from vlm_rewards.tracking import Track, untracked

logger = logging.getLogger(__name__)

# algorithm -> its trainer, what `vlmr grpo`, `vlmr nft` and `vlmr rwr` call (its run config: ALGORITHM_CONFIGS)
ALGORITHMS: dict[str, Callable] = {"grpo": run_grpo, "nft": run_nft, "rwr": run_rwr}
FINISHED = "benchmark_run.json"  # in a run's folder: its settings, written after its last epoch
METRICS = ("accuracy", "fill")
BOOTSTRAP_SEED = 0
SPLIT_TITLES = {"grpo": "grpo (trained on)", "unseen": "unseen (never trained on)", "train": "train (the base's)"}


@dataclass(frozen=True)
class Run:
    """One training run of an arm."""

    arm: str
    algorithm: str  # a key of ALGORITHMS
    seed: int
    config: GRPOConfig  # the arm's config with this seed and output folder

    @property
    def name(self) -> str:
        return f"{self.arm}_seed{self.seed}"


def run_benchmark(config: BenchmarkConfig, track: Track | None = None) -> dict:
    """Train what is missing, evaluate what is missing, write the report; returns the report's path and the names
    of the runs trained and the evaluations made by this call."""
    track = track or untracked
    runs = load_runs(config)  # every run config read and checked before anything trains
    trained = [run.name for run in track(runs, "benchmark runs") if train(run, track)]
    base = runs[0].config  # every arm's base model (checked)
    jobs = [(BASE_GROUP, seed, base, (0, None), seed) for seed in config.base_seeds]
    jobs += [(run.arm, run.seed, run.config, last_checkpoint(run), config.eval_seed) for run in runs]
    evaluations = [evaluation(config, *job) for job in track(jobs, "benchmark evaluations")]
    rows = [row for row, _ in evaluations]
    summary = aggregate(rows)
    images = {run.arm: sampled_images(run.config) for run in runs}
    write_json(
        config.output_dir / "results.json",
        {"config": config.model_dump(mode="json"), "sampled_images": images, "summary": summary, "runs": rows},
    )
    plot_summary(rows, summary, config.output_dir / "benchmark.png")
    report = write_report(config, runs, rows, summary)
    return {"report": str(report), "trained": trained, "evaluated": [row["name"] for row, new in evaluations if new]}


def load_runs(config: BenchmarkConfig) -> list[Run]:
    """Every (arm, seed) run's config; refuses arms that differ in sampled images or base model."""
    arms = {name: load_job_config(ALGORITHM_CONFIGS[arm.algorithm], arm.config) for name, arm in config.arms.items()}
    for arm_config in arms.values():
        check_run_prompts(arm_config)
    check_equal_images(config, arms)
    check_same_base(config, arms)
    return [
        Run(name, arm.algorithm, seed, arms[name].model_copy(update=run_settings(config, name, seed)))
        for name, arm in config.arms.items()
        for seed in arm.seeds
    ]


def run_settings(config: BenchmarkConfig, arm: str, seed: int) -> dict:
    """What the benchmark sets in an arm's config for one run."""
    return {"seed": seed, "output_dir": config.output_dir / f"{arm}_seed{seed}", "resume": True}


def sampled_images(config: GRPOConfig) -> int:
    """Images a run samples in training: GRPO, NFT and RWR all draw batches_per_epoch batches of sample_batch_size
    images per epoch (`generation.train.sample_epoch`)."""
    train = config.train
    return train.epochs * train.batches_per_epoch * train.sample_batch_size


def check_equal_images(config: BenchmarkConfig, arms: dict[str, GRPOConfig]) -> None:
    """Refuse arms that sample different numbers of images in training: they would not compare at equal cost."""
    if len({sampled_images(arm_config) for arm_config in arms.values()}) > 1:
        found = "; ".join(
            f"{name} ({config.arms[name].config}): {c.train.epochs} epochs x {c.train.batches_per_epoch} batches x "
            f"{c.train.sample_batch_size} images = {sampled_images(c)}"
            for name, c in arms.items()
        )
        raise ValueError(
            f"arms sample different numbers of images in training: {found}; set train.epochs, "
            "train.batches_per_epoch and train.sample_batch_size so that every arm samples the same number"
        )


def check_same_base(config: BenchmarkConfig, arms: dict[str, GRPOConfig]) -> None:
    """Refuse arms with different base models or evaluation steps: the base is evaluated once for all of them."""

    def base(arm_config: GRPOConfig) -> dict:
        model = arm_config.model.model_dump(mode="json", exclude={"lora"})
        return {"model": model, "sampling": {"eval_num_steps": arm_config.sampling.eval_num_steps}}

    (first, first_config), *others = arms.items()
    for name, arm_config in others:
        changes = changed_settings(base(first_config), base(arm_config))
        if changes:
            raise ValueError(
                f"arms {first!r} ({config.arms[first].config}) and {name!r} ({config.arms[name].config}) differ in "
                f"their base model or evaluation steps: {'; '.join(changes)}; the base is evaluated once for every "
                "arm, so give them the same"
            )


def train(run: Run, track: Track) -> bool:
    """Train the run (resuming from its checkpoints) unless it is finished; whether it trained."""
    marker = run.config.output_dir / FINISHED
    settings = resolve_prompts(run.config).model_dump(mode="json")  # with the prompt files' contents
    if marker.is_file():
        saved = json.loads(marker.read_text())
        changes = changed_settings(saved, settings, RESUME_MAY_CHANGE)
        if changes:
            raise ValueError(
                f"{run.config.output_dir}: finished with other settings: {'; '.join(changes)}. Restore them, or "
                "use another output_dir"
            )
        if saved == settings:
            logger.info("%s: finished, kept", run.name)
            return False
    logger.info("%s: training", run.name)
    ALGORITHMS[run.algorithm](run.config, track)
    write_json(marker, settings)
    return True


def evaluation(
    config: BenchmarkConfig,
    group: str,
    seed: int,
    model_config: GRPOConfig,
    checkpoint: tuple[int, Path | None],
    noise_seed: int,
) -> tuple[dict, bool]:
    """(the row of a checkpoint, (0, None) being the base, on every split; whether it is new). The row saved in
    output_dir/evaluations/<group>_seed<seed> is kept while its settings match."""
    epoch = checkpoint[0]
    name = f"{group}_seed{seed}"
    images = config.images.model_dump()
    settings = {"noise_seed": noise_seed, "images": images, "epoch": epoch,
                "eval_num_steps": model_config.sampling.eval_num_steps}  # fmt: skip
    folder = config.output_dir / "evaluations" / name
    saved = folder / "evaluation.json"
    if saved.is_file():
        record = json.loads(saved.read_text())
        if record["settings"] == settings:
            return record["row"], False
    logger.info("%s: evaluating", name)
    [result] = evaluate_checkpoints(model_config, [checkpoint], folder, noise_seed, images)
    row = {"name": name, "arm": group, "seed": seed} | result | {"noise_seed": noise_seed}
    write_json(saved, {"settings": settings, "row": row})
    return row, True


def last_checkpoint(run: Run) -> tuple[int, Path]:
    """The run's checkpoint after its last epoch (the one reported)."""
    found = checkpoints(run.config.output_dir)
    if not found or found[-1][0] != run.config.train.epochs:
        raise ValueError(f"{run.config.output_dir}: no checkpoint at its last epoch {run.config.train.epochs}")
    return found[-1]


def summarize(values: list[float]) -> dict[str, float]:
    """Mean over seeds and its 95 % percentile-bootstrap interval over seeds."""
    low, high = bootstrap_ci(values, np.mean, BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED)
    return {"mean": float(np.mean(values)), "low": low, "high": high, "n": len(values)}


def aggregate(rows: list[dict]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """group (the base, each arm) -> split -> metric (accuracy, fill) -> its summary over the group's seeds."""
    groups = list(dict.fromkeys(row["arm"] for row in rows))
    return {
        group: {
            split: {
                metric: summarize([row[split][metric] for row in rows if row["arm"] == group]) for metric in METRICS
            }
            for split in SPLITS
        }
        for group in groups
    }


def plot_summary(rows: list[dict], summary: dict, path: Path) -> None:
    """Per split and metric: each seed's value (dots) and the mean with its interval over seeds, per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(summary)
    figure, axes = plt.subplots(len(METRICS), len(SPLITS), figsize=(10, 5.5), sharey="row", squeeze=False)
    for row_axes, metric in zip(axes, METRICS):
        for axis, split in zip(row_axes, SPLITS):
            for x, group in enumerate(groups):
                seeds = [row[split][metric] for row in rows if row["arm"] == group]
                axis.scatter([x] * len(seeds), seeds, s=10, alpha=0.4, color="grey")
                cell = summary[group][split][metric]
                error = [[cell["mean"] - cell["low"]], [cell["high"] - cell["mean"]]]
                axis.errorbar([x], [cell["mean"]], yerr=error, marker="o", capsize=4, color=f"C{x}")
            axis.set_xticks(range(len(groups)), groups)
            axis.set_title(SPLIT_TITLES[split], fontsize=9)
        row_axes[0].set_ylabel("gold accuracy" if metric == "accuracy" else "fill")
    figure.tight_layout()
    with atomic_path(path) as temporary:
        figure.savefig(temporary, format="png", dpi=100)
    plt.close(figure)


def write_report(config: BenchmarkConfig, runs: list[Run], rows: list[dict], summary: dict) -> Path:
    first = runs[0].config
    header = "| | seeds | " + " | ".join(SPLIT_TITLES[split] for split in SPLITS) + " |\n|" + " --- |" * 5

    def table(metric: str) -> str:
        lines = [
            f"| {group} | {summary[group][SPLITS[0]][metric]['n']} | "
            + " | ".join("{mean:.3f} [{low:.2f}, {high:.2f}]".format(**summary[group][split][metric])
                         for split in SPLITS) + " |"
            for group in summary
        ]  # fmt: skip
        return header + "\n" + "\n".join(lines)

    every = "\n".join(
        f"| {row['arm']} | {row['seed']} | {row['noise_seed']} | {row['epoch']} | "
        + " | ".join(f"{row[split]['accuracy']:.3f} | {row[split]['fill']:.3f}" for split in SPLITS) + " |"
        for row in rows
    )  # fmt: skip
    arms = "\n".join(
        f"- `{name}`: `vlmr {arm.algorithm}` on `{arm.config}`, training seeds {arm.seeds}"
        for name, arm in config.arms.items()
    )
    images = config.images
    report = f"""# Generation benchmark: {", ".join(config.arms)} and the base on the `six_pairs` holdout

`vlmr generation-benchmark` with the config in results.json. Base: `{first.model.trained_tiny}`. Every arm trains
on the `grpo` pairs and samples {sampled_images(first)} images per run in training (checked equal):

{arms}

Each run's last checkpoint (the EMA weights when the run keeps one; nothing selected on the evaluation splits) is
evaluated from noise seed {config.eval_seed}, the base from noise seeds
{config.base_seeds}: {first.sampling.eval_num_steps}-step ODE samples, {images.grpo} images per prompt on `grpo`,
{images.unseen} on `unseen` (15 prompts each) and {images.train} on `train` (60 prompts). Cells: the mean over
seeds [95 % percentile-bootstrap interval over seeds] — over evaluation noise seeds for the base (one model),
over training seeds for an arm (each run on one noise seed).

## Gold accuracy

{table("accuracy")}

## Fill (the share of the prompted shape's template its colour covers: 1 is a clean solid shape)

{table("fill")}

![per split: each seed (grey) and the mean with its interval](benchmark.png)

## Every evaluation

| group | seed | noise seed | epoch | {" | ".join(f"{split} accuracy | {split} fill" for split in SPLITS)} |
|{" --- |" * 10}
{every}

## Reading it

The base's interval measures evaluation noise alone; an arm's adds the spread between training seeds, so an arm
whose interval overlaps the base's has not been shown to differ from it. With 3 to 5 seeds a percentile bootstrap
is narrow and covers less than 95 %: read the intervals as the spread of these seeds, not as a test. The arms
compare at an equal number of sampled images, not at equal compute (NFT trains each image at several noise
levels, GRPO at its SDE window's steps, RWR at one).
"""
    path = config.output_dir / "report.md"
    with atomic_path(path) as temporary:
        temporary.write_text(report)
    return path
