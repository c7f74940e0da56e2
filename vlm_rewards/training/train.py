"""`vlmr train-rm`: train a progress or preference reward model with accelerate.

One loop for both tasks: batches come from a deterministic sampler, the loss is the head's per-frame
progress loss or Bradley–Terry on pairs. accelerate handles devices, data-parallel processes and
mixed precision (bf16 on GPUs that have it); checkpoints hold model, optimizer, scheduler and RNG
states, and a resumed run continues at the saved step with the same batches. Periodic evaluation
goes through the reward interface, exactly as users will call the model.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from rich.console import Console
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from vlm_rewards.data.build import SyntheticData, open_episodes, open_pairs
from vlm_rewards.evaluation.evaluate import evaluate_pair_dataset, evaluate_progress
from vlm_rewards.evaluation.plots import plot_progress_curves, plot_training_curves
from vlm_rewards.io import write_json
from vlm_rewards.models.backbones import build_tiny_backbone
from vlm_rewards.models.heads import bradley_terry_loss
from vlm_rewards.models.reward_model import VLMReward, VLMRewardModel
from vlm_rewards.training.batches import PreferenceBatches, ProgressBatch, ProgressBatches
from vlm_rewards.training.config import TrainRMConfig

CHECKPOINT_PATTERN = re.compile(r"^step_(\d+)$")


def run_training(config: TrainRMConfig, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    accelerator = Accelerator(
        mixed_precision=_mixed_precision(config.optim.mixed_precision),
        gradient_accumulation_steps=config.optim.gradient_accumulation,
        log_with="tensorboard",
        project_dir=str(config.output_dir),
    )
    set_seed(config.seed)
    task = config.model.reward.task
    with accelerator.main_process_first():
        train_data, eval_data = _datasets(config)
        model = _build_model(config)
    batches = (
        ProgressBatches(train_data, config.optim.batch_size, config.data.augment, config.seed)
        if task == "progress"
        else PreferenceBatches(train_data, config.optim.batch_size, config.seed)
    )
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.optim.lr, weight_decay=config.optim.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, config.optim.warmup_steps, config.optim.steps)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.init_trackers("train_rm", config={"task": task, "lr": config.optim.lr, "seed": config.seed})

    start_step = _resume(accelerator, config, console) if config.resume else 0
    history = _load_history(config.output_dir, up_to=start_step)
    progress_bar = tqdm(
        range(start_step, config.optim.steps),
        initial=start_step,
        total=config.optim.steps,
        desc=f"train {task} RM",
        disable=not accelerator.is_local_main_process,
    )
    model.train()
    for step in progress_bar:
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
            progress_bar.set_postfix(loss=f"{logs['train/loss']:.4f}")
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
        console.print(f"saved reward model {config.output_dir / 'model'} (version {version})")
    accelerator.end_training()
    return metrics


def _loss(model: VLMRewardModel, wrapped, batches, step: int, rank: int, config: TrainRMConfig) -> torch.Tensor:
    """`model` builds inputs; `wrapped` (the accelerate/DDP module) runs the forward."""
    batch = batches.batch(step, rank)
    if isinstance(batch, ProgressBatch):
        inputs = model.encode(batch.requests)
        logits = wrapped(inputs)
        labels = batch.labels.to(logits.device)[:, : logits.shape[1]]
        return model.head.progress_loss(logits, labels, inputs.frame_mask)
    inputs = model.encode(batch.chosen + batch.rejected)
    rewards = model.last_frame(model.head.predict(wrapped(inputs)), inputs.frame_mask)
    chosen, rejected = rewards.chunk(2)
    margin = config.data.margin_scale * batch.margins.to(rewards.device)
    return bradley_terry_loss(chosen, rejected, margin, batch.ties.to(rewards.device))


@torch.no_grad()
def _evaluate(accelerator, model, eval_data, config: TrainRMConfig, history, step: int, final: bool = False) -> dict:
    """Metrics through the reward interface, on the main process; logged, plotted and returned."""
    if not accelerator.is_main_process:
        return {}
    unwrapped: VLMRewardModel = accelerator.unwrap_model(model)
    unwrapped.eval()
    reward = VLMReward(unwrapped, version=f"step-{step}", name=f"{unwrapped.config.task}-rm")
    if unwrapped.config.task == "progress":
        metrics, curves = evaluate_progress(
            reward, eval_data, config.optim.batch_size, np.random.default_rng(config.seed)
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
    tqdm.write(f"step {step}: " + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items() if isinstance(v, float)))
    return metrics


def _build_model(config: TrainRMConfig) -> VLMRewardModel:
    settings = config.model
    backbone_path = settings.backbone
    if backbone_path == "tiny":
        backbone_path = config.output_dir / "tiny_backbone"
        if not (backbone_path / "config.json").exists():
            build_tiny_backbone(out_dir=backbone_path, **settings.tiny.model_dump())
    options = {"attn_implementation": settings.attn_implementation} if settings.attn_implementation else {}
    model = VLMRewardModel.from_backbone(backbone_path, settings.reward, **options)
    if settings.freeze_vision:
        model.backbone.visual.requires_grad_(False)
    if settings.gradient_checkpointing:
        model.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if settings.lora.enabled:
        from peft import LoraConfig, get_peft_model

        lora = settings.lora
        model.backbone = get_peft_model(
            model.backbone,
            LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules),
        )
    return model


def _datasets(config: TrainRMConfig) -> tuple[Any, Any]:
    task = config.model.reward.task
    data_dir = config.output_dir / "data"
    return (
        _dataset(task, config.data.train, data_dir / f"{task}_train", config.data.synthetic_train),
        _dataset(task, config.data.eval, data_dir / f"{task}_eval", config.data.synthetic_eval),
    )


def _dataset(task: str, given: Path | None, synthetic_dir: Path, synthetic: SyntheticData):
    return (open_episodes if task == "progress" else open_pairs)(given, synthetic, synthetic_dir)


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
        (path / "complete").write_text(f"{step}\n")
        for _, old in _checkpoints(config.output_dir)[: -config.keep_checkpoints]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()


def _resume(accelerator: Accelerator, config: TrainRMConfig, console: Console) -> int:
    checkpoints = _checkpoints(config.output_dir)
    if not checkpoints:
        return 0
    step, path = checkpoints[-1]
    accelerator.load_state(str(path))
    console.print(f"resumed from {path} at step {step}")
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
