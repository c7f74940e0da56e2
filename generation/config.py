"""The `vlmr grpo` config: every knob, with defaults that run a tiny flow-matching model on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pydantic

from generation.sampling import SamplerSettings, usable_steps
from vlm_rewards.config import JobConfig


class TinyModel(JobConfig):
    """A randomly initialised pixel-space model (see `generation.models.build_tiny_generator`)."""

    resolution: int = 8
    layers: int = 1
    heads: int = 2
    head_dim: int = 8
    text_dim: int = 16
    max_tokens: int = 8
    shift: float = 1.0  # flow scheduler's timestep shift
    seed: int = 0
    guidance_embeds: bool = False  # flux only: FLUX.1-dev's guidance embedding
    patch_size: int = 2  # flow only: SD3's patch side in pixels


class Lora(JobConfig):
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0  # > 0 breaks "ratio == 1 on the first update": the two forwards differ
    target_modules: list[str] | None = None  # None: the family's attention projections


class ModelSettings(JobConfig):
    family: Literal["flow", "flux", "ddim"] = "flow"
    pretrained: str | None = None  # a hub id or folder (SD3 for flow, FLUX.1 for flux, SD 1.x/2.x for ddim); None: tiny
    resolution: int = 512  # pretrained only
    trained_tiny: str | None = None  # a tiny model trained from scratch: the folder `vlmr pretrain-generator` saved
    tiny: TinyModel = pydantic.Field(default_factory=TinyModel)
    lora: Lora = pydantic.Field(default_factory=Lora)


class Sampling(JobConfig):
    num_steps: int = 10
    eval_num_steps: int = 10
    noise_level: float = 0.7  # flow noise level a; DDIM η
    method: Literal["sde", "cps"] = "sde"
    window_size: int | None = None  # SDE/trained steps per trajectory; None: every step
    window_starts: tuple[int, int] | None = None  # the window's first step is drawn from [low, high)
    guidance_scale: float = 1.0  # CFG (sampling and training alike) when > 1
    same_noise_in_group: bool = False

    def sampler(self) -> SamplerSettings:
        return SamplerSettings(
            num_steps=self.num_steps,
            noise_level=self.noise_level,
            method=self.method,
            window_size=self.window_size,
            window_starts=self.window_starts,
            guidance_scale=self.guidance_scale,
            same_noise_in_group=self.same_noise_in_group,
        )

    @property
    def steps_per_trajectory(self) -> int:
        return self.window_size or usable_steps(self.sampler())


class RewardEntry(JobConfig):
    name: str
    config: str | dict[str, Any]  # a reward YAML path, a shipped name, or an inline `kind: ...` mapping
    weight: float = 1.0


class Rewards(JobConfig):
    trained: list[RewardEntry] = [
        RewardEntry(name="redness", config={"kind": "function", "function": "generation.rule_rewards:redness"})
    ]
    gold: list[RewardEntry] = []  # evaluated on every rollout and at evaluation, never trained on
    aggregation: Literal["reward", "advantage"] = "reward"


class Train(JobConfig):
    prompts: list[str] = ["a red circle", "a blue square", "a green triangle", "a yellow star"]
    eval_prompts: list[str] = ["a red circle", "a blue square"]
    eval_images_per_prompt: int = 1  # each from its own fixed-seed noise
    group_size: int = 4  # images per prompt
    sample_batch_size: int = 8  # images per sampling call (whole groups)
    batches_per_epoch: int = 2
    train_batch_size: int = 4  # = sample_batch_size gives bit-identical forwards (ratio exactly 1 at first)
    epochs: int = 4
    inner_epochs: int = 1
    lr: float = 3e-4
    lr_schedule: Literal["constant", "cosine"] = "constant"  # cosine: from lr at epoch 0 towards 0 at the last
    weight_decay: float = 1e-4
    grad_clip: float = 1.0
    clip_range: float = 1e-4
    advantage_clip: float = 5.0
    advantage_epsilon: float = 1e-4
    kl_beta: float = 0.0
    log_reference_kl: bool = True  # compute the KL to the reference even when kl_beta is 0
    ema_decay: float | None = None  # evaluate with an EMA of the LoRA weights (e.g. 0.9); None: off


class GRPOConfig(JobConfig):
    output_dir: Path = Path("runs/grpo_tiny")
    seed: int = 0
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    model: ModelSettings = pydantic.Field(default_factory=ModelSettings)
    sampling: Sampling = pydantic.Field(default_factory=Sampling)
    rewards: Rewards = pydantic.Field(default_factory=Rewards)
    train: Train = pydantic.Field(default_factory=Train)
    eval_every: int = 2  # epochs; 0: never
    checkpoint_every: int = 2  # epochs; 0: never
    keep_checkpoints: int = 2
    # a trained reward's name: the LoRA weights of the evaluation with its highest mean go to output_dir/best
    # (model selection on the reward being trained, never on gold); None: off
    keep_best_by: str | None = None
    resume: bool = True

    @pydantic.model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        train = self.train
        if train.group_size < 2:
            raise ValueError(f"train.group_size {train.group_size}: a group needs at least 2 images")
        if train.sample_batch_size % train.group_size:
            raise ValueError(
                f"train.group_size {train.group_size} does not divide train.sample_batch_size {train.sample_batch_size}"
            )
        for field in ("prompts", "eval_prompts"):
            empty = [i for i, prompt in enumerate(getattr(train, field)) if not prompt.strip()]
            if empty or (field == "prompts" and not train.prompts):
                raise ValueError(f"train.{field}: empty prompt(s) at {empty or 'the list itself'}")
        if not self.rewards.trained:
            raise ValueError("rewards.trained: at least one reward is needed")
        if self.model.pretrained is not None and self.model.trained_tiny is not None:
            raise ValueError("model: set pretrained or trained_tiny, not both")
        names = [entry.name for entry in self.rewards.trained + self.rewards.gold]
        if len(set(names)) != len(names):
            raise ValueError(f"rewards: names must be unique across trained and gold, got {names}")
        trained = [entry.name for entry in self.rewards.trained]
        if self.keep_best_by is not None and (
            self.keep_best_by not in trained or not self.eval_every or not train.eval_prompts
        ):
            raise ValueError(
                f"keep_best_by {self.keep_best_by!r}: needs eval_every > 0, eval prompts and one of the trained "
                f"rewards {trained}"
            )
        if self.model.family == "ddim" and self.sampling.method != "sde":
            raise ValueError("sampling.method 'cps' is for flow models; DDIM uses eta (sampling.noise_level)")
        from generation.sampling import stochastic_steps

        stochastic_steps(self.sampling.sampler())  # window size and starts fit the schedule
        return self
