"""The `vlmr train-rm` config: every knob, with defaults that train a tiny progress RM from scratch."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic

from vlm_rewards.config import JobConfig, OutputDir, Settings
from vlm_rewards.data.build import SyntheticData
from vlm_rewards.data.config import LeRobotSource
from vlm_rewards.models.config import FAMILIES, RewardNetworkConfig

Family = Literal[FAMILIES]  # type: ignore[valid-type]


class TinyBackbone(JobConfig):
    """A random Qwen-VL-architecture backbone with the project's tokenizer, for from-scratch runs."""

    family: Family = "qwen2_5_vl"
    """Qwen-VL architecture of the random backbone: qwen2_vl, qwen2_5_vl or qwen3_vl."""
    hidden_size: int = pydantic.Field(128, ge=1)
    """Width of the language model."""
    num_layers: int = pydantic.Field(2, ge=1)
    """Decoder layers of the language model."""
    num_heads: int = pydantic.Field(4, ge=1)
    """Attention heads of the language model."""
    num_kv_heads: int = pydantic.Field(2, ge=1)
    """Key/value heads of the language model (grouped-query attention; divides num_heads)."""
    vision_depth: int = pydantic.Field(2, ge=1)
    """Transformer blocks of the vision tower."""
    vision_hidden: int = pydantic.Field(64, ge=1)
    """Width of the vision tower."""
    vision_heads: int = pydantic.Field(4, ge=1)
    """Attention heads of the vision tower."""
    patch_size: int | None = pydantic.Field(None, ge=2)
    """Pixels per vision patch (two by two patches merge into one LM token); null: the family's own (14 for
    Qwen2/2.5-VL, 16 for Qwen3-VL), or the start model's. A 64-pixel frame is 2x2 tokens at 14, 4x4 at 8. A
    start model (init_from) with other patches starts with its patch embedding resized (`resize_patches`)."""
    seed: int = 0
    """Seed of the random initial weights."""


class Lora(JobConfig):
    enabled: bool = False
    """Train LoRA adapters (peft) on the backbone instead of all its weights; the head always trains fully."""
    r: int = pydantic.Field(16, ge=1)
    """Rank of each adapter."""
    alpha: float = pydantic.Field(32, gt=0)
    """LoRA scaling numerator: the update is scaled by alpha / r."""
    dropout: float = pydantic.Field(0.05, ge=0, lt=1)
    """Dropout on the adapters' input."""
    target_modules: list[str] | str = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """LoRA target modules, in peft semantics: a list of module-name suffixes, or one regex the full module
    name must match. Bare names match every tower: Qwen2.5-VL's vision MLPs also have gate_proj/up_proj/
    down_proj, so for MLP targets use a regex on the language model, e.g.
    'language_model.*\\.(gate_proj|up_proj)'. With model.freeze_vision, an adapter landing in the vision
    tower is an error."""


class ModelSettings(JobConfig):
    backbone: str = "simworld"
    """"simworld" (the shipped backbone pretrained on the simulated world: data/models/simworld-backbone),
    "tiny" (built from `tiny`, random weights: training from scratch), or a hub id / local Qwen-VL folder."""
    tiny: TinyBackbone = pydantic.Field(default_factory=TinyBackbone)
    """The random backbone's shape, used when backbone is "tiny"."""
    reward: RewardNetworkConfig = pydantic.Field(default_factory=RewardNetworkConfig)
    """The reward head and the model's input settings (task, head, frames, pixels)."""
    lora: Lora = pydantic.Field(default_factory=Lora)
    """LoRA adapters instead of full fine-tuning."""
    freeze_vision: bool = False
    """Keep the vision tower's weights fixed."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, about a third more compute."""
    attn_implementation: str | None = None
    """Attention kernel passed to transformers; None: its default (sdpa)."""


class Augment(JobConfig):
    """Per-sample probabilities of the synthetic negatives (progress RM only); they sum to at most 1."""

    mismatch: float = pydantic.Field(0.2, ge=0, le=1)
    """Another episode's instruction, labels 0 (ReWiND)."""
    reverse: float = pydantic.Field(0.1, ge=0, le=1)
    """Frames reversed, labels follow the frames."""
    rewind: float = pydantic.Field(0.15, ge=0, le=1)
    """Forward then backward (ReWiND), labels follow."""
    stall: float = pydantic.Field(0.1, ge=0, le=1)
    """A held frame resampled back to T, labels flat there."""
    subsample: float = pydantic.Field(0.0, ge=0, le=1)
    """A random ordered subset of 1..T frames."""
    shift: int = pydantic.Field(0, ge=0)
    """Every clip moved by a random offset of up to this many pixels along each axis, the same for all its frames
    and views (edges repeated; DrQ's random shift). Progress does not change when the whole scene moves, so the model
    cannot read it from which image token holds a thing; 0: none."""

    @pydantic.model_validator(mode="after")
    def _at_most_one(self) -> Augment:
        total = self.mismatch + self.reverse + self.rewind + self.stall + self.subsample
        if total > 1 + 1e-9:
            raise ValueError(f"the augment probabilities sum to {total:g}; they must sum to at most 1")
        return self


