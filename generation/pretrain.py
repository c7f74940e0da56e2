"""`vlmr pretrain-generator`: a tiny text-to-image flow-matching model trained from scratch on ShapesWorld.

The base model GRPO then fine-tunes (`vlm_rewards.generation.shapes_t2i`): a small SD3 (or Flux) transformer in
pixel space and its `TinyTextEncoder`, trained together with the rectified-flow loss on ground-truth
renders of the benchmark's *train* prompts only, so held-out combinations are never seen. x_t =
(1 − σ)·x0 + σ·ε with σ drawn logit-normal (SD3's choice), and the model regresses the velocity ε − x0.
The model folder (`output_dir/model`) is what a GRPO config names as `model.trained_tiny`.

`ship` turns a finished run into the shipped base (data/models/shapes-base): the model in fp16
(`export.export_base`), its holdout's prompt splits as text files, and a model card with the weights' sha256,
the commands and seeds, the wall time and the gold accuracy of the shipped weights per split:

    python -m vlm_rewards.generation.pretrain ship configs/grpo/shapes_base_six_pairs.yaml \
        --output data/models/shapes-base
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import typer

from vlm_rewards.config import dump_config, load_job_config
from vlm_rewards.fingerprint import sha256_file
from vlm_rewards.generation.config import ModelSettings, PretrainConfig
from vlm_rewards.generation.ema import ParameterEMA
from vlm_rewards.generation.export import export_base
from vlm_rewards.generation.models import (
    ImageGenerator,
    PromptEmbeddings,
    load_tiny_generator,
    predict,
    save_tiny_generator,
)
from vlm_rewards.generation.shapes_t2i import gold_accuracy, prompts, render
from vlm_rewards.generation.train import build_generator, schedule_factor
from vlm_rewards.io import atomic_path

logger = logging.getLogger(__name__)


def run_pretrain(config: PretrainConfig, track: Callable[..., Iterable] | None = None) -> dict[str, list]:
    """Train and save the model; returns the history (metric -> [(step, value)])."""
    torch.manual_seed(config.seed)
    generator = build_generator(ModelSettings(family=config.family, tiny=config.model))
    text_encoder = generator.text_encoder.requires_grad_(True)
    parameters = [*generator.denoiser.parameters(), *text_encoder.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(config, step))
    ema = ParameterEMA(parameters, config.ema_decay) if config.ema_decay else None
    rng = np.random.default_rng(config.seed)
    noise_rng = torch.Generator().manual_seed(config.seed)
    train_prompts = prompts(config.train_split, config.holdout)
    history: dict[str, list] = {}
    (config.output_dir / "metrics.jsonl").unlink(missing_ok=True)  # a fresh run, not a resumed one
    start = time.perf_counter()
    steps = range(1, config.steps + 1)
    for step in track(steps, "pretrain steps") if track else steps:
        batch = [str(prompt) for prompt in rng.choice(train_prompts, size=config.batch_size)]
        images = np.stack([render(prompt, rng, config.model.resolution) for prompt in batch])
        loss = flow_matching_loss(generator, text_encoder(batch), images, noise_rng)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        schedule.step()
        if ema is not None:
            ema.update()
        logs = {"loss": loss.item(), "lr": schedule.get_last_lr()[0], "time_s": time.perf_counter() - start}
        if step == config.steps or (config.eval_every and step % config.eval_every == 0):
            with ema.applied() if ema is not None else nullcontext():
                logs |= evaluate_splits(generator, config)
        record(config.output_dir, history, logs, step)
    if ema is not None:
        ema.apply()
    save_tiny_generator(generator, config.output_dir / "model")
    return history


def lr_factor(config: PretrainConfig, step: int) -> float:
    """The learning rate over `lr` after `step` optimizer steps: linear warmup, then constant or cosine to 0."""
    warmup = min(1.0, (step + 1) / config.warmup_steps)
    return warmup * schedule_factor(config.lr_schedule, step, config.steps)


def flow_matching_loss(
    generator: ImageGenerator,
    embeddings: PromptEmbeddings,
    images: np.ndarray,
    noise_rng: torch.Generator,
    weights: torch.Tensor | None = None,
    denoiser: torch.nn.Module | None = None,
) -> torch.Tensor:
    """Rectified-flow velocity regression on (B, H, W, 3) uint8 images, optionally weighted per image.

    `denoiser` defaults to the generator's (pass a LoRA-wrapped one to train only its adapter).
    """
    clean = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1
    noise = torch.randn(clean.shape, generator=noise_rng)
    sigma = torch.sigmoid(torch.randn(len(clean), generator=noise_rng)).reshape(-1, 1, 1, 1)
    noisy = (1 - sigma) * clean + sigma * noise
    timestep = sigma.flatten() * generator.scheduler.config.num_train_timesteps
    velocity = predict(denoiser or generator.denoiser, generator.family, noisy, timestep, embeddings)
    per_image = (velocity - (noise - clean)).pow(2).flatten(1).mean(dim=1)
    return per_image.mean() if weights is None else (weights * per_image).mean()


def evaluated_splits(config: PretrainConfig) -> tuple[str, ...]:
    """The splits a base is evaluated on: its training prompts and what its holdout holds out."""
    return ("train", "grpo", "unseen") if config.holdout == "six_pairs" else ("train", "held_out")


def evaluate_splits(generator: ImageGenerator, config: PretrainConfig) -> dict[str, float]:
    generator.denoiser.eval()
    logs = {}
    for split in evaluated_splits(config):
        results = gold_accuracy(
            generator, prompts(split, config.holdout), config.eval_images_per_prompt, config.eval_num_steps, config.seed
        )
        logs |= {f"eval/{split}/{name}": value for name, value in results.items()}
    generator.denoiser.train()
    return logs


def record(output_dir: Path, history: dict, logs: dict[str, float], step: int) -> None:
    for name, value in logs.items():
        history.setdefault(name, []).append((step, value))
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps({"step": step, **logs}) + "\n")
    if any(name.startswith("eval/") for name in logs):
        logger.info("step %d: %s", step, ", ".join(f"{k}={v:.4g}" for k, v in logs.items()))


# ----------------------------------------------------------------------------- shipping a base

SHIP_EVAL_SEEDS = (100, 101, 102, 103, 104)  # the card's evaluation noise: none of them a training or demo seed
SHIP_IMAGES_PER_PROMPT = 4
SPLIT_ROLES = {
    "train": "the base trains on them (GRPO's regression check)",
    "held_out": "held out of base training",
    "grpo": "held out of base training; GRPO trains on them",
    "unseen": "held out of base training, never trained on (the generalisation test)",
}
app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def main() -> None:
    """Tools for a pretrained ShapesWorld base (the training itself is `vlmr pretrain-generator`)."""


@app.command()
def ship(
    config_path: Annotated[Path, typer.Argument(help="the pretrain config of the finished run")],
    output: Annotated[Path, typer.Option(help="the shipped folder (replaced)")] = Path("data/models/shapes-base"),
    dtype: Annotated[str, typer.Option(help="float16 | bfloat16")] = "float16",
) -> None:
    """The run's model in half precision, its prompt splits and its model card, under `output`."""
    config = load_job_config(PretrainConfig, config_path)
    export_base(config.output_dir / "model", output, dtype)
    write_prompt_splits(config, output / "prompts")
    accuracies = seed_accuracies(load_tiny_generator(output), config)
    write_base_card(config, config_path, output, dtype, accuracies)
    print(json.dumps(accuracies))


