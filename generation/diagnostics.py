"""Is a GRPO batch big enough to carry a signal? The agreement of independent policy gradients.

    python -m vlm_rewards.generation.diagnostics gradient-agreement configs/grpo/shapes_verifier.yaml --epochs 4 \
        train.group_size=16 train.sample_batch_size=48

From the config's starting policy (nothing is updated), `--epochs` independent epochs are sampled as
`vlmr grpo` samples them; each gives the policy gradient of its whole batch (every kept sample, every
recorded step). Independent gradients that point the same way (cosine well above 0) measure a
direction; cosines scattered around 0 mean that at this batch size the estimate is mostly noise, and
Adam's fixed-size steps then random-walk the weights whatever the learning rate. For unbiased
estimates with signal s and per-sample noise n, the expected cosine is about s² / (s² + n²/N) for N
images per gradient, so one measurement says how many images a step would need.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import typer
from accelerate import Accelerator

from vlm_rewards.config import load_job_config
from vlm_rewards.generation.config import GRPOConfig
from vlm_rewards.generation.rewards import RewardSet
from vlm_rewards.generation.train import add_lora, build_generator, build_rewards, sample_epoch, step_loss


def epoch_gradient(
    accelerator: Accelerator, generator, denoiser: torch.nn.Module, rewards: RewardSet, config: GRPOConfig, epoch: int
) -> torch.Tensor:
    """The flattened LoRA gradient of one epoch's mean PPO-clip loss (at ratio 1: the policy gradient)."""
    rollout, advantages, _ = sample_epoch(accelerator, generator, denoiser, rewards, config, epoch)
    generator.scheduler.set_timesteps(config.sampling.num_steps, device=accelerator.device)
    kept = np.flatnonzero(advantages.keep)
    denoiser.zero_grad()
    for start in range(0, len(kept), config.train.train_batch_size):
        index = kept[start : start + config.train.train_batch_size]
        minibatch = rollout.select(index)
        minibatch_advantages = torch.tensor(advantages.values[index], dtype=torch.float32, device=accelerator.device)
        for k in range(minibatch.latents.shape[1]):
            loss, _ = step_loss(accelerator, generator, denoiser, minibatch, k, minibatch_advantages, config)
            (loss * len(index) / len(kept)).backward()
    return torch.cat([p.grad.detach().flatten() for p in denoiser.parameters() if p.grad is not None]).clone()


def gradient_agreement(config: GRPOConfig, epochs: int) -> dict:
    """Pairwise cosines of `epochs` independent epoch gradients from the starting policy."""
    accelerator = Accelerator()
    generator = build_generator(config.model)
    generator.denoiser = add_lora(generator.denoiser, config.model).eval()
    rewards = build_rewards(config)
    gradients = [epoch_gradient(accelerator, generator, generator.denoiser, rewards, config, e) for e in range(epochs)]
    cosines = [
        torch.nn.functional.cosine_similarity(a, b, dim=0).item() for a, b in itertools.combinations(gradients, 2)
    ]
    images = config.train.sample_batch_size * config.train.batches_per_epoch
    return {"images_per_gradient": images, "cosines": cosines, "mean_cosine": float(np.mean(cosines))}


app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)


@app.command("gradient-agreement")
def gradient_agreement_command(
    config_path: Annotated[Path, typer.Argument(help="a GRPO config")],
    overrides: Annotated[list[str] | None, typer.Argument(help="dotted.key=value overrides")] = None,
    epochs: Annotated[int, typer.Option(min=2, help="independent epochs (gradients) to compare")] = 4,
) -> None:
    config = load_job_config(GRPOConfig, config_path, overrides or [])
    print(json.dumps({"config": str(config_path), "overrides": overrides or []} | gradient_agreement(config, epochs)))


@app.callback()
def main() -> None:
    """GRPO diagnostics."""


if __name__ == "__main__":
    app()
