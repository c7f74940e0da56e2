"""The `vlmr train-rm` config: every knob, with defaults that train a tiny progress RM from scratch."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic

from vlm_rewards.config import JobConfig
from vlm_rewards.data.build import SyntheticData
from vlm_rewards.models.backbones import FAMILIES
from vlm_rewards.models.reward_network import RewardNetworkConfig

Family = Literal[FAMILIES]  # type: ignore[valid-type]


class TinyBackbone(JobConfig):
    """A random Qwen-VL-architecture backbone with the project's tokenizer, for from-scratch runs."""

    family: Family = "qwen2_5_vl"
    hidden_size: int = pydantic.Field(128, ge=1)
    num_layers: int = pydantic.Field(2, ge=1)
    num_heads: int = pydantic.Field(4, ge=1)
    num_kv_heads: int = pydantic.Field(2, ge=1)
    vision_depth: int = pydantic.Field(2, ge=1)
    vision_hidden: int = pydantic.Field(64, ge=1)
    vision_heads: int = pydantic.Field(4, ge=1)
    seed: int = 0


class Lora(JobConfig):
    enabled: bool = False
    r: int = pydantic.Field(16, ge=1)
    alpha: float = pydantic.Field(32, gt=0)
    dropout: float = pydantic.Field(0.05, ge=0, lt=1)
    # peft semantics: a list of module-name suffixes, or one regex the full module name must match.
    # Bare names match every tower: Qwen2.5-VL's vision MLPs also have gate_proj/up_proj/down_proj, so
    # for MLP targets use a regex on the language model, e.g. 'language_model.*\.(gate_proj|up_proj)'.
    # With model.freeze_vision, an adapter landing in the vision tower is an error.
    target_modules: list[str] | str = ["q_proj", "k_proj", "v_proj", "o_proj"]


class ModelSettings(JobConfig):
    backbone: str = "tiny"  # "tiny" (built from `tiny`, random weights), or a hub id / local Qwen-VL folder
    tiny: TinyBackbone = pydantic.Field(default_factory=TinyBackbone)
    reward: RewardNetworkConfig = pydantic.Field(default_factory=RewardNetworkConfig)
    lora: Lora = pydantic.Field(default_factory=Lora)
    freeze_vision: bool = False
    gradient_checkpointing: bool = False
    attn_implementation: str | None = None  # None: transformers' default (sdpa)


class Augment(JobConfig):
    """Per-sample probabilities of the synthetic negatives (progress RM only); they sum to at most 1."""

    mismatch: float = pydantic.Field(0.2, ge=0, le=1)  # another episode's instruction, labels 0 (ReWiND)
    reverse: float = pydantic.Field(0.1, ge=0, le=1)  # frames reversed, labels follow the frames
    rewind: float = pydantic.Field(0.15, ge=0, le=1)  # forward then backward (ReWiND), labels follow
    stall: float = pydantic.Field(0.1, ge=0, le=1)  # a held frame resampled back to T, labels flat there
    subsample: float = pydantic.Field(0.0, ge=0, le=1)  # a random ordered subset of 1..T frames

    @pydantic.model_validator(mode="after")
    def _at_most_one(self) -> Augment:
        total = self.mismatch + self.reverse + self.rewind + self.stall + self.subsample
        if total > 1 + 1e-9:
            raise ValueError(f"the augment probabilities sum to {total:g}; they must sum to at most 1")
        return self


