"""`vlmr nft`: DiffusionNFT (Zheng et al. 2025, arXiv 2509.16117), online RL on the forward process.

An NFT run reads a GRPO config plus an `nft` section, and samples, scores and evaluates exactly as GRPO does
(the same prompts, rewards, sampler and sampling budget; `train.advantage: pairwise` too). Each epoch:

1. Sample the groups with the sampling ("old") policy π_old, with any of the harness's samplers (ODE when
   `sampling.noise_level` is 0, as the reference trains, or the SDE/CPS window); only the clean final latents
   x0 are kept for training, no log-probs. Training is CFG-free: `sampling.guidance_scale` must be 1.
2. Score them; the group advantages A (GRPO's, `train.advantage_clip` c) become the optimality probability
   r = clip(A, −c, c) / (2c) + 1/2 in [0, 1].
3. Flow matching on the forward process: each sample is noised at `nft.timesteps_per_sample` noise levels σ of
   the sampling schedule, x_σ = (1 − σ)·x0 + σ·ε, and with v_θ the trained model's velocity and v_old π_old's,
   the implicit positive and negative policies v+ = (1 − β)·v_old + β·v_θ and v− = (1 + β)·v_old − β·v_θ are
   fitted to the samples by `nft_loss`, r·ℓ(v+) + (1 − r)·ℓ(v−): better samples pull v_θ towards them,
   worse ones push it away, both relative to π_old.
4. π_old moves towards the trained weights: old ← d·old + (1 − d)·θ, d growing with the optimizer steps
   (`old_policy_decay`).

The loss is the reference implementation's (the authors' `train_nft_sd3.py`): ℓ is the squared error of the
x0 prediction x̂0 = x_σ − σ·v, divided by its own detached mean absolute error (the paper's adaptive weighting),
and the sum is scaled by c/β. v_target = ε − x0 does not appear: x̂0 − x0 = σ·(v_target − v), so this is the
paper's r·‖v+ − v_target‖² + (1 − r)·‖v− − v_target‖² with a per-sample weight σ²/mean|x̂0 − x0|.

π_old is the LoRA weights `ParameterEMA` keeps, swapped in for sampling and for v_old, and saved in the
checkpoints with the rest; evaluation, EMA, checkpoints, resume and export are GRPO's
(`vlm_rewards.generation.train.run_grpo`). Flow-matching models only (SD3, Flux, the tiny ones).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import numpy as np
import torch
from accelerate import Accelerator

from vlm_rewards.generation.config import NFT, NFTConfig
from vlm_rewards.generation.ema import ParameterEMA
from vlm_rewards.generation.models import ImageGenerator, predict
from vlm_rewards.generation.rewards import RewardSet
from vlm_rewards.generation.sampling import Rollout
from vlm_rewards.generation.train import EpochStep, derived_seed, minibatches, run_grpo, sample_epoch

ADAPTIVE_WEIGHT_MIN = 1e-5  # the reference's floor of the adaptive weight, mean|x̂0 − x0|


def run_nft(config: NFTConfig, track: Callable[..., Iterable] | None = None) -> dict[str, list]:
    """Train; returns the history (metric -> [(epoch, value)]), as `run_grpo` does."""
    if config.sampling.noise_level == 0:  # ODE: nothing is stochastic, so record one step instead of a window
        ode = config.sampling.model_copy(update={"window_size": 1, "window_starts": None})
        config = config.model_copy(update={"sampling": ode})

    def prepare(accelerator: Accelerator, trainable: list[torch.nn.Parameter]) -> EpochStep:
        old = ParameterEMA(trainable, decay=0.0)  # π_old: the starting weights
        accelerator.register_for_checkpointing(old)
        accelerator.gradient_accumulation_steps = config.trained_timesteps  # one optimizer step per minibatch
        return partial(nft_epoch, old=old)

    return run_grpo(config, track, prepare_step=prepare)


def nft_epoch(
    accelerator: Accelerator,
    generator: ImageGenerator,
    denoiser: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rewards: RewardSet,
    config: NFTConfig,
    epoch: int,
    ema: ParameterEMA | None = None,
    *,
    old: ParameterEMA,
) -> dict[str, float]:
    """Sample with π_old, score, fit the NFT loss on every sample, then move π_old towards the trained weights."""
    with old.applied():
        rollout, advantages, logs = sample_epoch(accelerator, generator, denoiser, rewards, config, epoch)
    optimality = optimality_probability(advantages.values, config.train.advantage_clip)
    logs |= fit_nft(accelerator, generator, denoiser, optimizer, rollout, optimality, config, epoch, ema, old)
    old.decay = old_policy_decay(config.nft, accelerator.step // accelerator.gradient_accumulation_steps)
    old.update()
    return logs | {"nft/old_decay": old.decay}


def optimality_probability(advantages: np.ndarray, advantage_clip: float) -> np.ndarray:
    """r = clip(A, −c, c) / (2c) + 1/2: 0 for A ≤ −c, 1/2 for A = 0 (a flat group), 1 for A ≥ c."""
    return np.clip(advantages, -advantage_clip, advantage_clip) / (2 * advantage_clip) + 0.5


def old_policy_decay(settings: NFT, optimizer_steps: int) -> float:
    """d of old ← d·old + (1 − d)·θ after `optimizer_steps`: 0 during the delay, then rate·(steps − delay) up to the
    maximum (the reference's `return_decay`)."""
    if optimizer_steps < settings.old_decay_delay:
        return 0.0
    return min(settings.old_decay_rate * (optimizer_steps - settings.old_decay_delay), settings.old_decay_max)


def fit_nft(
    accelerator: Accelerator,
    generator: ImageGenerator,
    denoiser: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    optimality: np.ndarray,
    config: NFTConfig,
    epoch: int,
    ema: ParameterEMA | None,
    old: ParameterEMA,
) -> dict[str, float]:
    """`inner_epochs` passes of minibatches of `train_batch_size`; per minibatch one backward per noise level (each
    sample its own levels) and one optimizer step."""
    num_steps = config.sampling.num_steps
    generator.scheduler.set_timesteps(num_steps, device=accelerator.device)
    rng = np.random.default_rng(derived_seed(config.seed, epoch, "shuffle", accelerator.process_index))
    noise_rng = torch.Generator().manual_seed(derived_seed(config.seed, epoch, "noise", accelerator.process_index))
    step_logs = []
    for index, minibatch in minibatches(rollout, np.arange(len(rollout)), config.train, rng):
        minibatch_optimality = torch.tensor(optimality[index], dtype=torch.float32, device=accelerator.device)
        levels = rng.permuted(np.tile(np.arange(num_steps), (len(index), 1)), axis=1)
        for k in range(config.trained_timesteps):
            with accelerator.accumulate(denoiser):
                loss, logs = level_loss(
                    accelerator,
                    generator,
                    denoiser,
                    old,
                    minibatch,
                    levels[:, k],
                    minibatch_optimality,
                    config,
                    noise_rng,
                )
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(denoiser.parameters(), config.train.grad_clip)
                optimizer.step()
                optimizer.zero_grad()
                if ema is not None and accelerator.sync_gradients:
                    ema.update()
            step_logs.append(logs)
    return {f"train/{name}": float(np.mean([logs[name] for logs in step_logs])) for name in step_logs[0]}


def level_loss(
    accelerator: Accelerator,
    generator: ImageGenerator,
    denoiser: torch.nn.Module,
    old: ParameterEMA,
    minibatch: Rollout,
    levels: np.ndarray,
    optimality: torch.Tensor,
    config: NFTConfig,
    noise_rng: torch.Generator,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The NFT loss (+ nft.kl_beta · the velocity's squared distance to the LoRA-disabled reference) of a minibatch
    whose sample i is noised to schedule step levels[i]."""
    scheduler, device = generator.scheduler, accelerator.device
    levels = torch.as_tensor(levels)  # CPU indices index CPU and GPU tensors alike
    clean = minibatch.clean_latents.to(device).float()
    sigma = scheduler.sigmas[levels].to(device).reshape(-1, *[1] * (clean.ndim - 1))
    noisy = (1 - sigma) * clean + sigma * torch.randn(clean.shape, generator=noise_rng).to(device)
    timesteps = scheduler.timesteps[levels].to(device)

    def velocity(model: torch.nn.Module) -> torch.Tensor:
        return predict(model, generator.family, noisy, timesteps, minibatch.embeddings)

    with torch.no_grad(), old.applied():
        old_velocity = velocity(denoiser)
    trained_velocity = velocity(denoiser)
    loss = nft_loss(trained_velocity, old_velocity, noisy, clean, sigma, optimality, config.nft.beta)
    loss = config.train.advantage_clip * loss  # the reference's scale, for its learning rates and gradient clip
    logs = {"nft_loss": loss.item(), "old_deviation": (trained_velocity - old_velocity).pow(2).mean().item()}
    if config.nft.kl_beta > 0:
        policy = accelerator.unwrap_model(denoiser)
        with torch.no_grad(), policy.disable_adapter():
            reference_velocity = velocity(policy)
        kl = (trained_velocity - reference_velocity).pow(2).mean()
        loss = loss + config.nft.kl_beta * kl
        logs["kl_reference"] = kl.item()
    return loss, logs


def nft_loss(
    velocity: torch.Tensor,
    old_velocity: torch.Tensor,
    noisy: torch.Tensor,
    clean: torch.Tensor,
    sigma: torch.Tensor,
    optimality: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """mean over the batch of (r·ℓ(v+) + (1 − r)·ℓ(v−)) / β, with v+ = (1 − β)·v_old + β·v, v− = (1 + β)·v_old − β·v
    and ℓ(u) = mean((x̂0 − x0)²) / sg(mean|x̂0 − x0|), x̂0 = x_σ − σ·u. `velocity` carries the gradient; v_old is
    detached; `sigma` broadcasts against the latents, `optimality` is (B,)."""
    old_velocity = old_velocity.detach()
    positive = (1 - beta) * old_velocity + beta * velocity
    negative = (1 + beta) * old_velocity - beta * velocity
    positive_loss = adaptive_x0_error(noisy - sigma * positive, clean)
    negative_loss = adaptive_x0_error(noisy - sigma * negative, clean)
    return ((optimality * positive_loss + (1 - optimality) * negative_loss) / beta).mean()


def adaptive_x0_error(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,) per-sample mean squared error over the detached mean absolute error (floored at 1e-5)."""
    error = prediction - target
    dims = tuple(range(1, error.ndim))
    scale = error.detach().abs().mean(dim=dims).clamp_min(ADAPTIVE_WEIGHT_MIN)
    return error.pow(2).mean(dim=dims) / scale
