"""GRPO step costs: rollout sampling images/s, train-step time, and what overlapping reward scoring hides.

One GRPO epoch samples `--batches` batches of whole prompt groups, scores them and runs PPO updates.
Measured on the same generator, LoRA-wrapped as `vlmr grpo` trains it:

- sampling: `sample_rollout` of one batch (ODE steps, then the SDE window recording latents and
  log-probs), images/s;
- train step: `update_policy` on one sampled batch with every sample kept, as one minibatch (one
  optimizer step: forward + backward on each window step, plus the no-grad reference forward for the
  KL to the LoRA-disabled model), seconds per step and samples/s;
- reward share: the rollout phase of an epoch run twice from the same seeds, **serial** (sample batch
  b, then score it) and **overlapped** (`vlm_rewards.generation.rewards.collect_rollouts`: batch b is scored with
  `ascore` while batch b+1 samples). Reported: each phase's wall time, the share of it spent waiting
  for rewards, and serial / overlapped.

The reward is the ShapesWorld gold verifier (`vlm_rewards.generation.shapes_t2i.verifier_score`, NumPy on the same
CPU) plus, with `--reward-latency S`, S seconds of waiting per batch that use no CPU: a stand-in for a
reward model on another device or behind `vlmr serve`. Only waiting can hide behind sampling; reward
work on the sampler's own cores cannot.

Presets (random weights, nothing downloaded; the figures are speeds, not quality):
- `tiny`: the ShapesWorld base model's architecture (`configs/grpo/shapes_base.yaml`: SD3 transformer,
  32 px pixel space, 4x4 patches, 4 layers of width 128) and its tiny text encoder;
- `sd3_5_medium`: SD3.5-Medium's transformer built in code (24 layers, width 1536, dual attention in
  layers 0-12, RMS QK-norm; 2,243,171,520 parameters) at 512 px (16x64x64 latents) with Flow-GRPO's
  LoRA (r 32, alpha 64). Prompt embeddings are fixed random tensors of SD3's shapes (333 tokens of
  4096, pooled 2048), and images are the first three latent channels (64 px): text encoders and VAE
  are not timed.

    .venv/bin/python bench/grpo_step.py --threads 1
    python bench/grpo_step.py --preset sd3_5_medium --device cuda --dtype bfloat16
"""

from __future__ import annotations

import asyncio
import statistics
import time
import zlib
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
import typer
from accelerate import Accelerator
from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
from rich.console import Console
from rich.table import Table

from vlm_rewards.config import load_job_config
from vlm_rewards.generation.config import GRPOConfig, PretrainConfig
from vlm_rewards.generation.grpo import Advantages
from vlm_rewards.generation.models import ImageGenerator, PromptEmbeddings, pixels_to_uint8
from vlm_rewards.generation.rewards import RewardSet, collect_rollouts
from vlm_rewards.generation.sampling import Rollout, sample_rollout
from vlm_rewards.generation.shapes_t2i import prompts as shapes_prompts
from vlm_rewards.generation.train import add_lora, build_generator, update_policy
from vlm_rewards.interface import BaseReward, RewardResult, RewardSpec
from vlm_rewards.registry import build_reward

if __package__:  # imported as bench.grpo_step (the tests)
    from bench._common import finish, machine
else:  # run as a script: bench/ is on sys.path
    from _common import finish, machine

Preset = Literal["tiny", "sd3_5_medium"]
VERIFIER = {"kind": "function", "function": "vlm_rewards.generation.shapes_t2i:verifier_score", "value_range": [0, 1]}
SHAPES_BASE = Path(__file__).parents[1] / "configs" / "grpo" / "shapes_base.yaml"
SHAPES_BASE = Path(__file__).parents[1] / "configs" / "grpo" / "shapes_base.yaml"
SD3_TEXT_TOKENS, SD3_TEXT_DIM, SD3_POOLED_DIM = 333, 4096, 2048  # 77 CLIP + 256 T5 tokens


class WaitingReward(BaseReward):
    """A reward computed elsewhere: each call waits `latency` seconds without using this CPU, returns 0."""

    spec = RewardSpec("waiting", "1")

    def __init__(self, latency: float):
        self.latency = latency

    def _score(self, requests):
        time.sleep(self.latency)
        return [RewardResult(0.0) for _ in requests]


def sd3_5_medium_transformer() -> SD3Transformer2DModel:
    """SD3.5-Medium's `transformer/config.json`, built with random weights."""
    return SD3Transformer2DModel(
        sample_size=128,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=24,
        attention_head_dim=64,
        num_attention_heads=24,
        joint_attention_dim=SD3_TEXT_DIM,
        caption_projection_dim=1536,
        pooled_projection_dim=SD3_POOLED_DIM,
        pos_embed_max_size=384,
        dual_attention_layers=tuple(range(13)),
        qk_norm="rms_norm",
    )


