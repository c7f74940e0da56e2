"""`vlmr train-rm`: train a progress or preference reward model with accelerate.

One loop for both tasks: batches come from a deterministic sampler, the loss is the head's per-frame
progress loss (plus, with success, stage and goal-offset heads, their BCE, cross-entropy and squared error on
frames whose labels are known, weighted by `optim.success_loss_weight` / `stage_loss_weight` /
`goal_offset_loss_weight`) or Bradley–Terry on pairs.
accelerate handles devices, data-parallel processes and mixed precision (bf16 on GPUs that have it);
checkpoints hold model, optimizer, scheduler and RNG states, and a resumed run continues at the saved
step with the same batches. Periodic evaluation
goes through the reward interface, exactly as users will call the model.

Steps: `optim.steps` counts micro-steps (one batch of `optim.batch_size` per process each); the
optimizer updates every `optim.gradient_accumulation` of them, and the LR schedule (warmup counted in
optimizer updates) runs over exactly those updates whatever the number of processes.

Each checkpoint saves the resolved config; resuming with settings that change training refuses and
names the keys. Library code: it logs through `logging`; the progress display is an injected `track`.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from vlm_rewards.annotation.lerobot_episodes import LeRobotEpisodes
from vlm_rewards.config import changed_settings
from vlm_rewards.data.build import SyntheticData, open_episodes, open_pairs
from vlm_rewards.evaluation.evaluate import evaluate_pair_dataset, evaluate_progress
from vlm_rewards.evaluation.plots import plot_progress_curves, plot_training_curves
from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.io import write_json
from vlm_rewards.models.backbones import build_tiny_backbone
from vlm_rewards.models.heads import (
    bradley_terry_loss,
    goal_offset_loss,
    stage_loss,
    step_correlation_loss,
    success_loss,
)
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.models.trained_reward import TrainedRewardModel
from vlm_rewards.resources import SHIPPED_BACKBONE, shipped_backbone
from vlm_rewards.tracking import Track, untracked
from vlm_rewards.training.batches import PreferenceBatches, ProgressBatch, ProgressBatches
from vlm_rewards.training.config import TrainRMConfig

CHECKPOINT_PATTERN = re.compile(r"^step_(\d+)$")
CHECKPOINT_CONFIG = "train_config.json"
# Keys that may change between a checkpoint and its resumption: they do not change the trained weights.
RESUME_MAY_CHANGE = (
    "output_dir",
    "resume",
    "log_every",
    "eval_every",
    "save_every",
    "keep_checkpoints",
    "data.eval",
    "data.synthetic_eval",
    "data.lerobot.eval_episodes",
)

logger = logging.getLogger(__name__)


def run_training(config: TrainRMConfig, track: Track | None = None) -> dict[str, Any]:
    """Train, checkpoint, evaluate and export `config.output_dir/model`; returns the final metrics.

    track: a progress display for the step loop and data building (the CLI passes tqdm).
    """
    checkpoint = _resumable_checkpoint(config) if config.resume else None
    accelerator = Accelerator(
        mixed_precision=_mixed_precision(config.optim.mixed_precision),
        gradient_accumulation_steps=config.optim.gradient_accumulation,
        log_with="tensorboard",
        project_dir=str(config.output_dir),
    )
    if not config.resume:
        _clear_checkpoints(accelerator, config.output_dir)
    set_seed(config.seed)
    task = config.model.reward.task
    main_track = track if accelerator.is_local_main_process else None
    with accelerator.main_process_first():
        train_data, eval_data = _datasets(config, main_track)
        model = _build_model(config)
    batches = (
        ProgressBatches(
            train_data,
            config.optim.batch_size,
            config.data.augment,
            config.seed,
            config.model.reward.max_frames,
            config.data.clip_frames,
            config.data.clip_shuffle,
        )
        if task == "progress"
        else PreferenceBatches(train_data, config.optim.batch_size, config.seed)
    )
    head = [p for p in model.head.parameters() if p.requires_grad]
    backbone = [p for name, p in model.named_parameters() if p.requires_grad and not name.startswith("head.")]
    trainable = backbone + head
    groups = [{"params": backbone, "name": "backbone"}, {"params": head, "name": "head"}]
    optimizer = torch.optim.AdamW(groups, lr=config.optim.lr, weight_decay=config.optim.weight_decay)
    scheduler = build_scheduler(optimizer, config, accelerator.num_processes)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.init_trackers("train_rm", config={"task": task, "lr": config.optim.lr, "seed": config.seed})

    start_step = _resume(accelerator, checkpoint) if checkpoint is not None else 0
    accelerator.step = start_step  # accumulation phase: micro-step `start_step` is where the saved run was
    history = _load_history(config.output_dir, up_to=start_step)
    model.train()
    steps = range(start_step, config.optim.steps)
    for step in (main_track or untracked)(steps, f"train {task} RM"):
        with accelerator.accumulate(model):
            loss = _loss(accelerator.unwrap_model(model), model, batches, step, accelerator.process_index, config)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(trainable, config.optim.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        done = step + 1
        if done % config.log_every == 0 or done == config.optim.steps:
            logs = {
                "train/loss": accelerator.gather(loss.detach()).mean().item(),
                "train/lr": scheduler.get_last_lr()[0],
            }
            accelerator.log(logs, step=done)
            _record(history, logs, done)
            if accelerator.is_main_process:
                logger.info("step %d: loss %.4f, lr %.3g", done, logs["train/loss"], logs["train/lr"])
        if done % config.eval_every == 0 and done < config.optim.steps:
            _evaluate(accelerator, model, eval_data, config, history, done)
        if done % config.save_every == 0 or done == config.optim.steps:
            _save_checkpoint(accelerator, config, done, history)

    metrics = _evaluate(accelerator, model, eval_data, config, history, config.optim.steps, final=True)
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        version = unwrapped.save_pretrained(
            config.output_dir / "model", extra={"step": config.optim.steps, "metrics": metrics}
        )
        logger.info("saved reward model %s (version %s)", config.output_dir / "model", version)
    accelerator.end_training()
    return metrics


def _loss(model: RewardNetwork, wrapped, batches, step: int, rank: int, config: TrainRMConfig) -> torch.Tensor:
    """`model` builds inputs; `wrapped` (the accelerate/DDP module) runs the forward."""
    batch = batches.batch(step, rank)
    if isinstance(batch, ProgressBatch):
        inputs = model.encode(batch.requests)
        outputs = wrapped(inputs)
        logits, mask, frames = outputs.progress, inputs.frame_mask, outputs.progress.shape[1]
        labels = batch.labels.to(logits.device)[:, :frames]
        loss = model.head.progress_loss(logits, labels, mask)
        if config.optim.step_loss_weight:
            steps = step_correlation_loss(model.head.predict(logits), labels, mask)
            loss = loss + config.optim.step_loss_weight * steps
        if outputs.success is not None:
            success = success_loss(outputs.success, batch.success.to(logits.device)[:, :frames], mask)
            loss = loss + config.optim.success_loss_weight * success
        if outputs.stage is not None:
            stages = batch.stage.to(logits.device)[:, :frames]
            if int(stages.max()) >= outputs.stage.shape[-1]:
                raise ValueError(
                    f"stage label {int(stages.max())} in the training data, but model.reward.num_stages is "
                    f"{outputs.stage.shape[-1]} (labels 0..{outputs.stage.shape[-1] - 1}); raise num_stages"
                )
            loss = loss + config.optim.stage_loss_weight * stage_loss(outputs.stage, stages, mask)
        if outputs.goal_offset is not None:
            offsets = batch.goal_offset.to(logits.device)[:, :frames]
            loss = loss + config.optim.goal_offset_loss_weight * goal_offset_loss(outputs.goal_offset, offsets, mask)
        return loss
    inputs = model.encode(batch.chosen + batch.rejected)
    rewards = model.last_frame(model.head.predict(wrapped(inputs).progress), inputs.frame_mask)
    chosen, rejected = rewards.chunk(2)
    margin = config.data.margin_scale * batch.margins.to(rewards.device)
    return bradley_terry_loss(chosen, rejected, margin, batch.ties.to(rewards.device))


@torch.no_grad()
def _evaluate(accelerator, model, eval_data, config: TrainRMConfig, history, step: int, final: bool = False) -> dict:
    """Metrics through the reward interface, on the main process; logged, plotted and returned."""
    if not accelerator.is_main_process:
        return {}
    unwrapped: RewardNetwork = accelerator.unwrap_model(model)
    unwrapped.eval()
    reward = TrainedRewardModel(unwrapped, version=f"step-{step}", name=f"{unwrapped.config.task}-rm")
    if unwrapped.config.task == "progress":
        metrics, curves = evaluate_progress(
            reward,
            eval_data,
            config.optim.batch_size,
            np.random.default_rng(config.seed),
            clip_frames=config.data.clip_frames,
        )
    else:
        metrics, curves = evaluate_pair_dataset(reward, eval_data, config.optim.batch_size), []
    unwrapped.train()
    numeric = {f"eval/{k}": float(v) for k, v in metrics.items() if isinstance(v, int | float)}
    accelerator.log(numeric, step=step)
    _record(history, numeric, step)
    plot_training_curves(config.output_dir / "training_curves.png", history)
    write_json(config.output_dir / "history.json", history)
    if final:
        write_json(config.output_dir / "metrics.json", {"step": step, **metrics})
        if curves:
            expert_first = sorted(curves, key=lambda curve: not curve["title"].startswith("expert"))
            plot_progress_curves(config.output_dir / "progress_curves.png", expert_first)
    logger.info("step %d: %s", step, ", ".join(f"{k}={v:.3f}" for k, v in metrics.items() if isinstance(v, float)))
    return metrics


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainRMConfig, num_processes: int):
    """Cosine with warmup over the run's optimizer updates, as accelerate will step it.

    accelerate's `AcceleratedScheduler` (split_batches=False, step_with_optimizer=True) steps the
    wrapped scheduler only on sync (optimizer-update) micro-steps, and then `num_processes` times:
    so the schedule's length is updates × processes, its warmup warmup_steps × processes.
    A param group named "backbone" stays at lr 0 for `optim.head_only_updates`, then runs the same
    schedule over the remaining updates.
    """
    optim = config.optim
    updates = optim.steps // optim.gradient_accumulation * num_processes
    warmup, probe = optim.warmup_steps * num_processes, optim.head_only_updates * num_processes
    schedule = _cosine_with_warmup(warmup, updates)
    after_probe = _cosine_with_warmup(warmup, updates - probe)

    def backbone(step: int) -> float:
        return 0.0 if step < probe else after_probe(step - probe)

    lambdas = [backbone if group.get("name") == "backbone" else schedule for group in optimizer.param_groups]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)


def _cosine_with_warmup(warmup: int, total: int):
    """LR factor: linear from 0 over `warmup` steps, then half a cosine down to 0 at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, total - warmup))))

    return factor


