"""The report of `make grpo-demo`: an RWR, GRPO or NFT run on the shipped base, evaluated on every prompt split.

For the base (epoch 0: the run's model without its LoRA) and each checkpoint the run kept, ODE samples of the
`six_pairs` holdout's three splits (`vlm_rewards.generation.shapes_t2i`) from fixed-seed noise, and the share the
gold verifier passes: `grpo` (the pairs the run trains on), `unseen` (pairs no one trains on: does it generalise?)
and `train` (the base's own prompts: does it regress?). The evaluation noise seed (`--seed`) is not the run's seed,
nor the seed the GRPO demo's settings were tuned with.

    python -m vlm_rewards.generation.demo runs/grpo_demo/rwr --output runs/grpo_demo

writes output/report.md (a table per evaluation and split with 95 % bootstrap intervals over prompts, each split's
change from the base with its paired interval, the curves and the image grids), results.json, curves.png and
grids/<split>_epoch_NNNN.png.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from vlm_rewards.data.synthetic import GOALS
from vlm_rewards.evaluation.metrics import bootstrap_ci
from vlm_rewards.generation.config import GRPOConfig
from vlm_rewards.generation.export import run_algorithm, run_config
from vlm_rewards.generation.prompts import load_prompts
from vlm_rewards.generation.shapes_eval import load_policy, logged_points, save_accuracy_figure
from vlm_rewards.generation.shapes_t2i import Verdict, check_pair_splits, prompts, sample_and_verify
from vlm_rewards.generation.train import checkpoints, save_image_grid
from vlm_rewards.io import atomic_path, write_json
from vlm_rewards.tracking import Track, untracked

SPLITS = ("grpo", "unseen", "train")
HOLDOUT = "six_pairs"
GRID_IMAGES = 2  # images per prompt in a grid, whose rows are colour-shape pairs (prompts: five regions each)
FULL_BENCHMARK = "configs/experiments/generation/six_pairs.yaml"
ALGORITHM_NAMES = {"grpo": "Flow-GRPO", "rwr": "Reward-weighted regression (RWR)", "nft": "DiffusionNFT"}
BOOTSTRAP_RESAMPLES = 2000


def check_run_prompts(config: GRPOConfig) -> None:
    """Refuse a run whose training prompts share a colour-shape pair with the unseen or the base's prompts."""
    trained = [record.text for record in load_prompts(config.train.prompts)]
    check_pair_splits({"the run's prompts": trained, "unseen": prompts("unseen", HOLDOUT),
                       "train": prompts("train", HOLDOUT)})  # fmt: skip


def split_accuracy(verdicts: list[Verdict], prompt_count: int, seed: int) -> dict[str, float | list[float]]:
    """Gold accuracy, its 95 % percentile-bootstrap interval over prompts, the mean fill and each prompt's accuracy."""
    per_prompt = np.array([verdict.correct for verdict in verdicts], dtype=float).reshape(prompt_count, -1).mean(1)
    low, high = bootstrap_ci(per_prompt, np.mean, BOOTSTRAP_RESAMPLES, seed)
    fill = float(np.mean([verdict.fill for verdict in verdicts]))
    return {"accuracy": float(per_prompt.mean()), "low": low, "high": high, "fill": fill,
            "per_prompt": per_prompt.tolist()}  # fmt: skip


def paired_change(first: dict, last: dict, seed: int) -> dict[str, float]:
    """The change in gold accuracy between two evaluations of one split and its 95 % bootstrap interval over
    prompts, paired: both drew the same noise for each prompt, so the per-prompt differences carry the change and
    leave out how hard each prompt is, which the per-evaluation intervals include."""
    differences = np.subtract(last["per_prompt"], first["per_prompt"])
    low, high = bootstrap_ci(differences, np.mean, BOOTSTRAP_RESAMPLES, seed)
    return {"change": float(differences.mean()), "low": low, "high": high}


def evaluate_run(
    run_dir: Path, output: Path, seed: int, images: dict[str, int], track: Track | None = None
) -> list[dict]:
    """One row per evaluation (the base, then each checkpoint): epoch -> split -> accuracy; grids under output."""
    config = run_config(run_dir)
    check_run_prompts(config)
    return evaluate_checkpoints(config, [(0, None), *checkpoints(run_dir)], output, seed, images, track)


def evaluate_checkpoints(
    config: GRPOConfig,
    evaluations: list[tuple[int, Path | None]],
    output: Path,
    seed: int,
    images: dict[str, int],
    track: Track | None = None,
) -> list[dict]:
    """One row per (epoch, checkpoint; None: the base without LoRA): epoch -> split -> accuracy; grids under output."""
    rows = []
    for epoch, checkpoint in (track or untracked)(evaluations, "evaluations"):
        generator = load_policy(config, checkpoint)
        row: dict = {"epoch": epoch}
        for split in SPLITS:
            prompt_list = prompts(split, HOLDOUT)
            samples, verdicts = sample_and_verify(
                generator, prompt_list, images[split], config.sampling.eval_num_steps, seed
            )
            row[split] = split_accuracy(verdicts, len(prompt_list), seed)
            shown = samples.reshape(len(prompt_list), images[split], *samples.shape[1:])[:, :GRID_IMAGES]
            save_image_grid(
                shown.reshape(-1, *samples.shape[1:]), output / "grids" / f"{split}_epoch_{epoch:04d}.png",
                columns=len(GOALS) * shown.shape[1], scale=3,
            )  # fmt: skip
        rows.append(row)
    return rows