def sd3_5_medium_generator(resolution: int = 512) -> ImageGenerator:
    """The SD3.5-Medium-shaped transformer with stand-ins for the text encoders and the VAE (see the docstring)."""
    denoiser = sd3_5_medium_transformer()

    def encode(prompts: list[str]) -> PromptEmbeddings:
        device = next(denoiser.parameters()).device
        rows = [torch.Generator().manual_seed(zlib.crc32(prompt.encode())) for prompt in prompts]
        states = torch.stack([torch.randn(SD3_TEXT_TOKENS, SD3_TEXT_DIM, generator=rng) for rng in rows])
        pooled = torch.stack([torch.randn(SD3_POOLED_DIM, generator=rng) for rng in rows])
        return PromptEmbeddings(states.to(device), pooled.to(device))

    def decode(latents: torch.Tensor) -> np.ndarray:
        return pixels_to_uint8(latents[:, :3])

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)  # SD3's
    return ImageGenerator("flow", denoiser, scheduler, encode, decode, (16, resolution // 8, resolution // 8))


def grpo_config(preset: Preset, batch_size: int, group_size: int, num_steps: int, window_size: int) -> GRPOConfig:
    tiny = load_job_config(PretrainConfig, SHAPES_BASE).model
    lora = {"r": 8, "alpha": 16} if preset == "tiny" else {"r": 32, "alpha": 64}
    return GRPOConfig.model_validate(
        {
            "model": {"family": "flow", "tiny": tiny.model_dump(), "lora": lora},
            "sampling": {"num_steps": num_steps, "window_size": window_size, "window_starts": [0, 1]},
            "rewards": {"trained": [{"name": "verifier", "config": VERIFIER}]},
            "train": {
                "prompts": shapes_prompts(),
                "group_size": group_size,
                "sample_batch_size": batch_size,
                "train_batch_size": batch_size,
                "kl_beta": 0.01,
            },
        }
    )


def run_benchmark(
    *,
    preset: Preset = "tiny",
    device: str = "cpu",
    dtype: str = "float32",
    batch_size: int = 16,
    group_size: int = 4,
    num_steps: int = 10,
    window_size: int = 2,
    batches: int = 4,
    reward_latency: float = 0.0,
    repeats: int = 3,
    threads: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    machine_info = machine(device)
    config = grpo_config(preset, batch_size, group_size, num_steps, window_size)
    generator = build_generator(config.model) if preset == "tiny" else sd3_5_medium_generator()
    if dtype != "float32":
        generator.denoiser.to(getattr(torch, dtype))
    generator.denoiser = add_lora(generator.denoiser, config.model).to(device).eval()
    parameters = sum(p.numel() for p in generator.denoiser.parameters() if not p.requires_grad)
    trainable = [p for p in generator.denoiser.parameters() if p.requires_grad]
    accelerator = Accelerator(cpu=device == "cpu", gradient_accumulation_steps=config.sampling.steps_per_trajectory)
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    rewards = RewardSet({"verifier": build_reward(VERIFIER), "elsewhere": WaitingReward(reward_latency)}, {})
    batch_prompts = [p for p in shapes_prompts()[: batch_size // group_size] for _ in range(group_size)]

    def sample(batch: int) -> Rollout:
        return sample_rollout(generator, batch_prompts, config.sampling, seed + batch)

    def train_step(rollout: Rollout) -> None:
        advantages = Advantages(np.linspace(-1, 1, len(rollout)), np.ones(len(rollout), dtype=bool), 0.0)
        update_policy(accelerator, generator, generator.denoiser, optimizer, rollout, advantages, config, epoch=0)

    def serial_phase() -> dict[str, float]:
        start, reward_s = time.perf_counter(), 0.0
        for batch in range(batches):
            rollout = sample(batch)
            scored = time.perf_counter()
            asyncio.run(rewards.ascore(rollout.images, rollout.prompts))
            reward_s += time.perf_counter() - scored
        return {"total_s": time.perf_counter() - start, "reward_wait_s": reward_s}

    def overlapped_phase() -> dict[str, float]:
        start = time.perf_counter()
        _, _, timings = asyncio.run(collect_rollouts(sample, batches, rewards))
        return {"total_s": time.perf_counter() - start, "reward_wait_s": timings["time/reward_wait_s"]}

    rollout = sample(0)  # warm-up, and the batch the train steps use
    train_step(rollout)
    sampling_s, train_s, serial, overlapped = [], [], [], []
    reset_peak_memory(device)
    for _ in range(repeats):
        start = time.perf_counter()
        rollout = sample(0)
        sampling_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        train_step(rollout)
        train_s.append(time.perf_counter() - start)
        serial.append(serial_phase())
        overlapped.append(overlapped_phase())
    sampling, step = statistics.median(sampling_s), statistics.median(train_s)
    phases = {name: median_phase(runs) for name, runs in (("serial", serial), ("overlapped", overlapped))}
    return {
        "config": {
            "preset": preset,
            "dtype": dtype,
            "batch_size": batch_size,
            "group_size": group_size,
            "num_steps": num_steps,
            "window_size": window_size,
            "batches": batches,
            "reward_latency_s": reward_latency,
            "repeats": repeats,
            "threads": threads,
            "seed": seed,
            "image_shape": list(rollout.images.shape[1:]),
            "latent_shape": list(generator.latent_shape),
            "weights": "random (speed only)",
        },
        "machine": machine_info,
        "parameters": parameters,
        "lora_parameters": sum(p.numel() for p in trainable),
        "sampling": {"batch_s": sampling, "images_per_s": batch_size / sampling},
        "train_step": {"step_s": step, "samples_per_s": batch_size / step, "window_steps": window_size},
        "reward": phases | {"overlap_speedup": phases["serial"]["total_s"] / phases["overlapped"]["total_s"]},
        "peak_memory_gib": peak_memory_gib(device),
    }


def median_phase(runs: list[dict[str, float]]) -> dict[str, float]:
    total, wait = (statistics.median(run[name] for run in runs) for name in ("total_s", "reward_wait_s"))
    return {"total_s": total, "reward_wait_s": wait, "reward_share": wait / total}


def reset_peak_memory(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def print_result(result: dict[str, Any], console: Console) -> None:
    config = result["config"]
    console.print(
        f"{config['preset']} ({result['parameters']:,} parameters, LoRA {result['lora_parameters']:,}), "
        f"{config['dtype']}, batch {config['batch_size']} (groups of {config['group_size']}), "
        f"{config['num_steps']} steps with a {config['window_size']}-step SDE window, images "
        f"{config['image_shape']}"
    )
    console.print(
        f"sampling {result['sampling']['images_per_s']:.2f} images/s ({result['sampling']['batch_s']:.3f} s a batch); "
        f"train step {result['train_step']['step_s']:.3f} s ({result['train_step']['samples_per_s']:.2f} samples/s)"
        + (f"; peak memory {result['peak_memory_gib']:.2f} GiB" if result["peak_memory_gib"] is not None else "")
    )
    table = Table(
        title=f"rollout phase: {config['batches']} batches, reward latency {config['reward_latency_s']} s a batch"
    )
    for column in ("scoring", "phase s", "waiting for rewards s", "share waiting"):
        table.add_column(column, justify="right")
    for name in ("serial", "overlapped"):
        phase = result["reward"][name]
        table.add_row(name, f"{phase['total_s']:.3f}", f"{phase['reward_wait_s']:.3f}", f"{phase['reward_share']:.1%}")
    console.print(table)
    console.print(f"serial / overlapped: {result['reward']['overlap_speedup']:.2f}")


def main(
    preset: Annotated[str, typer.Option(help="tiny | sd3_5_medium")] = "tiny",
    device: str = "cpu",
    dtype: Annotated[
        str, typer.Option(help="float32 | bfloat16 | float16: the base weights (LoRA: float32)")
    ] = "float32",
    batch_size: Annotated[int, typer.Option(help="images per sampling batch (whole groups)")] = 16,
    group_size: int = 4,
    num_steps: int = 10,
    window_size: Annotated[int, typer.Option(help="SDE (trained) steps per trajectory")] = 2,
    batches: Annotated[int, typer.Option(help="sampling batches in the rollout phase")] = 4,
    reward_latency: Annotated[float, typer.Option(help="seconds a batch waits on a reward elsewhere")] = 0.0,
    repeats: Annotated[int, typer.Option(min=1, help="timed rounds; medians are reported")] = 3,
    threads: Annotated[int | None, typer.Option(help="CPU threads; 1 is steadier on a shared machine")] = None,
    seed: int = 0,
    output: Annotated[Path, typer.Option(help="where to write the JSON result")] = Path("outputs/bench/grpo_step.json"),
) -> None:
    if preset not in ("tiny", "sd3_5_medium"):
        raise typer.BadParameter(f"{preset!r}; expected tiny or sd3_5_medium", param_hint="--preset")
    result = run_benchmark(
        preset=preset,
        device=device,
        dtype=dtype,
        batch_size=batch_size,
        group_size=group_size,
        num_steps=num_steps,
        window_size=window_size,
        batches=batches,
        reward_latency=reward_latency,
        repeats=repeats,
        threads=threads,
        seed=seed,
    )
    finish(result, output, print_result)


if __name__ == "__main__":
    typer.run(main)
