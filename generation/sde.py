"""Stochastic denoising steps with Gaussian log-probabilities, for policy-gradient training.

Every sampler step here is a Gaussian transition x' ~ N(mean(x, model_output), std²·I), so a
trajectory's likelihood under the current policy can be recomputed from recorded latents:

- Flow matching (`FlowMatchEulerDiscreteScheduler`, x_t = (1−σ)x0 + σε, velocity v):
  - `"sde"`: Flow-GRPO's marginal-preserving SDE. With dt = σ_next − σ < 0 and
    std_dev_t = a·sqrt(σ/(1−σ)) (noise level a; σ = 1 in the denominator replaced by the next sigma,
    sigmas[1], so the first step is finite):
    mean = x·(1 + std_dev_t²·dt/(2σ)) + v·(1 + std_dev_t²·(1−σ)/(2σ))·dt,  std = std_dev_t·sqrt(−dt).
    a = 0 is the Euler ODE step, bit for bit.
  - `"cps"`: coefficient-preserving sampling: std = σ_next·sin(aπ/2),
    mean = x̂0·(1−σ_next) + x̂1·sqrt(σ_next² − std²) with x̂0 = x − σv, x̂1 = x + (1−σ)v.
    Its per-step noise does not shrink with the step size, so at large a it does not keep the
    model's marginals (tests/test_generation_sde.py measures this); Flow-SDE does.
- DDIM (`DDIMScheduler`, DDPO): the η > 0 DDIM step, std = η·sqrt(variance(t, t_prev)).

Log-probs follow Flow-GRPO/DDPO: the Gaussian log-density averaged over all non-batch dimensions.
Unlike Flow-GRPO's CPS code (which drops the 1/(2·std²) factor), CPS log-probs here are the true
log-density too, so ratios and the KL mean the same for every method. A deterministic step (std 0,
e.g. a = 0) has log-prob 0 by convention: it carries no likelihood-ratio signal.

`sde_step_with_logprob` (Flow-GRPO) and `ddim_step_with_logprob` (DDPO) are the public API, with the
signatures and return values of those codebases. Both are views of `step_with_logprob`, the step the
rollout sampler and the GRPO trainer take, so what is tested through them is what trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler
from diffusers.utils.torch_utils import randn_tensor

from vlm_rewards.generation.config import DEFAULT_NOISE_LEVEL

FlowMethod = Literal["sde", "cps"]
Scheduler = FlowMatchEulerDiscreteScheduler | DDIMScheduler


@dataclass
class StepDistribution:
    """x' ~ N(mean, std²·I). `std_dev_t` is the method's own noise scale as Flow-GRPO/DDPO return it
    (for Flow-SDE the step std divided by sqrt(−dt); for CPS and DDIM equal to `std`)."""

    mean: torch.Tensor
    std: torch.Tensor  # broadcastable to mean: (B, 1, ..., 1)
    std_dev_t: torch.Tensor


def sde_step_with_logprob(
    scheduler: FlowMatchEulerDiscreteScheduler,
    model_output: torch.Tensor,
    timestep: float | torch.Tensor,
    sample: torch.Tensor,
    noise_level: float = DEFAULT_NOISE_LEVEL,
    prev_sample: torch.Tensor | None = None,
    generator: torch.Generator | list[torch.Generator] | None = None,
    method: FlowMethod = "sde",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One flow-matching step (Flow-GRPO's `sde_step_with_logprob`).

    Returns (prev_sample, log_prob (B,), prev_sample_mean, std_dev_t). `timestep` is one value or one
    per sample; `method` is "sde" (Flow-SDE, noise level a) or "cps" (coefficient-preserving). With
    `prev_sample` given, nothing is sampled: its log-prob under the step is returned (training).
    """
    _check_scheduler(scheduler, FlowMatchEulerDiscreteScheduler, "sde_step_with_logprob")
    prev_sample, log_prob, step = step_with_logprob(
        scheduler, model_output, timestep, sample, noise_level, method, prev_sample, generator
    )
    return prev_sample, log_prob, step.mean, step.std_dev_t


