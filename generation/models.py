"""The image generators GRPO trains: a diffusers denoiser, its scheduler, a prompt encoder and a decoder.

Three families share the trainer:
- "flow": `SD3Transformer2DModel` + `FlowMatchEulerDiscreteScheduler` (Flow-GRPO);
- "flux": `FluxTransformer2DModel` + `FlowMatchEulerDiscreteScheduler` (Flow-GRPO); the sampler keeps
  latents as (B, C, h, w) images and `predict` packs them into Flux's sequence of 2x2 patches;
- "ddim": `UNet2DConditionModel` + `DDIMScheduler` (DDPO).

`build_tiny_generator` makes a randomly initialised model from a small config for CPU tests and
from-scratch experiments. It works in pixel space (no VAE: latents are the image in [-1, 1]) and
conditions on `TinyTextEncoder`: a small learned embedding of the prompt's words (hashed into a fixed
vocabulary) plus positions, mean-pooled for SD3's and Flux's pooled projection. A tiny generator trained
from scratch (`vlm_rewards.generation.pretrain`) is saved with `save_tiny_generator` and read back with
`load_tiny_generator`. `load_pretrained_generator` loads a real pipeline with `from_pretrained` and uses
its own text encoders and VAE.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from diffusers import (
    DDIMScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxTransformer2DModel,
    SD3Transformer2DModel,
    UNet2DConditionModel,
)
from safetensors.torch import load_file, save_file
from torch import nn

Family = Literal["flow", "flux", "ddim"]
SUPPORTED_MODELS = {"flow": SD3Transformer2DModel, "flux": FluxTransformer2DModel, "ddim": UNet2DConditionModel}
SUPPORTED_SCHEDULERS = {
    "flow": FlowMatchEulerDiscreteScheduler,
    "flux": FlowMatchEulerDiscreteScheduler,
    "ddim": DDIMScheduler,
}
JOINT_ATTENTION_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]
LORA_TARGETS = {
    "flow": JOINT_ATTENTION_TARGETS,
    "flux": JOINT_ATTENTION_TARGETS,
    "ddim": ["to_q", "to_k", "to_v", "to_out.0"],
}
FLUX_GUIDANCE = 3.5  # the embedded guidance of guidance-distilled Flux (FLUX.1-dev), FluxPipeline's default


@dataclass
class PromptEmbeddings:
    """What the denoiser is conditioned on: token states (B, L, D) and, for SD3 and Flux, pooled (B, P)."""

    hidden_states: torch.Tensor
    pooled: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.hidden_states)

    def __getitem__(self, index) -> PromptEmbeddings:
        return PromptEmbeddings(self.hidden_states[index], None if self.pooled is None else self.pooled[index])

    @staticmethod
    def cat(parts: list[PromptEmbeddings]) -> PromptEmbeddings:
        pooled = None if parts[0].pooled is None else torch.cat([p.pooled for p in parts])
        return PromptEmbeddings(torch.cat([p.hidden_states for p in parts]), pooled)


@dataclass
class ImageGenerator:
    """A denoiser and everything around it; `denoiser` is what LoRA wraps and the optimizer trains."""

    family: Family
    denoiser: nn.Module
    scheduler: FlowMatchEulerDiscreteScheduler | DDIMScheduler
    encode_prompts: Callable[[list[str]], PromptEmbeddings]
    decode: Callable[[torch.Tensor], np.ndarray]  # latents -> (B, H, W, 3) uint8
    latent_shape: tuple[int, int, int]  # (C, h, w)
    text_encoder: TinyTextEncoder | None = None  # tiny models only: the module behind encode_prompts


class TinyTextEncoder(nn.Module):
    """Prompt -> learned word embeddings. Words are hashed with crc32 (stable across processes)."""

    def __init__(self, dim: int = 32, vocab_size: int = 512, max_tokens: int = 8, pooled_dim: int = 32):
        super().__init__()
        self.vocab_size, self.max_tokens = vocab_size, max_tokens
        self.settings = {"dim": dim, "vocab_size": vocab_size, "max_tokens": max_tokens, "pooled_dim": pooled_dim}
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.position_embedding = nn.Embedding(max_tokens, dim)
        self.pooled_projection = nn.Linear(dim, pooled_dim)

    def token_ids(self, prompts: list[str]) -> torch.Tensor:
        """(B, max_tokens) ids; 0 pads (and is all an empty prompt has), 1..vocab-1 are hashed words."""
        ids = torch.zeros(len(prompts), self.max_tokens, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            words = re.findall(r"\w+", prompt.lower())[: self.max_tokens]
            for column, word in enumerate(words):
                ids[row, column] = 1 + zlib.crc32(word.encode()) % (self.vocab_size - 1)
        return ids

    def forward(self, prompts: list[str]) -> PromptEmbeddings:
        ids = self.token_ids(prompts).to(self.token_embedding.weight.device)
        positions = torch.arange(self.max_tokens, device=ids.device)
        states = self.token_embedding(ids) + self.position_embedding(positions)
        return PromptEmbeddings(states, self.pooled_projection(states.mean(dim=1)))


def build_tiny_generator(
    family: Family = "flow",
    resolution: int = 8,
    channels: int = 3,
    layers: int = 1,
    heads: int = 2,
    head_dim: int = 8,
    text_dim: int = 16,
    max_tokens: int = 8,
    shift: float = 1.0,
    seed: int = 0,
    guidance_embeds: bool = False,
    patch_size: int = 2,
) -> ImageGenerator:
    """A randomly initialised pixel-space generator; the same arguments give the same weights.

    `guidance_embeds` (Flux only) adds FLUX.1-dev's guidance embedding; `patch_size` is SD3's (flow only).
    """
    torch.manual_seed(seed)
    text_encoder = TinyTextEncoder(text_dim, max_tokens=max_tokens, pooled_dim=text_dim).requires_grad_(False)
    if family == "flow":
        denoiser = SD3Transformer2DModel(
            sample_size=resolution,
            patch_size=patch_size,
            in_channels=channels,
            out_channels=channels,
            num_layers=layers,
            attention_head_dim=head_dim,
            num_attention_heads=heads,
            joint_attention_dim=text_dim,
            caption_projection_dim=heads * head_dim,
            pooled_projection_dim=text_dim,
            pos_embed_max_size=resolution,
        )
        scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    elif family == "flux":
        denoiser = FluxTransformer2DModel(
            in_channels=4 * channels,  # a 2x2 patch of the image per token
            num_layers=layers,
            num_single_layers=layers,
            attention_head_dim=head_dim,
            num_attention_heads=heads,
            joint_attention_dim=text_dim,
            pooled_projection_dim=text_dim,
            guidance_embeds=guidance_embeds,
            axes_dims_rope=_rope_axes(head_dim),
        )
        scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    elif family == "ddim":
        denoiser = UNet2DConditionModel(
            sample_size=resolution,
            in_channels=channels,
            out_channels=channels,
            block_out_channels=(16, 32),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=text_dim,
            layers_per_block=1,
            attention_head_dim=head_dim,
            norm_num_groups=8,
        )
        # steps_offset=1 as in Stable Diffusion: t = 0 (a step without noise) is never sampled
        scheduler = DDIMScheduler(clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    else:
        raise ValueError(f"family {family!r}; expected 'flow', 'flux' or 'ddim'")
    return tiny_generator(family, denoiser, scheduler, text_encoder, (channels, resolution, resolution))


def tiny_generator(
    family: Family,
    denoiser: nn.Module,
    scheduler: FlowMatchEulerDiscreteScheduler | DDIMScheduler,
    text_encoder: TinyTextEncoder,
    latent_shape: tuple[int, int, int],
) -> ImageGenerator:
    """A pixel-space generator around `TinyTextEncoder` (kept on `ImageGenerator.text_encoder`)."""

    def encode(prompts: list[str]) -> PromptEmbeddings:
        with torch.no_grad():
            embeddings = text_encoder.to(_device_of(denoiser))(prompts)
        return PromptEmbeddings(embeddings.hidden_states) if family == "ddim" else embeddings

    return ImageGenerator(family, denoiser, scheduler, encode, pixels_to_uint8, latent_shape, text_encoder)


def save_tiny_generator(generator: ImageGenerator, folder: str | Path) -> None:
    """Write a tiny generator (e.g. one trained from scratch) as a folder `load_tiny_generator` reads."""
    folder = Path(folder)
    text_encoder = generator.text_encoder
    generator.denoiser.save_pretrained(folder / "denoiser")
    generator.scheduler.save_pretrained(folder / "scheduler")
    save_file(text_encoder.state_dict(), folder / "text_encoder.safetensors")
    settings = {"family": generator.family, "latent_shape": generator.latent_shape, **text_encoder.settings}
    (folder / "tiny_generator.json").write_text(json.dumps(settings, indent=1))


def load_tiny_generator(folder: str | Path) -> ImageGenerator:
    """A folder written by `save_tiny_generator`; the text encoder comes back frozen."""
    folder = Path(folder)
    if not (folder / "tiny_generator.json").is_file():
        raise ValueError(f"{folder}: no tiny_generator.json; expected a folder saved by save_tiny_generator")
    settings = json.loads((folder / "tiny_generator.json").read_text())
    family, latent_shape = settings.pop("family"), tuple(settings.pop("latent_shape"))
    denoiser = SUPPORTED_MODELS[family].from_pretrained(folder / "denoiser")
    scheduler = SUPPORTED_SCHEDULERS[family].from_pretrained(folder / "scheduler")
    text_encoder = TinyTextEncoder(**settings)
    text_encoder.load_state_dict(load_file(folder / "text_encoder.safetensors"))
    return tiny_generator(family, denoiser, scheduler, text_encoder.requires_grad_(False), latent_shape)


def load_pretrained_generator(
    path: str, family: Family, resolution: int = 512, dtype: torch.dtype = torch.bfloat16
) -> ImageGenerator:
    """A real pipeline (SD3/SD3.5 for "flow", FLUX.1 for "flux", Stable Diffusion 1.x/2.x for "ddim")
    from a hub id or folder."""
    from diffusers import FluxPipeline, StableDiffusion3Pipeline, StableDiffusionPipeline

    if family == "flow":
        pipeline = StableDiffusion3Pipeline.from_pretrained(path, torch_dtype=dtype)
        scheduler, denoiser = pipeline.scheduler, pipeline.transformer
    elif family == "flux":
        pipeline = FluxPipeline.from_pretrained(path, torch_dtype=dtype)
        scheduler, denoiser = _flux_fixed_shift_scheduler(pipeline, resolution), pipeline.transformer
    else:
        pipeline = StableDiffusionPipeline.from_pretrained(path, torch_dtype=dtype)
        scheduler, denoiser = DDIMScheduler.from_config(pipeline.scheduler.config), pipeline.unet
    for part in ("vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
        if getattr(pipeline, part, None) is not None:
            getattr(pipeline, part).requires_grad_(False)
    vae = pipeline.vae

    @torch.no_grad()
    def encode(prompts: list[str]) -> PromptEmbeddings:
        pipeline.to(_device_of(denoiser))
        if family == "flow":
            embeds, _, pooled, _ = pipeline.encode_prompt(prompts, prompts, prompts, do_classifier_free_guidance=False)
            return PromptEmbeddings(embeds, pooled)
        if family == "flux":
            embeds, pooled, _ = pipeline.encode_prompt(prompts, prompts, _device_of(denoiser))
            return PromptEmbeddings(embeds, pooled)
        embeds, _ = pipeline.encode_prompt(prompts, _device_of(denoiser), 1, do_classifier_free_guidance=False)
        return PromptEmbeddings(embeds)

    @torch.no_grad()
    def decode(latents: torch.Tensor) -> np.ndarray:
        latents = latents.to(vae.dtype) / vae.config.scaling_factor + (vae.config.get("shift_factor") or 0.0)
        return pixels_to_uint8(vae.decode(latents, return_dict=False)[0])

    scale = pipeline.vae_scale_factor
    channels = denoiser.config.in_channels // 4 if family == "flux" else denoiser.config.in_channels
    latent_shape = (channels, resolution // scale, resolution // scale)
    return ImageGenerator(family, denoiser, scheduler, encode, decode, latent_shape)


def _flux_fixed_shift_scheduler(pipeline, resolution: int) -> FlowMatchEulerDiscreteScheduler:
    """FluxPipeline shifts the schedule by exp(mu), mu set by the image's token count ("dynamic shifting").
    At one fixed resolution that is the static shift exp(mu), which lets `set_timesteps(n)` work unchanged."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    config = pipeline.scheduler.config
    tokens = (resolution // pipeline.vae_scale_factor // 2) ** 2
    mu = calculate_shift(
        tokens,
        config.get("base_image_seq_len", 256),
        config.get("max_image_seq_len", 4096),
        config.get("base_shift", 0.5),
        config.get("max_shift", 1.15),
    )
    return FlowMatchEulerDiscreteScheduler.from_config(config, use_dynamic_shifting=False, shift=math.exp(mu))


def check_generator(generator: ImageGenerator) -> None:
    """Refuse unsupported model or scheduler classes before any compute is spent."""
    expected_model, expected_scheduler = SUPPORTED_MODELS[generator.family], SUPPORTED_SCHEDULERS[generator.family]
    model = getattr(generator.denoiser, "get_base_model", lambda: generator.denoiser)()
    if not isinstance(model, expected_model):
        raise ValueError(
            f"{type(model).__name__} is not supported for family {generator.family!r}; "
            f"expected {expected_model.__name__}"
        )
    if not isinstance(generator.scheduler, expected_scheduler):
        raise ValueError(
            f"scheduler {type(generator.scheduler).__name__} is not supported for family {generator.family!r}; "
            f"expected {expected_scheduler.__name__}"
        )


def predict(
    denoiser: nn.Module,
    family: Family,
    latents: torch.Tensor,
    timestep: torch.Tensor,
    prompts: PromptEmbeddings,
    negative: PromptEmbeddings | None = None,
    guidance_scale: float = 1.0,
) -> torch.Tensor:
    """The denoiser's output (velocity for flow, ε/v for DDIM), with classifier-free guidance if scale > 1."""
    timestep = torch.as_tensor(timestep, device=latents.device).reshape(-1).expand(len(latents))
    if guidance_scale <= 1.0:
        return _forward(denoiser, family, latents, timestep, prompts)
    if negative is None:
        raise ValueError("guidance_scale > 1 needs negative (unconditional) prompt embeddings")
    both = _forward(
        denoiser,
        family,
        torch.cat([latents, latents]),
        torch.cat([timestep, timestep]),
        PromptEmbeddings.cat([negative, prompts]),
    )
    unconditional, conditional = both.chunk(2)
    return unconditional + guidance_scale * (conditional - unconditional)


def pixels_to_uint8(pixels: torch.Tensor) -> np.ndarray:
    """(B, 3, H, W) in [-1, 1] -> (B, H, W, 3) uint8."""
    pixels = ((pixels.float().clamp(-1, 1) + 1) * 127.5).round()
    return pixels.permute(0, 2, 3, 1).to(torch.uint8).cpu().numpy()


def _forward(
    denoiser: nn.Module, family: Family, latents: torch.Tensor, timestep: torch.Tensor, prompts: PromptEmbeddings
) -> torch.Tensor:
    dtype = next(denoiser.parameters()).dtype
    if family == "flux":
        return _flux_forward(denoiser, latents, timestep, prompts)
    if family == "flow":
        output = denoiser(
            hidden_states=latents.to(dtype),
            encoder_hidden_states=prompts.hidden_states.to(dtype),
            pooled_projections=prompts.pooled.to(dtype),
            timestep=timestep,
            return_dict=False,
        )
    else:
        output = denoiser(
            latents.to(dtype), timestep, encoder_hidden_states=prompts.hidden_states.to(dtype), return_dict=False
        )
    return output[0].float()


def _flux_forward(
    denoiser: nn.Module, latents: torch.Tensor, timestep: torch.Tensor, prompts: PromptEmbeddings
) -> torch.Tensor:
    """Flux on (B, C, h, w) latents: packed into 2x2-patch tokens, with rotary position ids, and unpacked."""
    dtype, device = next(denoiser.parameters()).dtype, latents.device
    height, width = latents.shape[-2:]
    guidance = None
    if getattr(denoiser, "module", denoiser).config.guidance_embeds:
        guidance = torch.full((len(latents),), FLUX_GUIDANCE, device=device, dtype=torch.float32)
    output = denoiser(
        hidden_states=pack_latents(latents).to(dtype),
        encoder_hidden_states=prompts.hidden_states.to(dtype),
        pooled_projections=prompts.pooled.to(dtype),
        timestep=timestep / 1000,  # Flux embeds σ·1000 itself; FluxPipeline passes t/1000 too
        img_ids=flux_image_ids(height // 2, width // 2).to(device, dtype),
        txt_ids=torch.zeros(prompts.hidden_states.shape[1], 3, device=device, dtype=dtype),
        guidance=guidance,
        return_dict=False,
    )
    return unpack_latents(output[0].float(), height, width)


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) -> (B, h/2 · w/2, 4C): FluxPipeline._pack_latents."""
    batch, channels, height, width = latents.shape
    patches = latents.reshape(batch, channels, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(batch, (height // 2) * (width // 2), channels * 4)


def unpack_latents(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of `pack_latents`."""
    batch, _, features = tokens.shape
    patches = tokens.reshape(batch, height // 2, width // 2, features // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(batch, features // 4, height, width)


def flux_image_ids(rows: int, columns: int) -> torch.Tensor:
    """(rows · columns, 3) rotary ids (0, row, column) of the patch tokens: FluxPipeline._prepare_latent_image_ids."""
    grid = torch.cartesian_prod(torch.arange(rows), torch.arange(columns)).float()
    return torch.cat([torch.zeros(len(grid), 1), grid], dim=1)


def _rope_axes(head_dim: int) -> tuple[int, int, int]:
    """Flux's rotary split of a head, FLUX.1's (16, 56, 56) of 128 scaled: even sizes summing to head_dim."""
    spatial = head_dim * 7 // 16 // 2 * 2
    return head_dim - 2 * spatial, spatial, spatial


def _device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device