def tiny_backbone_dir(config: TrainRMConfig) -> Path:
    """Where the tiny backbone of these settings lives: a sub-folder named by their fingerprint."""
    return config.output_dir / "tiny_backbone" / fingerprint("tiny-backbone/v1", config.model.tiny.model_dump())


def _build_model(config: TrainRMConfig) -> RewardNetwork:
    settings = config.model
    backbone_path = settings.backbone
    if backbone_path == SHIPPED_BACKBONE:
        backbone_path = shipped_backbone()
    elif backbone_path == "tiny":
        backbone_path = tiny_backbone_dir(config)
        if not (backbone_path / "config.json").exists():
            logger.info("building a tiny %s backbone in %s", settings.tiny.family, backbone_path)
            if backbone_path.exists():  # a build that crashed part-way
                shutil.rmtree(backbone_path)
            partial = backbone_path.with_name(f".{backbone_path.name}.partial")
            shutil.rmtree(partial, ignore_errors=True)
            build_tiny_backbone(out_dir=partial, **settings.tiny.model_dump())
            partial.rename(backbone_path)
    options = {"attn_implementation": settings.attn_implementation} if settings.attn_implementation else {}
    model = RewardNetwork.from_backbone(backbone_path, settings.reward, **options)
    if settings.freeze_vision:
        model.backbone.visual.requires_grad_(False)
    if settings.gradient_checkpointing:
        model.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if settings.lora.enabled:
        apply_lora(model, settings.lora, settings.freeze_vision)
    return model


