"""Gold accuracy of a ShapesWorld generator on a prompt split, alone or as best-of-N; GRPO curves.

The generator is a GRPO config's model, with the LoRA of one of its run's checkpoints or (no
`--checkpoint`) the base model itself. Images are ODE samples from fixed-seed noise, as GRPO's own
evaluation draws them. Best-of-N samples `--samples` images per prompt, splits them into disjoint
groups of N, keeps each group's image with the highest soft verifier score and reports the gold
accuracy of the kept ones: the inference-time baseline GRPO is compared with at equal sampled images.
It also reports the share of all the images passing each of the verifier's checks, overall and per
colour–shape pair (which check fails, and for which combinations).

    python -m vlm_rewards.generation.shapes_eval accuracy configs/grpo/shapes_verifier.yaml \
        --split held_out --best-of 1,4,16
    python -m vlm_rewards.generation.shapes_eval accuracy configs/grpo/shapes_verifier_pairs.yaml \
        --holdout pairs --samples 8
    python -m vlm_rewards.generation.shapes_eval accuracy configs/grpo/shapes_six_pairs.yaml \
        --holdout six_pairs --split unseen --samples 8
    python -m vlm_rewards.generation.shapes_eval accuracy configs/grpo/shapes_verifier.yaml \
        --checkpoint runs/shapes_verifier/checkpoints/epoch_000030 --split train
    python -m vlm_rewards.generation.shapes_eval curves runs/shapes_verifier --output docs/results/img/curves.png

`pairs` writes a pair dataset (data/README.md) of the generator's own images, the verifier's preference
as the label: the training set of a learned proxy reward that has seen the policy's kind of images.

    python -m vlm_rewards.generation.shapes_eval pairs configs/grpo/shapes_verifier_pairs.yaml \
        --output runs/generated_pairs
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import typer
from safetensors.torch import load_file

from vlm_rewards.config import load_job_config
from vlm_rewards.data.episodes import PreferencePair, write_pairs
from vlm_rewards.generation.config import GRPOConfig
from vlm_rewards.generation.ema import EMA_STATE, ParameterEMA
from vlm_rewards.generation.models import ImageGenerator
from vlm_rewards.generation.shapes_t2i import (
    ShapePrompt,
    Verdict,
    check_rates,
    prompts,
    sample_and_verify,
    sample_verdicts,
)
from vlm_rewards.generation.train import add_lora, build_generator, lora_parameters


def load_policy(config: GRPOConfig, checkpoint: Path | None) -> ImageGenerator:
    """The config's generator with the LoRA weights of a `vlmr grpo` checkpoint (or its `best` folder): the
    weights the run evaluated, so for a run with `ema_decay` the checkpoint's EMA, not the optimizer's weights.
    """
    generator = build_generator(config.model)
    if checkpoint is not None:
        generator.denoiser = add_lora(generator.denoiser, config.model)
        generator.denoiser.load_state_dict(load_file(checkpoint / "model.safetensors"))
        if config.train.ema_decay and (checkpoint / EMA_STATE).exists():
            ema = ParameterEMA(lora_parameters(generator.denoiser))
            ema.load_state_dict(torch.load(checkpoint / EMA_STATE, map_location="cpu", weights_only=True))
            ema.apply()
    generator.denoiser.eval()
    return generator


def best_of_n(verdicts: list[list[Verdict]], ns: list[int]) -> dict[int, float]:
    """N -> gold accuracy of the best-scoring image of each disjoint group of N of a prompt's images."""
    scores = np.array([[verdict.score for verdict in row] for row in verdicts])
    correct = np.array([[verdict.correct for verdict in row] for row in verdicts])
    accuracies = {}
    for n in ns:
        groups = scores.shape[1] // n
        group_scores = scores[:, : groups * n].reshape(len(scores), groups, n)
        group_correct = correct[:, : groups * n].reshape(len(scores), groups, n)
        picked = np.take_along_axis(group_correct, group_scores.argmax(axis=-1)[..., None], axis=-1)
        accuracies[n] = float(picked.mean())
    return accuracies


def pass_rates(verdicts: list[list[Verdict]], prompt_list: list[str]) -> dict[str, dict[str, float]]:
    """The share of images passing each check, over all prompts and per colour–shape pair: what fails where."""
    groups: dict[str, list[Verdict]] = {"all": [v for row in verdicts for v in row]}
    for prompt, row in zip(prompt_list, verdicts):
        parsed = ShapePrompt.parse(prompt)
        groups.setdefault(f"{parsed.color} {parsed.shape}", []).extend(row)
    return {name: check_rates(group) for name, group in groups.items()}


app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)