def write_prompt_splits(config: PretrainConfig, folder: Path) -> None:
    """prompts/<split>.txt for each evaluated split: the prompt files a GRPO config names."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in evaluated_splits(config):
        header = f"# prompts('{split}', '{config.holdout}') of vlm_rewards.generation.shapes_t2i\n"
        with atomic_path(folder / f"{split}.txt") as temporary:
            temporary.write_text(header + "\n".join(prompts(split, config.holdout)) + "\n")


def seed_accuracies(generator: ImageGenerator, config: PretrainConfig) -> dict[str, list[float]]:
    """split -> gold accuracy under each of `SHIP_EVAL_SEEDS` (ODE samples, fixed-seed noise)."""
    generator.denoiser.eval()
    return {
        split: [
            gold_accuracy(generator, prompts(split, config.holdout), SHIP_IMAGES_PER_PROMPT, config.eval_num_steps,
                          seed)["accuracy"]
            for seed in SHIP_EVAL_SEEDS
        ]
        for split in evaluated_splits(config)
    }  # fmt: skip


def write_base_card(
    config: PretrainConfig, config_path: Path, output: Path, dtype: str, accuracies: dict[str, list[float]]
) -> None:
    rows = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    weights = sorted(output.rglob("*.safetensors"))
    table = "\n".join(
        f"| {split} | {len(prompts(split, config.holdout))} | {SPLIT_ROLES[split]} | {np.mean(values):.3f} | "
        f"{min(values):.3f}-{max(values):.3f} |"
        for split, values in accuracies.items()
    )
    size = sum(path.stat().st_size for path in output.rglob("*") if path.is_file())
    card = f"""# ShapesWorld base generator ({config.holdout} holdout)

A tiny text-to-image flow-matching model ({config.family}: SD3 transformer in 32 px pixel space, its own word-level
text encoder), trained from scratch on ShapesWorld renders (`vlm_rewards.generation.shapes_t2i`): the starting point
of the generation benchmark, as SD3.5 or Flux is for a real one. Weights in {dtype}; they load in fp32:

```python
from vlm_rewards.generation.models import load_tiny_generator

generator = load_tiny_generator("{output}")
```

or in a GRPO config, `model: {{family: {config.family}, trained_tiny: {output}}}` (a path relative to the repository
root, where `vlmr` runs).

## Prompt splits and gold accuracy

`prompts/<split>.txt` holds each split's prompts (no colour-shape pair is in two splits:
`shapes_t2i.check_pair_splits`). Gold accuracy is the share of ODE samples ({config.eval_num_steps} steps,
{SHIP_IMAGES_PER_PROMPT} images per prompt) that the ShapesWorld verifier passes (colour present, in its region, the
prompted shape, no clutter), measured on these weights by the `ship` command below for each evaluation noise seed:

| split | prompts | what | mean over {len(SHIP_EVAL_SEEDS)} seeds | min-max |
| --- | --- | --- | --- | --- |
{table}

## How it was built

```bash
vlmr pretrain-generator {config_path}
python -m vlm_rewards.generation.pretrain ship {config_path} --output {output} --dtype {dtype}
```

- Seeds: training batches and noise {config.seed}, initial weights {config.model.seed}; the card's evaluation
  noise seeds {list(SHIP_EVAL_SEEDS)}.
- Wall time: {rows[-1]["time_s"] / 60:.1f} min for {config.steps} steps, evaluations included
  (`time_s` of {config.output_dir}/metrics.jsonl, on the machine of the run).
- Weights ({size / 2**20:.2f} MiB in all):
{chr(10).join(f"  - `{path.relative_to(output)}` sha256 `{sha256_file(path)}`" for path in weights)}

Config:

```yaml
{dump_config(config).strip()}
```

Limits: 32 px images of one object on a grey table, prompts of one grammar; the verifier passes holed or striped
shapes (its `fill` diagnostic flags them).
"""
    with atomic_path(output / "README.md") as temporary:
        temporary.write_text(card)


if __name__ == "__main__":
    app()