def apply_lora(model: RewardNetwork, lora, freeze_vision: bool) -> None:
    """Wrap the backbone with LoRA adapters on `lora.target_modules` (peft semantics: a list of module
    name suffixes, or a regex the full module name must match).

    With `freeze_vision`, no adapter may land in the vision tower (`visual`): bare names like
    `gate_proj` also match Qwen2.5-VL's vision MLPs, so that is a ValueError naming the modules.
    """
    from peft import LoraConfig, get_peft_model

    model.backbone = get_peft_model(
        model.backbone,
        LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules),
    )
    if freeze_vision:
        in_vision = sorted(
            {
                name.rsplit(".lora_", 1)[0].removeprefix("base_model.model.")
                for name, _ in model.backbone.named_modules()
                if ".lora_" in name and _in_vision_tower(name)
            }
        )
        if in_vision:
            shown = ", ".join(in_vision[:4]) + (f" and {len(in_vision) - 4} more" if len(in_vision) > 4 else "")
            raise ValueError(
                f"model.lora.target_modules {lora.target_modules!r} puts LoRA adapters in the vision tower "
                f"({shown}) although model.freeze_vision is true; restrict the targets to the language model, "
                r"e.g. target_modules: 'language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)'"
            )


def _in_vision_tower(module_name: str) -> bool:
    return any(part in ("visual", "vision_tower", "vision_model") for part in module_name.split("."))


