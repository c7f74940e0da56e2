"""`vlmr pretrain-generator`: a tiny text-to-image flow-matching model trained from scratch on ShapesWorld.

The base model GRPO then fine-tunes (`vlm_rewards.generation.shapes_t2i`): a small SD3 (or Flux) transformer in
pixel space and its `TinyTextEncoder`, trained together with the rectified-flow loss on ground-truth
renders of the benchmark's *train* prompts only, so held-out combinations are never seen. x_t =
(1 − σ)·x0 + σ·ε with σ drawn logit-normal (SD3's choice), and the model regresses the velocity ε − x0.
The model folder (`output_dir/model`) is what a GRPO config names as `model.trained_tiny`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch

from vlm_rewards.generation.config import ModelSettings, PretrainConfig
from vlm_rewards.generation.models import ImageGenerator, PromptEmbeddings, predict, save_tiny_generator
from vlm_rewards.generation.shapes_t2i import gold_accuracy, prompts, render
from vlm_rewards.generation.train import build_generator

logger = logging.getLogger(__name__)


def run_pretrain(config: PretrainConfig, track: Callable[..., Iterable] | None = None) -> dict[str, list]:
    """Train and save the model; returns the history (metric -> [(step, value)])."""
    torch.manual_seed(config.seed)
    generator = build_generator(ModelSettings(family=config.family, tiny=config.model))
    text_encoder = generator.text_encoder.requires_grad_(True)
    parameters = [*generator.denoiser.parameters(), *text_encoder.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / config.warmup_steps))
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
        warmup.step()
        logs = {"loss": loss.item(), "time_s": time.perf_counter() - start}
        if step == config.steps or (config.eval_every and step % config.eval_every == 0):
            logs |= evaluate_splits(generator, config)
        record(config.output_dir, history, logs, step)
    save_tiny_generator(generator, config.output_dir / "model")
    return history


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


def evaluate_splits(generator: ImageGenerator, config: PretrainConfig) -> dict[str, float]:
    generator.denoiser.eval()
    logs = {}
    for split in ("train", "held_out"):
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