class DataSettings(JobConfig):
    format: Literal["episodes", "lerobot"] = "episodes"
    """How `train` and `eval` are read: the project's episode or pair folders, or (progress RM) LeRobot v3 dataset
    folders, read as `lerobot` says."""
    train: Path | list[Path] | None = None
    """An episode folder (progress; several, read as one) or a pair folder (preference); None: synthetic.
    format lerobot: one LeRobot v3 dataset folder (required)."""
    eval: Path | None = None
    """An episode or pair folder for the periodic evaluation; None: synthetic_eval (format lerobot: the `train`
    dataset, its lerobot.eval_episodes)."""
    lerobot: LeRobotSource = pydantic.Field(default_factory=LeRobotSource)
    """Reading LeRobot v3 datasets (format lerobot): camera, progress labels, episode ranges, frame rate and size."""
    synthetic_train: SyntheticData = pydantic.Field(default_factory=SyntheticData)
    """ShapesWorld training data, built when `train` is None."""
    synthetic_eval: SyntheticData = pydantic.Field(
        default_factory=lambda: SyntheticData(num_episodes=64, num_pairs=256, seed=1000)
    )
    """ShapesWorld evaluation data, built when `eval` is None (a seed disjoint from training's)."""
    augment: Augment = pydantic.Field(default_factory=Augment)
    """Synthetic negatives mixed into progress training clips."""
    clip_frames: int | None = pydantic.Field(None, ge=2)
    """Progress RM: training clips keep at most this many frames, the clip's first frame and a random ordered subset of
    the rest (after augmentation), so a frame's place in the clip does not tell its progress and steps get cheaper;
    None: whole clips (up to model.reward.max_frames)."""
    clip_shuffle: bool = False
    """Progress RM: after the first frame, training clips show their frames in random order (labels follow the frames),
    so only what a frame shows (against the first frame) predicts its label, never its place."""
    margin_scale: float = pydantic.Field(0.0, ge=0)
    """Preference: BT margin = margin_scale × the pair's margin."""

    @pydantic.field_validator("train")
    @classmethod
    def _folders_named(cls, value: Path | list[Path] | None) -> Path | list[Path] | None:
        if isinstance(value, list) and not value:
            raise ValueError("an empty list names no episode folder; give one or more, or null for synthetic data")
        return value


class OptimizerSettings(Settings):
    """AdamW with linear warmup, then half a cosine down to 0 at the last step: what every trainer here shares."""

    steps: int = pydantic.Field(1500, ge=1)
    """Training steps, each on one batch of `batch_size` per process."""
    batch_size: int = pydantic.Field(16, ge=1)
    """Samples per process and step."""
    lr: float = pydantic.Field(5e-4, gt=0)
    """Peak learning rate, after warmup."""
    weight_decay: float = pydantic.Field(0.01, ge=0)
    """AdamW's decoupled weight decay."""
    warmup_steps: int = pydantic.Field(100, ge=0)
    """Optimizer updates of linear warmup."""
    grad_clip: float = pydantic.Field(1.0, gt=0)
    """Largest global gradient norm; larger gradients are scaled down to it."""


class Optimization(OptimizerSettings):
    """The reward model's optimizer. `steps` counts micro-steps: each draws one batch of `batch_size` clips (or
    pairs) per process and runs forward/backward; the optimizer updates every `gradient_accumulation`
    micro-steps, so updates = steps / accumulation (steps must be a multiple of it). Every step count in the
    config (save_every, eval_every, ...) is in micro-steps, except warmup_steps, which counts optimizer updates.
    """

    gradient_accumulation: int = pydantic.Field(1, ge=1)
    """Micro-steps per optimizer update."""
    head_only_updates: int = pydantic.Field(0, ge=0)
    """Linear probing before fine-tuning (LP-FT): for this many optimizer updates only the reward head learns, then the
    backbone joins with its own warmup. A fresh head's first gradients otherwise reshape the stage-1 features it is
    meant to read (instruction grounding among them)."""
    step_loss_weight: float = pydantic.Field(0.0, ge=0)
    """Progress RM: adds this × (1 − correlation of predicted and labelled frame-to-frame progress changes)
    (`heads.step_correlation_loss`): the reward's steps, not only its levels, must follow the labels."""
    success_loss_weight: float = pydantic.Field(1.0, ge=0)
    """Progress RM with `model.reward.success_head`: adds this × the success head's BCE, over frames whose
    success label is known (`frame_success`)."""
    stage_loss_weight: float = pydantic.Field(1.0, ge=0)
    """Progress RM with `model.reward.num_stages`: adds this × the stage head's cross-entropy, over frames
    whose stage label is known (`stage` ≥ 0)."""
    goal_offset_loss_weight: float = pydantic.Field(1.0, ge=0)
    """Progress RM with `model.reward.goal_offset_head`: adds this × the goal-offset head's squared error, over
    frames whose offset is known (`goal_offset`)."""
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    """auto: bf16 on GPUs that have it, else no mixed precision."""

    @pydantic.model_validator(mode="after")
    def _whole_updates(self) -> Optimization:
        if self.steps % self.gradient_accumulation:
            raise ValueError(
                f"steps ({self.steps}) must be a multiple of gradient_accumulation ({self.gradient_accumulation}): "
                "steps counts micro-steps, and the last one must update the weights"
            )
        if self.head_only_updates >= self.steps // self.gradient_accumulation:
            raise ValueError(
                f"head_only_updates ({self.head_only_updates}) must be below the run's optimizer updates "
                f"({self.steps // self.gradient_accumulation}), or the backbone never trains"
            )
        return self


