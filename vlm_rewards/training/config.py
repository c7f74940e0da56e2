"""The `vlmr train-rm` config: every knob, with defaults that train a tiny progress RM from scratch."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic

from vlm_rewards.config import JobConfig
from vlm_rewards.data.build import SyntheticData
from vlm_rewards.models.backbones import FAMILIES
from vlm_rewards.models.reward_model import RewardModelConfig

Family = Literal[FAMILIES]  # type: ignore[valid-type]


class TinyBackbone(JobConfig):
    """A random Qwen-VL-architecture backbone with the project's tokenizer, for from-scratch runs."""

    family: Family = "qwen2_5_vl"
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    vision_depth: int = 2
    vision_hidden: int = 64
    vision_heads: int = 4
    seed: int = 0


class Lora(JobConfig):
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]


class ModelSettings(JobConfig):
    backbone: str = "tiny"  # "tiny" (built from `tiny`, random weights), or a hub id / local Qwen-VL folder
    tiny: TinyBackbone = pydantic.Field(default_factory=TinyBackbone)
    reward: RewardModelConfig = pydantic.Field(default_factory=RewardModelConfig)
    lora: Lora = pydantic.Field(default_factory=Lora)
    freeze_vision: bool = False
    gradient_checkpointing: bool = False
    attn_implementation: str | None = None  # None: transformers' default (sdpa)


class Augment(JobConfig):
    """Per-sample probabilities of the synthetic negatives (progress RM only)."""

    mismatch: float = 0.2  # another episode's instruction, every frame labelled 0 (ReWiND)
    reverse: float = 0.1  # frames reversed, labels follow the frames
    rewind: float = 0.15  # forward then backward (ReWiND), labels follow the frames
    stall: float = 0.1  # a held frame resampled back to T, labels flat there
    subsample: float = 0.0  # a random ordered subset of 1..T frames: position in the clip stops telling time


class DataSettings(JobConfig):
    train: Path | None = None  # an episode folder (progress) or pair folder (preference); None: synthetic
    eval: Path | None = None
    synthetic_train: SyntheticData = pydantic.Field(default_factory=SyntheticData)
    synthetic_eval: SyntheticData = pydantic.Field(
        default_factory=lambda: SyntheticData(num_episodes=64, num_pairs=256, seed=1000)
    )
    augment: Augment = pydantic.Field(default_factory=Augment)
    margin_scale: float = 0.0  # preference: Bradley–Terry margin = margin_scale × the pair's margin


class Optimization(JobConfig):
    steps: int = 1500
    batch_size: int = 16
    gradient_accumulation: int = 1
    lr: float = 5e-4
    weight_decay: float = 0.01
    warmup_steps: int = 100
    grad_clip: float = 1.0
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"  # auto: bf16 on GPUs that have it


class TrainRMConfig(JobConfig):
    output_dir: Path = Path("outputs/train_rm/progress")
    seed: int = 0
    model: ModelSettings = pydantic.Field(default_factory=ModelSettings)
    data: DataSettings = pydantic.Field(default_factory=DataSettings)
    optim: Optimization = pydantic.Field(default_factory=Optimization)
    log_every: int = 10
    eval_every: int = 250
    save_every: int = 250
    keep_checkpoints: int = 2
    resume: bool = True  # continue from the latest checkpoint in output_dir if there is one