@app.command()
def accuracy(
    config_path: Annotated[Path, typer.Argument(help="the GRPO config (model and sampling settings)")],
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted.key=value overrides")] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="a checkpoint folder of its run; none: the base")] = None,
    split: Annotated[str, typer.Option(help="train | held_out | all; grpo | unseen (six_pairs)")] = "held_out",
    holdout: Annotated[str, typer.Option(help="triples | pairs | six_pairs: the holdout")] = "triples",
    samples: Annotated[int, typer.Option(help="images per prompt")] = 4,
    best_of: Annotated[str, typer.Option(help="comma-separated N; each must divide --samples")] = "1",
    seed: int = 0,
    output: Annotated[Path | None, typer.Option(help="also write the result as JSON here")] = None,
) -> None:
    config = load_job_config(GRPOConfig, config_path, overrides or [])
    generator = load_policy(config, checkpoint)
    prompt_list = prompts(split, holdout)
    verdicts = sample_verdicts(generator, prompt_list, samples, config.sampling.eval_num_steps, seed)
    accuracies = best_of_n(verdicts, [int(n) for n in best_of.split(",")])
    result = {
        "config": str(config_path), "overrides": overrides or [], "checkpoint": str(checkpoint), "split": split,
        "holdout": holdout, "samples": samples, "seed": seed, "accuracy_best_of": accuracies,
        "pass_rates": pass_rates(verdicts, prompt_list),
    }  # fmt: skip
    print(json.dumps(result))
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=1))


@app.command()
def pairs(
    config_path: Annotated[Path, typer.Argument(help="the GRPO config (model and sampling settings)")],
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted.key=value overrides")] = None,
    output: Annotated[Path, typer.Option(help="the new pair folder")] = Path("runs/generated_pairs"),
    checkpoint: Annotated[Path | None, typer.Option(help="a checkpoint folder of its run; none: the base")] = None,
    split: Annotated[str, typer.Option(help="train | held_out | all; grpo | unseen (six_pairs)")] = "all",
    holdout: Annotated[str, typer.Option(help="triples | pairs | six_pairs: the holdout")] = "triples",
    samples: Annotated[int, typer.Option(help="images per prompt")] = 16,
    pairs_per_prompt: Annotated[int, typer.Option(help="at most this many pairs of a prompt's images")] = 16,
    seed: int = 0,
) -> None:
    """Pairs of one prompt's ODE samples with different verifier scores: the higher one chosen, margin = the
    score difference. Equal scores carry no preference and are not paired."""
    config = load_job_config(GRPOConfig, config_path, overrides or [])
    generator = load_policy(config, checkpoint)
    prompt_list = prompts(split, holdout)
    images, verdicts = sample_and_verify(generator, prompt_list, samples, config.sampling.eval_num_steps, seed)
    scores = np.array([verdict.score for verdict in verdicts])
    rng = np.random.default_rng(seed)
    found = []
    for index, prompt in enumerate(prompt_list):
        images_of_prompt = range(index * samples, (index + 1) * samples)
        candidates = [(a, b) for a, b in itertools.combinations(images_of_prompt, 2) if scores[a] != scores[b]]
        for choice in rng.permutation(len(candidates))[:pairs_per_prompt]:
            better, worse = sorted(candidates[choice], key=lambda i: -scores[i])
            found.append((prompt, better, worse))
    dataset = write_pairs(
        output,
        (
            PreferencePair(pair_id, prompt, images[better][None], images[worse][None], scores[better] - scores[worse])
            for pair_id, (prompt, better, worse) in enumerate(found)
        ),
        generator={"config": str(config_path), "overrides": overrides or [], "checkpoint": str(checkpoint),
                   "split": split, "holdout": holdout, "samples": samples, "seed": seed},
    )  # fmt: skip
    print(json.dumps({"output": str(output), "pairs": len(dataset), "prompts": len(prompt_list)}))


@app.command()
def curves(
    runs: Annotated[list[Path], typer.Argument(help="GRPO run folders (their metrics.jsonl)")],
    output: Annotated[Path, typer.Option(help="the PNG to write")],
) -> None:
    """Gold accuracy of the fixed evaluation samples and of the training rollouts, per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
    for run in runs:
        for axis, key in zip(axes, ("eval/gold/accuracy", "gold/accuracy/mean")):
            axis.plot(*zip(*logged_points(run, key)), marker="o", markersize=3, label=run.name)
    save_accuracy_figure(figure, axes, "eval prompts, fixed-seed ODE samples", output)


def logged_points(run: Path, key: str) -> list[tuple[int, float]]:
    """(epoch, value) of every epoch of a GRPO run's metrics.jsonl that logged `key`."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(row["epoch"], row[key]) for row in rows if row.get(key) is not None]


def save_accuracy_figure(figure, axes, eval_title: str, path: Path) -> None:
    """Titles the (evaluation, training rollouts) gold-accuracy axes and writes the figure to `path`."""
    import matplotlib.pyplot as plt

    axes[0].set(title=eval_title, xlabel="epoch", ylabel="gold accuracy")
    axes[1].set(title="training rollouts (SDE)", xlabel="epoch")
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    app()
