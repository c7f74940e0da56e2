"""Rollouts: sample images while recording what training needs at each stochastic step.

Only the steps of the SDE window are stochastic and recorded (and so trained); every other step is
the deterministic ODE/DDIM step. A window of 1-2 steps is the cheap "ODE with SDE branching" variant
(Flow-GRPO-Fast, MixGRPO); with `same_noise_in_group` every sample of a prompt starts from the same
noise, so a group shares its trajectory up to the window and differs only by the window's noise:
that shared ODE prefix is computed once per group. Deterministic steps draw no random numbers, so
the window's noise does not depend on how much of the batch ran the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from vlm_rewards.generation.config import SamplerSettings
from vlm_rewards.generation.models import ImageGenerator, PromptEmbeddings, predict
from vlm_rewards.generation.sde import step_distribution, step_with_logprob


@dataclass
class Rollout:
    """B trajectories; K recorded steps each. latents[:, k] -> next_latents[:, k] at timesteps[:, k], which is
    denoising step step_indices[:, k] of the schedule."""

    prompts: list[str]
    embeddings: PromptEmbeddings
    latents: torch.Tensor  # (B, K, C, h, w)
    next_latents: torch.Tensor  # (B, K, C, h, w)
    timesteps: torch.Tensor  # (B, K)
    log_probs: torch.Tensor  # (B, K)
    step_indices: torch.Tensor  # (B, K) int64
    images: np.ndarray  # (B, H, W, 3) uint8
    clean_latents: torch.Tensor  # (B, C, h, w): the final latents `images` decode from (DiffusionNFT's x0)

    STEP_FIELDS: ClassVar[tuple[str, ...]] = ("latents", "next_latents", "timesteps", "log_probs", "step_indices")

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, index: np.ndarray | list[int]) -> Rollout:
        index = np.asarray(index, dtype=np.int64)
        rows = torch.as_tensor(index)
        return Rollout(
            [self.prompts[i] for i in index],
            self.embeddings[rows],
            *(getattr(self, name)[rows] for name in Rollout.STEP_FIELDS),
            self.images[index],
            self.clean_latents[rows],
        )

    @staticmethod
    def cat(parts: list[Rollout]) -> Rollout:
        return Rollout(
            [prompt for part in parts for prompt in part.prompts],
            PromptEmbeddings.cat([part.embeddings for part in parts]),
            *(torch.cat([getattr(part, name) for part in parts]) for name in Rollout.STEP_FIELDS),
            np.concatenate([part.images for part in parts]),
            torch.cat([part.clean_latents for part in parts]),
        )


def initial_noise(
    generator: ImageGenerator, prompts: list[str], same_noise_in_group: bool, rng: torch.Generator, device
) -> torch.Tensor:
    shape = (len(prompts), *generator.latent_shape)
    if not same_noise_in_group:
        return torch.randn(shape, generator=rng).to(device)
    by_prompt = {prompt: torch.randn(generator.latent_shape, generator=rng) for prompt in dict.fromkeys(prompts)}
    return torch.stack([by_prompt[prompt] for prompt in prompts]).to(device)


def prompt_groups(prompts: list[str]) -> tuple[list[int], list[int]]:
    """(the first row of each distinct prompt, each row's index into those): a batch's same-noise groups."""
    distinct = list(dict.fromkeys(prompts))
    return [prompts.index(prompt) for prompt in distinct], [distinct.index(prompt) for prompt in prompts]


@torch.no_grad()
def sample_rollout(
    generator: ImageGenerator,
    prompts: list[str],
    settings: SamplerSettings,
    seed: int,
    denoiser: torch.nn.Module | None = None,
    negative: PromptEmbeddings | None = None,
) -> Rollout:
    """Sample one batch; `denoiser` defaults to the generator's (pass the accelerate-wrapped one)."""
    denoiser = denoiser or generator.denoiser
    device = next(denoiser.parameters()).device
    rng = torch.Generator().manual_seed(seed)
    window = settings.stochastic_steps(np.random.default_rng(seed))
    scheduler = generator.scheduler
    scheduler.set_timesteps(settings.num_steps, device=device)
    embeddings = generator.encode_prompts(prompts)
    latents = initial_noise(generator, prompts, settings.same_noise_in_group, rng, device)

    def denoise(index: int, latents: torch.Tensor, rows: list[int] | slice = slice(None)) -> torch.Tensor:
        """The model output at step `index` for these rows of the batch."""
        conditions = [None if part is None else part[rows] for part in (embeddings, negative)]
        timestep = scheduler.timesteps[index]
        return predict(denoiser, generator.family, latents, timestep, *conditions, settings.guidance_scale)

    def ode_step(index: int, latents: torch.Tensor, rows: list[int] | slice = slice(None)) -> torch.Tensor:
        """A deterministic (ODE/DDIM) step: the noise-free step's mean; it draws no random numbers."""
        output = denoise(index, latents, rows)
        return step_distribution(scheduler, output, scheduler.timesteps[index], latents, 0.0, settings.method).mean

    rows, members = prompt_groups(prompts) if settings.same_noise_in_group else (slice(None), slice(None))
    # a same-noise group follows one ODE trajectory until the window: compute it once and branch there
    shared = latents[rows]
    for index in range(window.start):
        shared = ode_step(index, shared, rows)
    latents = shared[members]

    recorded: dict[str, list[torch.Tensor]] = {name: [] for name in Rollout.STEP_FIELDS}
    for index in range(window.start, settings.num_steps):
        if index not in window:
            latents = ode_step(index, latents)
            continue
        timestep = scheduler.timesteps[index]
        next_latents, log_prob, step = step_with_logprob(
            scheduler, denoise(index, latents), timestep, latents, settings.noise_level, settings.method, generator=rng
        )
        if settings.noise_level > 0 and not torch.all(step.std > 0):
            raise ValueError(
                f"step {index} of {settings.num_steps} has no noise with this scheduler; move the SDE window"
            )
        recorded["latents"].append(latents)
        recorded["next_latents"].append(next_latents)
        recorded["timesteps"].append(timestep.expand(len(prompts)))
        recorded["log_probs"].append(log_prob)
        recorded["step_indices"].append(torch.full((len(prompts),), index, device=log_prob.device))
        latents = next_latents
    stacked = {name: torch.stack(values, dim=1) for name, values in recorded.items()}
    return Rollout(prompts, embeddings, images=generator.decode(latents), clean_latents=latents, **stacked)


@torch.no_grad()
def sample_deterministic(
    generator: ImageGenerator,
    prompts: list[str],
    num_steps: int,
    seed: int,
    guidance_scale: float = 1.0,
    negative: PromptEmbeddings | None = None,
) -> np.ndarray:
    """ODE (flow) or η = 0 DDIM images: the evaluation sampler."""
    settings = SamplerSettings(num_steps=num_steps, noise_level=0.0, window_size=1, guidance_scale=guidance_scale)
    return sample_rollout(generator, prompts, settings, seed, negative=negative).images