class TrainRMConfig(JobConfig):
    output_dir: OutputDir = Path("outputs/train_rm/progress")
    """The run folder: checkpoints, logs, the exported reward model (`model/`) and its reward YAML."""
    seed: int = 0
    """Seed of data order, augmentation and the head's initial weights."""
    model: ModelSettings = pydantic.Field(default_factory=ModelSettings)
    """Backbone, reward head, LoRA and memory settings."""
    data: DataSettings = pydantic.Field(default_factory=DataSettings)
    """Training and evaluation data, augmentation and clip sampling."""
    optim: Optimization = pydantic.Field(default_factory=Optimization)
    """Steps, batch, learning-rate schedule and losses."""
    log_every: int = pydantic.Field(10, ge=1)
    """Micro-steps between log lines (loss, learning rate)."""
    eval_every: int = pydantic.Field(250, ge=1)
    """Micro-steps between evaluations on the evaluation data."""
    save_every: int = pydantic.Field(250, ge=1)
    """Micro-steps between checkpoints; a multiple of optim.gradient_accumulation."""
    keep_checkpoints: int = pydantic.Field(2, ge=1)
    """How many of the latest checkpoints stay on disk."""
    resume: bool = True
    """Continue from the latest checkpoint in output_dir (its settings must match)."""

    @pydantic.model_validator(mode="after")
    def _several_folders_for_progress_only(self) -> TrainRMConfig:
        if isinstance(self.data.train, list) and self.model.reward.task != "progress":
            raise ValueError(
                f"data.train lists {len(self.data.train)} folders; only a progress RM reads several episode "
                f"folders as one, model.reward.task is {self.model.reward.task!r}: give one pair folder"
            )
        return self

    @pydantic.model_validator(mode="after")
    def _lerobot_for_progress(self) -> TrainRMConfig:
        if self.data.format == "lerobot" and (
            self.model.reward.task != "progress" or not isinstance(self.data.train, Path)
        ):
            raise ValueError(
                "data.format lerobot trains a progress RM (model.reward.task: progress) on one LeRobot v3 dataset "
                f"folder in data.train; got task {self.model.reward.task!r} and data.train {self.data.train!r}"
            )
        return self

    @pydantic.model_validator(mode="after")
    def _checkpoints_between_updates(self) -> TrainRMConfig:
        if self.save_every % self.optim.gradient_accumulation:
            raise ValueError(
                f"save_every ({self.save_every}) must be a multiple of optim.gradient_accumulation "
                f"({self.optim.gradient_accumulation}): a checkpoint cannot hold half-accumulated gradients"
            )
        return self


class BackboneTraining(Settings):
    """How a backbone is pretrained on questions about frames (`vlm_rewards.training.pretrain`)."""

    model: TinyBackbone = TinyBackbone(
        hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, vision_depth=4, vision_hidden=128, vision_heads=4
    )
    """The backbone's shape (its weights start random)."""
    vocab_size: int = pydantic.Field(2048, ge=300)
    """Largest vocabulary of the byte-level BPE tokenizer trained on the corpus and the question texts."""
    optim: OptimizerSettings = OptimizerSettings(steps=4000, batch_size=16, lr=3e-4, warmup_steps=200)
    """Steps (each draws `batch_size` fresh questions) and the optimizer."""
    readout_weight: float = pydantic.Field(1.0, ge=0)
    """Weight of the scene readout's loss (which named things each image token's patch holds) beside the
    answers'."""
    readout_offset_weight: float = pydantic.Field(0.0, ge=0)
    """Weight of the scene readout's offsets (where in its token's patch each named thing is, in patch
    widths: positions finer than a token); 0: presence only."""
    log_every: int = pydantic.Field(50, ge=1)
    """Steps between records of train_log.jsonl (loss, learning rate, seconds per step)."""
    eval_every: int = pydantic.Field(500, ge=1)
    """Steps between evaluations (whole-answer accuracy per skill on fixed held-out questions)."""
    save_every: int = pydantic.Field(250, ge=1)
    """Steps between checkpoints (weights, optimizer, schedule); a run resumes from the latest."""
    keep_checkpoints: int = pydantic.Field(2, ge=1)
    """How many of the latest checkpoints stay on disk."""
    seed: int = 0
    """Seed of the question stream: step s draws its batch from an RNG seeded by (seed, s)."""
