"""`vlmr grpo`: GRPO fine-tuning of a flow-matching (SD3, Flux) or DDIM generator with LoRA, accelerate and rewards.

One epoch: sample `batches_per_epoch` batches of whole prompt groups (rewards scored while the next
batch samples), turn rewards into group advantages, then PPO-clip updates on the recorded stochastic
steps (gradients accumulated over a trajectory's steps, one optimizer step per minibatch). The
reference policy for the KL term is the same network with its LoRA disabled. Every seed is derived
from (seed, epoch, batch, process), so a resumed run samples exactly what an uninterrupted one would.
Each epoch's logs go to metrics.jsonl and TensorBoard (output_dir/tensorboard, with image grids and the
per-optimizer-step clip statistics; docs/generation.md, "Training diagnostics").

A checkpoint is saved every `checkpoint_every` epochs and after the last one. A rerun resumes from the
latest: only if its settings match the checkpoint's (`RESUME_MAY_CHANGE` lists the exceptions), with
metrics.jsonl cut back to the checkpoint's epoch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, set_seed
from peft import LoraConfig, get_peft_model

from vlm_rewards.config import changed_settings
from vlm_rewards.generation.config import GRPOConfig, LRSchedule, ModelSettings, Train
from vlm_rewards.generation.ema import ParameterEMA
from vlm_rewards.generation.export import export_final
from vlm_rewards.generation.grpo import (
    Advantages,
    ClipTracker,
    check_prefer,
    combined_advantages,
    pairwise_win_rates,
    ppo_clip_loss,
    ratio_diagnostics,
    reward_diagnostics,
)
from vlm_rewards.generation.models import (
    LORA_TARGETS,
    ImageGenerator,
    PromptEmbeddings,
    build_tiny_generator,
    check_generator,
    load_pretrained_generator,
    load_tiny_generator,
    predict,
)
from vlm_rewards.generation.prompts import resolve_prompts
from vlm_rewards.generation.rewards import RewardSet, Scores, collect_rollouts
from vlm_rewards.generation.sampling import Rollout, sample_deterministic, sample_rollout
from vlm_rewards.generation.sde import gaussian_mean_kl, step_distribution, step_with_logprob
from vlm_rewards.io import atomic_folder, atomic_path, write_json

logger = logging.getLogger(__name__)

CHECKPOINT_CONFIG = "config.json"
TENSORBOARD = "tensorboard"  # output_dir/tensorboard: the event files
SAMPLE_GROUPS = 8  # prompt groups of each epoch's rollouts shown in TensorBoard (a row each)
# What a resumed run may change: how long it runs, what it evaluates and logs. Anything else changes what it
# trains, so resuming is refused. A cosine schedule follows the new train.epochs (`epoch_lr`).
RESUME_MAY_CHANGE = (
    "output_dir",
    "resume",
    "train.epochs",
    "train.eval_prompts",
    "train.eval_images_per_prompt",
    "train.log_reference_kl",
    "train.gradient_checkpointing",
    "sampling.eval_num_steps",
    "sampling.eval_guidance_scale",
    "rewards.gold",
    "eval_every",
    "checkpoint_every",
    "keep_checkpoints",
    "keep_best_by",
    "export",
)
START_OVER = "set resume=false to start over (this removes the checkpoints in output_dir), or use another output_dir"

# one epoch of sampling and updating: (accelerator, generator, denoiser, optimizer, rewards, config, epoch, ema)
EpochStep = Callable[..., dict[str, float]]
# (accelerator, the trained LoRA parameters) -> the epoch step of an algorithm with state of its own
StepBuilder = Callable[[Accelerator, list[torch.nn.Parameter]], EpochStep]


def run_grpo(
    config: GRPOConfig,
    track: Callable[..., Iterable] | None = None,
    epoch_step: EpochStep | None = None,
    prepare_step: StepBuilder | None = None,
) -> dict[str, list]:
    """Train; returns the history (metric -> [(epoch, value)]). `track` wraps the epoch loop (a progress bar).

    `epoch_step` is one epoch of sampling and updating (`grpo_epoch` by default; `vlm_rewards.generation.rwr` passes
    reward-weighted regression's): everything around it (LoRA, evaluation, checkpoints, resume) is shared.
    `prepare_step` builds the epoch step instead, once the accelerator and the LoRA exist and before a checkpoint
    is loaded, for an algorithm with state to checkpoint (`vlm_rewards.generation.nft`'s sampling policy).
    """
    epoch_step = epoch_step or grpo_epoch
    config = resolve_prompts(config)  # prompt files read and their splits checked before anything is built
    rewards = build_rewards(config)  # bad reward configs fail before any model is built
    if config.train.advantage == "pairwise":
        check_prefer(rewards.trained)
    checkpoint = resumable_checkpoint(config) if config.resume else None  # so do changed settings
    accelerator = Accelerator(
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.sampling.steps_per_trajectory,
        log_with="tensorboard",
        project_dir=config.output_dir,
    )
    set_seed(config.seed)
    generator = build_generator(config.model)
    check_generator(generator)
    if config.train.gradient_checkpointing:
        enable_gradient_checkpointing(generator.denoiser)
    generator.denoiser = add_lora(generator.denoiser, config.model)
    trainable = lora_parameters(generator.denoiser)
    optimizer = torch.optim.AdamW(trainable, lr=config.train.lr, weight_decay=config.train.weight_decay)
    denoiser, optimizer = accelerator.prepare(generator.denoiser, optimizer)
    ema = ParameterEMA(trainable, config.train.ema_decay) if config.train.ema_decay else None
    if ema is not None:
        accelerator.register_for_checkpointing(ema)
    if prepare_step is not None:
        epoch_step = prepare_step(accelerator, trainable)
    start_epoch, history = load_checkpoint(accelerator, checkpoint) if checkpoint else (0, {})
    truncate_logs(accelerator, config, checkpoint)
    accelerator.init_trackers(TENSORBOARD)
    if start_epoch == 0 and config.eval_every:  # the starting model, for comparison
        record(accelerator, config, history, evaluate(accelerator, generator, rewards, config, 0), 0)
        keep_best(accelerator, denoiser, ema, config, history, 0)
    epochs = range(start_epoch, config.train.epochs)
    for epoch in track(epochs, "epochs") if track else epochs:
        lr = epoch_lr(config.train, epoch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        logs = epoch_step(accelerator, generator, denoiser, optimizer, rewards, config, epoch, ema) | {"train/lr": lr}
        if config.eval_every and (epoch + 1) % config.eval_every == 0:
            with ema.applied() if ema is not None else nullcontext():
                logs |= evaluate(accelerator, generator, rewards, config, epoch + 1)
        record(accelerator, config, history, logs, epoch + 1)
        keep_best(accelerator, denoiser, ema, config, history, epoch + 1)
        last = epoch + 1 == config.train.epochs
        if last or (config.checkpoint_every and (epoch + 1) % config.checkpoint_every == 0):
            save_checkpoint(accelerator, config, epoch + 1, history)
    export_final(accelerator, generator, denoiser, ema, config)  # last: a merged export consumes the adapter
    accelerator.end_training()
    return history


def epoch_lr(train: Train, epoch: int) -> float:
    """An epoch's learning rate: a function of the epoch alone, so a resumed run continues the schedule."""
    return train.lr * schedule_factor(train.lr_schedule, epoch, train.epochs)


def schedule_factor(schedule: LRSchedule, done: int, total: int) -> float:
    """The learning rate over its peak after `done` of `total` steps (or epochs): 1, or a cosine from 1 to 0."""
    return 0.5 * (1 + math.cos(math.pi * done / total)) if schedule == "cosine" else 1.0


def grpo_epoch(
    accelerator: Accelerator,
    generator: ImageGenerator,
    denoiser: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rewards: RewardSet,
    config: GRPOConfig,
    epoch: int,
    ema: ParameterEMA | None = None,
) -> dict[str, float]:
    """Sample, score, compute advantages and update; returns the epoch's diagnostics."""
    rollout, advantages, logs = sample_epoch(accelerator, generator, denoiser, rewards, config, epoch)
    if advantages.keep.any():
        logs |= update_policy(accelerator, generator, denoiser, optimizer, rollout, advantages, config, epoch, ema)
    else:
        logger.warning("epoch %d: every group has zero reward std; no update", epoch)
    return logs


def sample_epoch(
    accelerator: Accelerator,
    generator: ImageGenerator,
    denoiser: torch.nn.Module,
    rewards: RewardSet,
    config: GRPOConfig,
    epoch: int,
) -> tuple[Rollout, Advantages, dict[str, float]]:
    """The epoch's rollouts (scored while the next batch samples), their advantages and diagnostics."""
    denoiser.eval()  # no dropout: the training forward must equal the sampling forward (ratio 1)

    def sample_batch(batch: int) -> Rollout:
        seed = derived_seed(config.seed, epoch, batch, accelerator.process_index)
        prompts = batch_prompts(config, seed)
        negative = negative_embeddings(generator, len(prompts), config)
        return sample_rollout(generator, prompts, config.sampling, seed, denoiser, negative)

    rollout, scores, timings = asyncio.run(collect_rollouts(sample_batch, config.train.batches_per_epoch, rewards))
    trained = scores.trained
    if config.train.advantage == "pairwise":  # win rates within this process's groups
        start = time.perf_counter()
        trained = pairwise_win_rates(rewards.trained, rollout.images, rollout.prompts)
        timings["time/pairwise_s"] = time.perf_counter() - start
    gather = gather_object if accelerator.num_processes > 1 else None
    advantages = combined_advantages(
        trained,
        rewards.weights,
        rollout.prompts,
        config.rewards.aggregation,
        config.train.advantage_epsilon,
        gather,
        config.train.global_std,
    )
    log_image_grid(
        accelerator,
        "samples",
        rollout.images[: SAMPLE_GROUPS * config.train.group_size],
        epoch,
        config.train.group_size,
    )
    everywhere = gathered_scores(scores) if gather else scores
    logs = reward_diagnostics(everywhere.trained, everywhere.gold) | timings
    logs |= {"zero_std_ratio": advantages.zero_std_ratio, "dropped_samples": advantages.num_dropped}
    if accelerator.num_processes > 1:
        # DDP needs the same number of backward passes on every process: zero-std samples stay in with
        # advantage 0 (only the KL term acts on them) instead of being dropped
        advantages = replace(advantages, keep=np.ones_like(advantages.keep))
    return rollout, advantages, logs


def update_policy(
    accelerator: Accelerator,
    generator: ImageGenerator,
    denoiser: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rollout: Rollout,
    advantages: Advantages,
    config: GRPOConfig,
    epoch: int,
    ema: ParameterEMA | None = None,
) -> dict[str, float]:
    """PPO-clip updates over the kept samples: per minibatch, one backward per recorded step.

    Each optimizer step's clip fraction and approx KL go to TensorBoard (`optimizer_step/...`, at the run's
    optimizer step count); the epoch's logs get them per denoising step index and their largest value.
    """
    kept = np.flatnonzero(advantages.keep)
    generator.scheduler.set_timesteps(config.sampling.num_steps, device=accelerator.device)
    rng = np.random.default_rng(derived_seed(config.seed, epoch, "shuffle", accelerator.process_index))
    step_logs: list[dict[str, float]] = []
    agreement = GradientAgreement()
    clipping = ClipTracker(config.train.clip_range)
    for index, minibatch in minibatches(rollout, kept, config.train, rng):
        minibatch_advantages = torch.tensor(advantages.values[index], dtype=torch.float32, device=accelerator.device)
        for k in range(minibatch.latents.shape[1]):
            with accelerator.accumulate(denoiser):
                loss, logs = step_loss(
                    accelerator, generator, denoiser, minibatch, k, minibatch_advantages, config, clipping
                )
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(denoiser.parameters(), config.train.grad_clip)
                    agreement.add(denoiser)
                    optimizer_step = accelerator.step // accelerator.gradient_accumulation_steps
                    update = {f"optimizer_step/{name}": value for name, value in clipping.optimizer_step().items()}
                    accelerator.log(update, step=optimizer_step)
                optimizer.step()
                optimizer.zero_grad()
                if ema is not None and accelerator.sync_gradients:
                    ema.update()
            step_logs.append(logs)
    means = {f"train/{name}": float(np.mean([logs[name] for logs in step_logs])) for name in step_logs[0]}
    return means | agreement.logs() | clipping.logs()


class GradientAgreement:
    """Cosine similarity of consecutive minibatch gradients: how much of an update is signal.

    Near 0 means each minibatch points somewhere else (the policy gradient is mostly noise at this
    batch size, and Adam steps random-walk the weights); a persistent positive value means the
    minibatches agree on a direction.
    """

    def __init__(self) -> None:
        self.previous: torch.Tensor | None = None
        self.cosines: list[float] = []

    def add(self, module: torch.nn.Module) -> None:
        gradient = torch.cat([p.grad.detach().flatten() for p in module.parameters() if p.grad is not None])
        if self.previous is not None:
            self.cosines.append(torch.nn.functional.cosine_similarity(gradient, self.previous, dim=0).item())
        self.previous = gradient

    def logs(self) -> dict[str, float]:
        return {"train/gradient_cosine": float(np.mean(self.cosines))} if self.cosines else {}


def minibatches(
    rollout: Rollout, candidates: np.ndarray, train: Train, rng: np.random.Generator
) -> Iterator[tuple[np.ndarray, Rollout]]:
    """`train.inner_epochs` passes over the samples `candidates` in a new order each (drawn from `rng`), in
    minibatches of `train.train_batch_size`: (sample indices, the rollout's minibatch)."""
    for _ in range(train.inner_epochs):
        order = rng.permutation(candidates)
        for start in range(0, len(order), train.train_batch_size):
            index = order[start : start + train.train_batch_size]
            yield index, rollout.select(index)


def step_loss(
    accelerator: Accelerator,
    generator: ImageGenerator,
    denoiser: torch.nn.Module,
    minibatch: Rollout,
    k: int,
    advantages: torch.Tensor,
    config: GRPOConfig,
    clipping: ClipTracker | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The PPO-clip loss (+ β·KL to the LoRA-disabled reference) at recorded step k of a minibatch; `clipping`
    collects each sample's log-ratio by denoising step."""
    train, sampling = config.train, config.sampling
    device = accelerator.device
    latents, next_latents = minibatch.latents[:, k].to(device), minibatch.next_latents[:, k].to(device)
    timesteps, old_log_prob = minibatch.timesteps[:, k].to(device), minibatch.log_probs[:, k].to(device)
    embeddings = minibatch.embeddings
    negative = negative_embeddings(generator, len(minibatch), config)

    def denoise(model: torch.nn.Module) -> torch.Tensor:
        return predict(model, generator.family, latents, timesteps, embeddings, negative, sampling.guidance_scale)

    scheduler, noise_level, method = generator.scheduler, sampling.noise_level, sampling.method
    # the sampler's own step function, scoring the recorded next latents instead of drawing them
    _, log_prob, step = step_with_logprob(
        scheduler, denoise(denoiser), timesteps, latents, noise_level, method, prev_sample=next_latents
    )
    loss, ratio = ppo_clip_loss(log_prob, old_log_prob, advantages, train.clip_range, train.advantage_clip)
    if clipping is not None:
        clipping.add(log_prob - old_log_prob, minibatch.step_indices[:, k])
    logs = {"policy_loss": loss.item()} | ratio_diagnostics(ratio, log_prob, old_log_prob, train.clip_range)
    if train.kl_beta > 0 or train.log_reference_kl:
        policy = accelerator.unwrap_model(denoiser)
        with torch.no_grad(), policy.disable_adapter():
            reference = step_distribution(scheduler, denoise(policy), timesteps, latents, noise_level, method)
        kl = gaussian_mean_kl(step.mean, reference.mean, step.std).mean()
        logs["kl_reference"] = kl.item()
        if train.kl_beta > 0:
            loss = loss + train.kl_beta * kl
    return loss, logs


def evaluate(
    accelerator: Accelerator, generator: ImageGenerator, rewards: RewardSet, config: GRPOConfig, epoch: int
) -> dict[str, float]:
    """Deterministic samples of the eval prompts (fixed seed, `eval_guidance_scale`): mean rewards and a grid (a
    row per prompt when there are several images per prompt) as a PNG and in TensorBoard."""
    if not accelerator.is_main_process or not config.train.eval_prompts:
        return {}
    repeats = config.train.eval_images_per_prompt
    prompts = [prompt for prompt in config.train.eval_prompts for _ in range(repeats)]
    guidance_scale = config.sampling.evaluation_guidance_scale
    negative = negative_embeddings(generator, len(prompts), config, guidance_scale)
    images = sample_deterministic(
        generator, prompts, config.sampling.eval_num_steps, config.seed, guidance_scale, negative
    )
    scores = asyncio.run(rewards.ascore(images, prompts))
    columns = repeats if repeats > 1 else 8
    save_image_grid(images, config.output_dir / "eval" / f"epoch_{epoch:04d}.png", columns=columns)
    log_image_grid(accelerator, "eval", images, epoch, columns)
    means = {f"eval/reward/{name}": float(v.mean()) for name, v in scores.trained.items()}
    return means | {f"eval/gold/{name}": float(v.mean()) for name, v in scores.gold.items()}


# ----------------------------------------------------------------------------- building


def build_rewards(config: GRPOConfig) -> RewardSet:
    return RewardSet.build(
        trained={entry.name: (entry.config, entry.weight) for entry in config.rewards.trained},
        gold={entry.name: entry.config for entry in config.rewards.gold},
    )


def build_generator(settings: ModelSettings) -> ImageGenerator:
    if settings.pretrained is not None:
        return load_pretrained_generator(settings.pretrained, settings.family, settings.resolution)
    if settings.trained_tiny is not None:
        generator = load_tiny_generator(settings.trained_tiny)
        if generator.family != settings.family:
            raise ValueError(
                f"model.trained_tiny {settings.trained_tiny} is a {generator.family!r} model, not {settings.family!r}"
            )
        return generator
    return build_tiny_generator(settings.family, **settings.tiny.model_dump())


def enable_gradient_checkpointing(denoiser: torch.nn.Module) -> None:
    """diffusers' activation checkpointing of the denoiser's blocks (non-reentrant, so LoRA weights inside a block
    get their gradients even though the block's inputs need none)."""
    if not getattr(denoiser, "_supports_gradient_checkpointing", False):
        raise ValueError(
            f"train.gradient_checkpointing: {type(denoiser).__name__} does not support it; expected a diffusers "
            "model that does (SD3Transformer2DModel, FluxTransformer2DModel, UNet2DConditionModel)"
        )
    denoiser.enable_gradient_checkpointing()


def add_lora(denoiser: torch.nn.Module, settings: ModelSettings) -> torch.nn.Module:
    """Freeze the base and wrap it in a peft LoRA; `disable_adapter()` then gives the reference policy."""
    denoiser.requires_grad_(False)
    lora = settings.lora
    targets = lora.target_modules or LORA_TARGETS[settings.family]
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets)
    model = get_peft_model(denoiser, config)
    for parameter in model.parameters():
        if parameter.requires_grad:  # LoRA of a bf16 base: keep fp32 weights, bf16 Adam updates underflow
            parameter.data = parameter.data.float()
    return model


def lora_parameters(denoiser: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The trained (LoRA) parameters in a fixed order: the optimizer's and the EMA's, saved and reloaded alike."""
    return [p for p in denoiser.parameters() if p.requires_grad]


def batch_prompts(config: GRPOConfig, seed: int) -> list[str]:
    """sample_batch_size / group_size prompts drawn without replacement, each repeated group_size times."""
    train = config.train
    groups = train.sample_batch_size // train.group_size
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(train.prompts), size=groups, replace=groups > len(train.prompts))
    return [train.prompts[i] for i in chosen for _ in range(train.group_size)]


def gathered_scores(scores: Scores) -> Scores:
    """Every process's scores, for diagnostics over the whole batch."""

    def gather(table: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: np.asarray(gather_object(values.tolist())) for name, values in table.items()}

    return Scores(gather(scores.trained), gather(scores.gold))


def negative_embeddings(
    generator: ImageGenerator, count: int, config: GRPOConfig, guidance_scale: float | None = None
) -> PromptEmbeddings | None:
    """The empty prompt's embeddings when CFG applies (`guidance_scale`, default the sampling one, > 1), else None."""
    scale = config.sampling.guidance_scale if guidance_scale is None else guidance_scale
    return generator.encode_prompts([""] * count) if scale > 1 else None


def derived_seed(*parts: int | str) -> int:
    return int(np.random.SeedSequence([_as_int(part) for part in parts]).generate_state(1)[0])


def _as_int(part: int | str) -> int:
    return part if isinstance(part, int) else int.from_bytes(part.encode(), "little")


def image_grid(images: np.ndarray, columns: int = 8, scale: int = 8) -> np.ndarray:
    """(N, H, W, 3) uint8 -> one (rows·H·scale, columns·W·scale, 3) image, tiles upscaled by `scale` (nearest)
    so tiny images stay visible."""
    count, height, width, _ = images.shape
    rows = -(-count // columns)
    columns = min(columns, count)
    grid = np.zeros((rows * height, columns * width, 3), dtype=np.uint8)
    for i, image in enumerate(images):
        row, column = divmod(i, columns)
        grid[row * height : (row + 1) * height, column * width : (column + 1) * width] = image
    return grid.repeat(scale, axis=0).repeat(scale, axis=1)


def save_image_grid(images: np.ndarray, path: Path, columns: int = 8, scale: int = 8) -> None:
    """`image_grid` as a PNG."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image_grid(images, columns, scale)).save(path)


def log_image_grid(accelerator: Accelerator, tag: str, images: np.ndarray, epoch: int, columns: int) -> None:
    """An image grid in TensorBoard at this epoch, tiles upscaled to about 64 px (main process; no-op when the
    accelerator has no tracker, as in `diagnostics`)."""
    if accelerator.is_main_process and accelerator.trackers:
        grid = image_grid(images, columns, scale=max(1, 64 // images.shape[1]))
        accelerator.get_tracker(TENSORBOARD).log_images({tag: grid[None]}, step=epoch, dataformats="NHWC")


# ----------------------------------------------------------------------------- checkpoints and logs


def record(accelerator: Accelerator, config: GRPOConfig, history: dict, logs: dict[str, float], epoch: int) -> None:
    """An epoch's logs into the history, metrics.jsonl and TensorBoard (at step = epoch)."""
    for name, value in logs.items():
        history.setdefault(name, []).append((epoch, float(value)))
    if accelerator.is_main_process:
        config.output_dir.mkdir(parents=True, exist_ok=True)
        with open(config.output_dir / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps({"epoch": epoch, **{k: _json_float(v) for k, v in logs.items()}}) + "\n")
    accelerator.log({name: float(value) for name, value in logs.items()}, step=epoch)
    logger.info("epoch %d: %s", epoch, ", ".join(f"{k}={v:.4g}" for k, v in logs.items()))


def keep_best(
    accelerator: Accelerator,
    denoiser: torch.nn.Module,
    ema: ParameterEMA | None,
    config: GRPOConfig,
    history: dict,
    epoch: int,
) -> None:
    """Saves the evaluated weights to output_dir/best when this epoch's evaluation of `keep_best_by` beats
    every earlier one. The folder is what `shapes_eval --checkpoint` loads; it is replaced atomically.
    """
    metric = f"eval/reward/{config.keep_best_by}"
    if config.keep_best_by is None or not accelerator.is_main_process or not history.get(metric):
        return
    *earlier, (last_epoch, value) = history[metric]
    if last_epoch != epoch or any(previous >= value for _, previous in earlier):
        return
    with atomic_folder(config.output_dir / "best", replace=True) as folder:
        with ema.applied() if ema is not None else nullcontext():
            accelerator.save_model(denoiser, folder)
        write_json(folder / "best.json", {"epoch": epoch, "metric": metric, "value": value})


def checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    folder = output_dir / "checkpoints"
    found = [(int(path.name.split("_")[1]), path) for path in folder.glob("epoch_*") if (path / "complete").exists()]
    return sorted(found)


def save_checkpoint(accelerator: Accelerator, config: GRPOConfig, epoch: int, history: dict) -> None:
    """accelerate state (LoRA, optimizer, RNG) + history + settings; the `complete` marker is written last."""
    path = config.output_dir / "checkpoints" / f"epoch_{epoch:06d}"
    accelerator.save_state(str(path))
    if accelerator.is_main_process:
        (path / "history.json").write_text(json.dumps(history))
        write_json(path / CHECKPOINT_CONFIG, config.model_dump(mode="json"))
        (path / "complete").write_text(str(epoch))
        for _, old in checkpoints(config.output_dir)[: -config.keep_checkpoints]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()


def resumable_checkpoint(config: GRPOConfig) -> tuple[int, Path] | None:
    """The latest complete checkpoint, after checking it was trained with these settings, or None.

    Settings outside `RESUME_MAY_CHANGE` must equal the checkpoint's; otherwise a ValueError names them.
    """
    found = checkpoints(config.output_dir)
    if not found:
        return None
    epoch, path = found[-1]
    try:
        saved = json.loads((path / CHECKPOINT_CONFIG).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot resume from {path}: its settings cannot be read ({error}); {START_OVER}") from None
    changes = changed_settings(saved, config.model_dump(mode="json"), RESUME_MAY_CHANGE)
    if changes:
        raise ValueError(
            f"cannot resume from {path}: these settings differ from the checkpoint's: {'; '.join(changes)}. "
            f"Restore them, {START_OVER}"
        )
    return epoch, path


def load_checkpoint(accelerator: Accelerator, checkpoint: tuple[int, Path]) -> tuple[int, dict]:
    """(first epoch to run, history) from a checkpoint; weights that do not fit the model are a ValueError."""
    epoch, path = checkpoint
    try:
        accelerator.load_state(str(path))
    except RuntimeError as error:  # same settings, other weights: e.g. a trained_tiny folder re-pretrained
        if "Error(s) in loading state_dict" not in str(error):
            raise
        first, *others = [line.strip() for line in str(error).splitlines()[1:] if line.strip()] or [str(error)]
        more = f" (and {len(others)} more)" if others else ""
        raise ValueError(
            f"cannot resume from {path}: its weights do not fit this model: {first[:300]}{more} Restore the "
            f"model, {START_OVER}"
        ) from None
    saved = json.loads((path / "history.json").read_text())
    history = {name: [tuple(item) for item in values] for name, values in saved.items()}
    logger.info("resumed from %s (epoch %d)", path, epoch)
    return epoch, history


def truncate_logs(accelerator: Accelerator, config: GRPOConfig, checkpoint: tuple[int, Path] | None) -> None:
    """Logs as the resumed checkpoint left them: metrics.jsonl up to its epoch (a resumed run logs the later
    epochs again). A fresh run starts with no metrics, TensorBoard events and checkpoints: resume=false must
    not leave an earlier run's later checkpoints to outlive this run's rotation and be resumed from next time."""
    if accelerator.is_main_process:
        if checkpoint is None and (config.output_dir / "checkpoints").exists():
            logger.warning("starting over: removing the earlier run's checkpoints in %s", config.output_dir)
            shutil.rmtree(config.output_dir / "checkpoints")
        if checkpoint is None and (config.output_dir / TENSORBOARD).exists():
            shutil.rmtree(config.output_dir / TENSORBOARD)
        metrics = config.output_dir / "metrics.jsonl"
        if metrics.exists():
            last_epoch = checkpoint[0] if checkpoint else -1
            kept = [line for line in metrics.read_text().splitlines(True) if _logged_epoch(line) <= last_epoch]
            with atomic_path(metrics) as temporary:
                temporary.write_text("".join(kept))
    accelerator.wait_for_everyone()


def _logged_epoch(line: str) -> float:
    try:
        return json.loads(line)["epoch"]
    except ValueError:  # a row cut short by a kill: the checkpoint came before it
        return math.inf


def _json_float(value: float) -> float | None:
    return value if np.isfinite(value) else None