def _datasets(config: TrainRMConfig, track: Track | None = None) -> tuple[Any, Any]:
    task = config.model.reward.task
    data = config.data
    if data.format == "lerobot":
        return (
            LeRobotEpisodes(data.train, data.lerobot, data.lerobot.train_episodes),
            LeRobotEpisodes(data.eval or data.train, data.lerobot, data.lerobot.eval_episodes),
        )
    data_dir = config.output_dir / "data"
    return (
        _dataset(task, config.data.train, data_dir / f"{task}_train", config.data.synthetic_train, track),
        _dataset(task, config.data.eval, data_dir / f"{task}_eval", config.data.synthetic_eval, track),
    )


def _dataset(task: str, given: Path | None, synthetic_dir: Path, synthetic: SyntheticData, track: Track | None):
    return (open_episodes if task == "progress" else open_pairs)(given, synthetic, synthetic_dir, track=track)


def _mixed_precision(setting: str) -> str:
    if setting != "auto":
        return setting
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def _checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    folder = output_dir / "checkpoints"
    found = [(int(m.group(1)), p) for p in folder.glob("step_*") if (m := CHECKPOINT_PATTERN.match(p.name))]
    return sorted(path for path in found if (path[1] / "complete").exists())


def _save_checkpoint(accelerator: Accelerator, config: TrainRMConfig, step: int, history) -> None:
    """accelerate state (model, optimizer, scheduler, RNG) + a `complete` marker written last."""
    path = config.output_dir / "checkpoints" / f"step_{step}"
    accelerator.save_state(str(path))
    if accelerator.is_main_process:
        write_json(config.output_dir / "history.json", history)
        write_json(path / CHECKPOINT_CONFIG, config.model_dump(mode="json"))
        (path / "complete").write_text(f"{step}\n")
        for _, old in _checkpoints(config.output_dir)[: -config.keep_checkpoints]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()


def _resumable_checkpoint(config: TrainRMConfig) -> tuple[int, Path] | None:
    """The latest complete checkpoint, after checking it was trained with these settings.

    Settings that change training (anything but `RESUME_MAY_CHANGE`) must match the checkpoint's
    saved config; otherwise a ValueError names the differing keys (a changed head included).
    """
    checkpoints = _checkpoints(config.output_dir)
    if not checkpoints:
        return None
    step, path = checkpoints[-1]
    saved_path = path / CHECKPOINT_CONFIG
    try:
        saved = json.loads(saved_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{saved_path}: cannot read the checkpoint's settings ({error}); set resume=false to start over "
            "or use another output_dir"
        ) from None
    differing = changed_settings(saved, config.model_dump(mode="json"), RESUME_MAY_CHANGE)
    if differing:
        raise ValueError(
            f"cannot resume from {path}: these settings differ from the checkpoint's: {'; '.join(differing)}. "
            "Restore them, "
            "set resume=false to start over, or use another output_dir"
        )
    return step, path


def _clear_checkpoints(accelerator: Accelerator, output_dir: Path) -> None:
    """resume=false starts over: an earlier run's checkpoints would otherwise outlive this run's rotation."""
    if accelerator.is_main_process and _checkpoints(output_dir):
        logger.warning("resume=false: removing the earlier run's checkpoints in %s", output_dir / "checkpoints")
        shutil.rmtree(output_dir / "checkpoints")
        (output_dir / "history.json").unlink(missing_ok=True)
    accelerator.wait_for_everyone()


def _resume(accelerator: Accelerator, checkpoint: tuple[int, Path]) -> int:
    step, path = checkpoint
    accelerator.load_state(str(path))
    logger.info("resumed from %s at step %d", path, step)
    return step


def _load_history(output_dir: Path, up_to: int) -> dict[str, list[tuple[int, float]]]:
    """Logged values up to the resumed step (a fresh run, up_to=0, starts empty)."""
    path = output_dir / "history.json"
    if up_to == 0 or not path.exists():
        return {}
    history = json.loads(path.read_text())
    return {key: [(step, value) for step, value in points if step <= up_to] for key, points in history.items()}


def _record(history: dict[str, list[tuple[int, float]]], values: dict[str, float], step: int) -> None:
    for key, value in values.items():
        history.setdefault(key, []).append((step, value))