def ddim_step_with_logprob(
    scheduler: DDIMScheduler,
    model_output: torch.Tensor,
    timestep: int | torch.Tensor,
    sample: torch.Tensor,
    eta: float = 1.0,
    prev_sample: torch.Tensor | None = None,
    generator: torch.Generator | list[torch.Generator] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One DDIM step with η > 0 (DDPO's `ddim_step_with_logprob`).

    Returns (prev_sample, log_prob (B,), prev_sample_mean, std_dev_t). With `prev_sample` given,
    nothing is sampled: its log-prob under the step is returned (training).
    """
    _check_scheduler(scheduler, DDIMScheduler, "ddim_step_with_logprob")
    prev_sample, log_prob, step = step_with_logprob(
        scheduler, model_output, timestep, sample, eta, "sde", prev_sample, generator
    )
    return prev_sample, log_prob, step.mean, step.std_dev_t


def step_with_logprob(
    scheduler: Scheduler,
    model_output: torch.Tensor,
    timestep: float | torch.Tensor,
    sample: torch.Tensor,
    noise_level: float,
    method: FlowMethod = "sde",
    prev_sample: torch.Tensor | None = None,
    generator: torch.Generator | list[torch.Generator] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, StepDistribution]:
    """One stochastic step of either scheduler: (prev_sample, log_prob (B,), the step's distribution).

    `noise_level` is the flow noise level a or DDIM's η. With `prev_sample` given, nothing is sampled.
    """
    step = step_distribution(scheduler, model_output, timestep, sample, noise_level, method)
    prev_sample, log_prob = sample_and_log_prob(step, prev_sample, generator)
    return prev_sample, log_prob, step


def step_distribution(
    scheduler: Scheduler,
    model_output: torch.Tensor,
    timestep: float | torch.Tensor,
    sample: torch.Tensor,
    noise_level: float,
    method: FlowMethod = "sde",
) -> StepDistribution:
    """The Gaussian of one step of either scheduler; `noise_level` is the flow noise level a or DDIM's η."""
    if isinstance(scheduler, FlowMatchEulerDiscreteScheduler):
        return flow_step_distribution(scheduler, model_output, timestep, sample, noise_level, method)
    if method != "sde":
        raise ValueError(f"method {method!r} is for flow-matching schedulers; DDIM has only its η step ('sde')")
    return ddim_step_distribution(scheduler, model_output, timestep, sample, eta=noise_level)


def flow_step_distribution(
    scheduler: FlowMatchEulerDiscreteScheduler,
    model_output: torch.Tensor,
    timestep: float | torch.Tensor,
    sample: torch.Tensor,
    noise_level: float = DEFAULT_NOISE_LEVEL,
    method: FlowMethod = "sde",
) -> StepDistribution:
    """Flow-SDE's or CPS's step as a Gaussian (formulas in the module docstring)."""
    model_output, sample = model_output.float(), sample.float()
    step_index = flow_step_indices(scheduler, timestep, len(sample))
    sigmas = scheduler.sigmas.to(sample.device, torch.float32)
    sigma = _per_sample(sigmas[step_index], sample)
    sigma_next = _per_sample(sigmas[step_index + 1], sample)
    if method == "sde":
        dt = sigma_next - sigma
        sigma_below_one = torch.where(sigma == 1, sigmas[1], sigma)
        std_dev_t = torch.sqrt(sigma / (1 - sigma_below_one)) * noise_level
        mean = (
            sample * (1 + std_dev_t**2 / (2 * sigma) * dt)
            + model_output * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
        )
        return StepDistribution(mean, std_dev_t * torch.sqrt(-dt), std_dev_t)
    if method == "cps":
        std_dev_t = sigma_next * math.sin(noise_level * math.pi / 2)
        predicted_clean = sample - sigma * model_output
        predicted_noise = sample + (1 - sigma) * model_output
        mean = predicted_clean * (1 - sigma_next) + predicted_noise * torch.sqrt(sigma_next**2 - std_dev_t**2)
        return StepDistribution(mean, std_dev_t, std_dev_t)
    raise ValueError(f"method {method!r}; expected 'sde' or 'cps'")


def ddim_step_distribution(
    scheduler: DDIMScheduler,
    model_output: torch.Tensor,
    timestep: int | torch.Tensor,
    sample: torch.Tensor,
    eta: float,
) -> StepDistribution:
    """The DDIM step of `DDIMScheduler.step` (same prediction types, clipping and thresholding) as a Gaussian."""
    if scheduler.num_inference_steps is None:
        raise ValueError("DDIMScheduler: call set_timesteps before stepping")
    model_output, sample = model_output.float(), sample.float()
    timestep = torch.as_tensor(timestep, device=sample.device).long().expand(len(sample))
    prev_timestep = timestep - scheduler.config.num_train_timesteps // scheduler.num_inference_steps
    alphas_cumprod = scheduler.alphas_cumprod.to(sample.device, torch.float32)
    final_alpha_cumprod = torch.as_tensor(scheduler.final_alpha_cumprod, device=sample.device, dtype=torch.float32)
    alpha_prod_t = _per_sample(alphas_cumprod[timestep], sample)
    alpha_prod_prev = torch.where(prev_timestep >= 0, alphas_cumprod[prev_timestep.clamp(min=0)], final_alpha_cumprod)
    alpha_prod_prev = _per_sample(alpha_prod_prev, sample)
    beta_prod_t, beta_prod_prev = 1 - alpha_prod_t, 1 - alpha_prod_prev

    predicted_clean, predicted_noise = _ddim_predictions(scheduler, model_output, sample, alpha_prod_t)
    if scheduler.config.thresholding:
        predicted_clean = scheduler._threshold_sample(predicted_clean)
    elif scheduler.config.clip_sample:
        limit = scheduler.config.clip_sample_range
        predicted_clean = predicted_clean.clamp(-limit, limit)

    variance = (beta_prod_prev / beta_prod_t) * (1 - alpha_prod_t / alpha_prod_prev)
    std_dev_t = eta * variance**0.5
    direction = (1 - alpha_prod_prev - std_dev_t**2) ** 0.5 * predicted_noise
    mean = alpha_prod_prev**0.5 * predicted_clean + direction
    return StepDistribution(mean, std_dev_t, std_dev_t)


def sample_and_log_prob(
    step: StepDistribution,
    prev_sample: torch.Tensor | None = None,
    generator: torch.Generator | list[torch.Generator] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw x' from the step (unless given) and return it with its log-density averaged per sample."""
    if prev_sample is None:
        noise = randn_tensor(step.mean.shape, generator=generator, device=step.mean.device, dtype=step.mean.dtype)
        prev_sample = step.mean + step.std * noise
    return prev_sample, gaussian_log_prob(prev_sample.detach().float(), step.mean, step.std)


def gaussian_log_prob(value: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(value; mean, std²) averaged over non-batch dimensions; 0 where std is 0 (a deterministic step)."""
    std = torch.as_tensor(std, device=mean.device, dtype=mean.dtype).expand_as(mean)
    stochastic = std > 0
    safe_std = torch.where(stochastic, std, torch.ones_like(std))  # keeps NaN out of the gradient
    log_density = -((value - mean) ** 2) / (2 * safe_std**2) - torch.log(safe_std) - 0.5 * math.log(2 * math.pi)
    log_density = torch.where(stochastic, log_density, torch.zeros_like(log_density))
    return log_density.mean(dim=tuple(range(1, log_density.ndim)))


def gaussian_mean_kl(mean: torch.Tensor, reference_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, std²) ‖ N(reference_mean, std²)) per element, averaged over non-batch dimensions.

    Equal-variance Gaussians: ‖μθ − μref‖² / (2·std²), the same per-element averaging as the log-probs,
    so it equals E_{x'~θ}[log_prob_θ(x') − log_prob_ref(x')]. (Flow-GRPO's code divides by std_dev_t²,
    a −dt-rescaled version of this for Flow-SDE, which only changes what β means: this KL is 1/(−dt) times
    theirs, about 10x at 10 steps; see `Train.kl_beta`.) 0 where std is 0, as for the log-probs.
    """
    std = torch.as_tensor(std, device=mean.device, dtype=mean.dtype).expand_as(mean)
    stochastic = std > 0
    safe_std = torch.where(stochastic, std, torch.ones_like(std))
    kl = torch.where(stochastic, (mean - reference_mean) ** 2 / (2 * safe_std**2), torch.zeros_like(mean))
    return kl.mean(dim=tuple(range(1, kl.ndim)))


def flow_step_indices(
    scheduler: FlowMatchEulerDiscreteScheduler, timestep: float | torch.Tensor, batch_size: int
) -> torch.Tensor:
    """Each sample's index into `scheduler.sigmas` (scheduler.index_for_timestep, per sample)."""
    timesteps = torch.as_tensor(timestep, dtype=scheduler.timesteps.dtype).reshape(-1).cpu()
    if len(timesteps) == 1:
        timesteps = timesteps.expand(batch_size)
    if len(timesteps) != batch_size:
        raise ValueError(f"timestep: {len(timesteps)} values for a batch of {batch_size}")
    unique, inverse = torch.unique(timesteps, return_inverse=True)
    schedule = scheduler.timesteps.cpu()
    unique_indices = torch.tensor([scheduler.index_for_timestep(t, schedule) for t in unique], dtype=torch.long)
    return unique_indices[inverse]


def _check_scheduler(scheduler: Scheduler, expected: type, function: str) -> None:
    if not isinstance(scheduler, expected):
        raise TypeError(f"{function}: scheduler {type(scheduler).__name__}; expected a {expected.__name__}")


def _ddim_predictions(
    scheduler: DDIMScheduler, model_output: torch.Tensor, sample: torch.Tensor, alpha_prod_t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted x0, predicted ε) for the scheduler's prediction type."""
    beta_prod_t = 1 - alpha_prod_t
    prediction_type = scheduler.config.prediction_type
    if prediction_type == "epsilon":
        return (sample - beta_prod_t**0.5 * model_output) / alpha_prod_t**0.5, model_output
    if prediction_type == "sample":
        return model_output, (sample - alpha_prod_t**0.5 * model_output) / beta_prod_t**0.5
    if prediction_type == "v_prediction":
        return (
            alpha_prod_t**0.5 * sample - beta_prod_t**0.5 * model_output,
            alpha_prod_t**0.5 * model_output + beta_prod_t**0.5 * sample,
        )
    raise ValueError(f"DDIMScheduler prediction_type {prediction_type!r} is not supported")


def _per_sample(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B,) -> (B, 1, ..., 1) to broadcast against `like`."""
    return values.reshape(-1, *([1] * (like.ndim - 1)))