def plot_curves(rows: list[dict], run_dir: Path, path: Path) -> None:
    """Gold accuracy per split per evaluation (with its interval), beside the training rollouts' gold accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    epochs = [row["epoch"] for row in rows]
    for split in SPLITS:
        values = np.array([[row[split][key] for key in ("accuracy", "low", "high")] for row in rows])
        errors = np.abs(values[:, 1:].T - values[:, 0])
        axes[0].errorbar(epochs, values[:, 0], yerr=errors, marker="o", markersize=3, capsize=2, label=split)
    points = logged_points(run_dir, "gold/accuracy/mean")
    if points:
        axes[1].plot(*zip(*points), marker="o", markersize=3, label="grpo (rollouts)")
    save_accuracy_figure(figure, axes, "fixed-seed ODE samples, per split", path)


def write_report(rows: list[dict], run_dir: Path, output: Path, seed: int, images: dict[str, int]) -> None:
    config = run_config(run_dir)
    cell = "{accuracy:.3f} [{low:.2f}, {high:.2f}]"
    table = "\n".join(
        f"| {row['epoch']} | " + " | ".join(cell.format(**row[split]) for split in SPLITS) + " |" for row in rows
    )
    first, last = rows[0], rows[-1]
    changes = {split: paired_change(first[split], last[split], seed) for split in SPLITS}
    change = ", ".join(f"{name} {c['change']:+.3f} [{c['low']:+.2f}, {c['high']:+.2f}]" for name, c in changes.items())
    train = config.train
    grids = "\n".join(
        f"| {split} | ![](grids/{split}_epoch_{first['epoch']:04d}.png) | "
        f"![](grids/{split}_epoch_{last['epoch']:04d}.png) |"
        for split in SPLITS
    )
    sampled = train.batches_per_epoch * train.sample_batch_size
    algorithm = run_algorithm(run_dir)
    report = f"""# {ALGORITHM_NAMES[algorithm]} from the shipped base on the `grpo` pairs, evaluated on every split

Run: `{run_dir}` (`vlmr {algorithm}`: {train.epochs} epochs of {sampled} images, groups of {train.group_size},
lr {train.lr}, KL β {train.kl_beta}, EMA {train.ema_decay}). Base: `{config.model.trained_tiny}`. Evaluation:
{config.sampling.eval_num_steps}-step ODE samples from noise seed {seed} (the run trains with seed {config.seed}),
{images["grpo"]} images per prompt on `grpo` and `unseen` (15 prompts each), {images["train"]} on `train`
(60 prompts); epoch 0 is the base. Cells: gold accuracy [95 % bootstrap interval over prompts].

| epoch | grpo (trained on) | unseen (never trained on) | train (the base's prompts) |
| --- | --- | --- | --- |
{table}

Change from the base to the last evaluation, paired over prompts (the same noise for each prompt in both)
[95 % bootstrap interval]: {change}.

![gold accuracy per split](curves.png)

Samples of the base (left) and of the last evaluation (right), the same noise: a row per colour-shape pair, its five
regions (top left, top right, bottom left, bottom right, center) side by side, {GRID_IMAGES} images each:

| split | base | epoch {last["epoch"]} |
| --- | --- | --- |
{grids}

## What this budget can and cannot show

It can show the direction on one training seed and one evaluation noise seed: whether `vlmr {algorithm}` with
its trained reward raises gold accuracy on the pairs it samples, whether that carries over to pairs it never
samples, and whether the base's own prompts hold. It cannot give an effect size: one run, {len(rows)} evaluations
of {15 * images["grpo"]} images per held-out split, so a change whose paired interval holds 0 is noise. The
evidence over seeds is the full benchmark, `vlmr generation-benchmark {FULL_BENCHMARK}`: GRPO, DiffusionNFT and RWR
on the same prompts at the same number of sampled images, every split over training seeds.
"""
    with atomic_path(output / "report.md") as temporary:
        temporary.write_text(report)


app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="a vlmr rwr, grpo or nft run on the six_pairs base")],
    output: Annotated[Path, typer.Option(help="the report's folder")] = Path("runs/grpo_demo"),
    seed: Annotated[int, typer.Option(help="the evaluation noise seed")] = 1000,
    images: Annotated[int, typer.Option(help="images per prompt on the grpo and unseen splits")] = 24,
    train_images: Annotated[int, typer.Option(help="images per prompt on the base's train split")] = 2,
) -> None:
    """Evaluate the base and every checkpoint of the run on each split; write the report."""
    from vlm_rewards.cli import tqdm_track

    counts = {"grpo": images, "unseen": images, "train": train_images}
    rows = evaluate_run(run_dir, output, seed, counts, tqdm_track)
    write_json(output / "results.json", {"run": str(run_dir), "seed": seed, "images": counts, "evaluations": rows})
    plot_curves(rows, run_dir, output / "curves.png")
    write_report(rows, run_dir, output, seed, counts)
    print(json.dumps({split: [row[split]["accuracy"] for row in rows] for split in SPLITS}))


if __name__ == "__main__":
    app()
