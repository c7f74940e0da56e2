"""`vlmr rwr`: reward-weighted regression, the fine-tuning baseline GRPO is compared with.

An RWR run reads a GRPO config and draws exactly the images GRPO would per epoch (`train.prompts`,
`group_size`, `sample_batch_size`, `batches_per_epoch`, `epochs`), so the two compare at an equal
number of sampled images. Its policy is the deterministic ODE sampler from fresh noise (each image of a
group its own noise), so the SDE settings do not apply. Each epoch it scores the images with the
trained rewards, turns them into the same per-prompt advantages A as GRPO, and fits the LoRA with the
flow-matching loss on its own samples weighted by exp(A / temperature) (normalised to mean 1): a
supervised step towards the better samples instead of a policy gradient. Evaluation, checkpoints and
resume are GRPO's (`vlm_rewards.generation.train.run_grpo` with this epoch step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from accelerate import Accelerator

from vlm_rewards.generation.config import RWRConfig
from vlm_rewards.generation.ema import ParameterEMA
from vlm_rewards.generation.models import ImageGenerator
from vlm_rewards.generation.pretrain import flow_matching_loss
from vlm_rewards.generation.rewards import RewardSet
from vlm_rewards.generation.sampling import Rollout
from vlm_rewards.generation.train import derived_seed, minibatches, run_grpo, sample_epoch


def run_rwr(config: RWRConfig, track: Callable[..., Iterable] | None = None) -> dict[str, list]:
    """Train; returns the history (metric -> [(epoch, value)]), as `run_grpo` does."""
    if config.mixed_precision != "no" or config.sampling.guidance_scale > 1:
        raise ValueError("rwr: mixed precision and CFG are not supported; set mixed_precision: no, guidance_scale: 1")
    # the ODE sampler, each image from its own noise; no SDE window, so no gradient accumulation either
    ode = config.sampling.model_copy(
        update={"noise_level": 0.0, "same_noise_in_group": False, "window_size": 1, "window_starts": None}
    )
    return run_grpo(config.model_copy(update={"sampling": ode}), track, epoch_step=rwr_epoch)


def rwr_epoch(
    accelerator: Accelerator,
    generator: ImageGenerator,
    denoiser: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rewards: RewardSet,
    config: RWRConfig,
    epoch: int,
    ema: ParameterEMA | None = None,
) -> dict[str, float]:
    """Sample (by ODE: `run_rwr` sets the sampler), score, weight by exp(advantage / temperature), fit the
    weighted flow-matching loss."""
    rollout, advantages, logs = sample_epoch(accelerator, generator, denoiser, rewards, config, epoch)
    weights = np.exp(advantages.values / config.temperature)
    weights /= weights.mean()
    logs |= {"rwr/max_weight": float(weights.max())}
    return logs | fit_weighted(accelerator, generator, denoiser, optimizer, rollout, weights, config, epoch, ema)


def fit_weighted(
    accelerator: Accelerator,
    generator: ImageGenerator,
    denoiser: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    weights: np.ndarray,
    config: RWRConfig,
    epoch: int,
    ema: ParameterEMA | None,
) -> dict[str, float]:
    """`inner_epochs` passes of minibatches of `train_batch_size` over the epoch's images."""
    rng = np.random.default_rng(derived_seed(config.seed, epoch, "shuffle", accelerator.process_index))
    noise_rng = torch.Generator().manual_seed(derived_seed(config.seed, epoch, "noise", accelerator.process_index))
    losses = []
    for index, minibatch in minibatches(rollout, np.arange(len(rollout)), config.train, rng):
        minibatch_weights = torch.tensor(weights[index], dtype=torch.float32)
        loss = flow_matching_loss(
            generator, minibatch.embeddings, minibatch.images, noise_rng, minibatch_weights, denoiser
        )
        optimizer.zero_grad()
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(denoiser.parameters(), config.train.grad_clip)
        optimizer.step()
        if ema is not None:
            ema.update()
        losses.append(loss.item())
    return {"train/weighted_loss": float(np.mean(losses))}