class DataSettings(JobConfig):
    # an episode folder (progress; several, read as one) or a pair folder (preference); None: synthetic
    train: Path | list[Path] | None = None
    eval: Path | None = None
    synthetic_train: SyntheticData = pydantic.Field(default_factory=SyntheticData)
    synthetic_eval: SyntheticData = pydantic.Field(
        default_factory=lambda: SyntheticData(num_episodes=64, num_pairs=256, seed=1000)
    )
    augment: Augment = pydantic.Field(default_factory=Augment)
    # progress RM: training clips keep at most this many frames, the clip's first frame and a random
    # ordered subset of the rest (after augmentation), so a frame's place in the clip does not tell
    # its progress and steps get cheaper; None: whole clips (up to model.reward.max_frames)
    clip_frames: int | None = pydantic.Field(None, ge=2)
    # progress RM: after the first frame, training clips show their frames in random order (labels follow
    # the frames), so only what a frame shows (against the first frame) predicts its label, never its place
    clip_shuffle: bool = False
    margin_scale: float = pydantic.Field(0.0, ge=0)  # preference: BT margin = margin_scale × the pair's margin

    @pydantic.field_validator("train")
    @classmethod
    def _folders_named(cls, value: Path | list[Path] | None) -> Path | list[Path] | None:
        if isinstance(value, list) and not value:
            raise ValueError("an empty list names no episode folder; give one or more, or null for synthetic data")
        return value


class Optimization(JobConfig):
    # micro-steps: each draws one batch of `batch_size` per process and runs forward/backward; the
    # optimizer updates every `gradient_accumulation` micro-steps, so updates = steps / accumulation
    # (steps must be a multiple of it). Every step count in the config (save_every, eval_every, ...) is
    # in micro-steps, except warmup_steps, which counts optimizer updates.
    steps: int = pydantic.Field(1500, ge=1)
    batch_size: int = pydantic.Field(16, ge=1)  # per process and micro-step
    gradient_accumulation: int = pydantic.Field(1, ge=1)
    lr: float = pydantic.Field(5e-4, gt=0)  # peak, after warmup; cosine decay to 0 at the last update
    weight_decay: float = pydantic.Field(0.01, ge=0)
    warmup_steps: int = pydantic.Field(100, ge=0)  # optimizer updates of linear warmup
    # Linear probing before fine-tuning (LP-FT): for this many optimizer updates only the reward head
    # learns, then the backbone joins with its own warmup. A fresh head's first gradients otherwise
    # reshape the stage-1 features it is meant to read (instruction grounding among them).
    head_only_updates: int = pydantic.Field(0, ge=0)
    # progress RM: + this × (1 − correlation of predicted and labelled frame-to-frame progress changes)
    # (`heads.step_correlation_loss`): the reward's steps, not only its levels, must follow the labels
    step_loss_weight: float = pydantic.Field(0.0, ge=0)
    grad_clip: float = pydantic.Field(1.0, gt=0)
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"  # auto: bf16 on GPUs that have it

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
    output_dir: Path = Path("outputs/train_rm/progress")
    seed: int = 0
    model: ModelSettings = pydantic.Field(default_factory=ModelSettings)
    data: DataSettings = pydantic.Field(default_factory=DataSettings)
    optim: Optimization = pydantic.Field(default_factory=Optimization)
    log_every: int = pydantic.Field(10, ge=1)  # micro-steps
    eval_every: int = pydantic.Field(250, ge=1)
    save_every: int = pydantic.Field(250, ge=1)  # a multiple of optim.gradient_accumulation
    keep_checkpoints: int = pydantic.Field(2, ge=1)
    resume: bool = True  # continue from the latest checkpoint in output_dir (its settings must match)

    @pydantic.field_validator("output_dir")
    @classmethod
    def _output_dir_named(cls, value: Path) -> Path:
        if str(value).strip() in ("", "."):
            raise ValueError("output_dir must name a folder; an empty value or '.' would write into the current folder")
        return value

    @pydantic.model_validator(mode="after")
    def _several_folders_for_progress_only(self) -> TrainRMConfig:
        if isinstance(self.data.train, list) and self.model.reward.task != "progress":
            raise ValueError(
                f"data.train lists {len(self.data.train)} folders; only a progress RM reads several episode "
                f"folders as one, model.reward.task is {self.model.reward.task!r}: give one pair folder"
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
