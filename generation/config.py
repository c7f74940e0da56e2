"""The settings of the generation jobs, in one torch-free module: every knob, documented where it is declared.

- `GRPOConfig`: `vlmr grpo` (`vlm_rewards.generation.train`); its defaults run a tiny flow-matching model on CPU.
- `RWRConfig`: `vlmr rwr` (`vlm_rewards.generation.rwr`), a GRPO config plus RWR's temperature.
- `NFTConfig`: `vlmr nft` (`vlm_rewards.generation.nft`), a GRPO config plus DiffusionNFT's `nft` section.
- `PretrainConfig`: `vlmr pretrain-generator` (`vlm_rewards.generation.pretrain`).
- `BenchmarkConfig`: `vlmr generation-benchmark` (`vlm_rewards.generation.benchmark`), issue #37's comparison.

`SamplerSettings` is what the rollout sampler (`vlm_rewards.generation.sampling`) reads; a GRPO config's
`sampling` section is one, plus the evaluation's step count. Importing this module loads neither torch
nor diffusers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pydantic

from vlm_rewards.config import REPLACED_BY_FILE, JobConfig, OutputDir, Settings

DEFAULT_NOISE_LEVEL = 0.7
"""Flow-GRPO's noise level a: the default of `SamplerSettings.noise_level` and of `sde.sde_step_with_logprob`."""

Split = Literal["train", "held_out", "all", "grpo", "unseen"]
"""A split of the ShapesWorld text-to-image prompts (`vlm_rewards.generation.shapes_t2i`): "grpo" and "unseen" are
the `six_pairs` holdout's held-out pairs GRPO trains on and those it never sees."""
Holdout = Literal["triples", "pairs", "six_pairs"]
"""Which ShapesWorld combinations are held out of base training (`vlm_rewards.generation.shapes_t2i`)."""
LRSchedule = Literal["constant", "cosine"]
"""After any warmup: a constant learning rate, or a cosine from lr towards 0 at the end of training."""


class TinyModel(Settings):
    """A randomly initialised pixel-space model (see `vlm_rewards.generation.models.build_tiny_generator`)."""

    resolution: int = 8
    """Image side in pixels (tiny models work in pixel space, without a VAE)."""
    layers: int = 1
    """Transformer blocks (flux: of each kind, joint and single); unused by the DDIM UNet."""
    heads: int = 2
    """Attention heads (flow, flux)."""
    head_dim: int = 8
    """Channels per attention head (ddim: the UNet's `attention_head_dim`)."""
    text_dim: int = 16
    """Width of the tiny text encoder's token and pooled embeddings."""
    max_tokens: int = 8
    """Prompt length in words; longer prompts are cut."""
    shift: float = 1.0
    """The flow-matching scheduler's timestep shift (flow, flux)."""
    seed: int = 0
    """Seed of the initial weights: the same settings give the same model."""
    guidance_embeds: bool = False
    """Flux only: add FLUX.1-dev's guidance embedding."""
    patch_size: int = 2
    """Flow (SD3) only: the patch side in pixels."""


class Lora(Settings):
    """The LoRA adapter that GRPO trains on the frozen denoiser."""

    r: int = 8
    """LoRA rank."""
    alpha: int = 16
    """LoRA alpha: the update is scaled by alpha / r."""
    dropout: float = 0.0
    """LoRA dropout. Above 0 the sampling and training forwards differ, so the ratio is not 1 on the first update."""
    target_modules: list[str] | None = None
    """Module names to wrap; None: the family's attention projections (`models.LORA_TARGETS`)."""


class ModelSettings(Settings):
    """The generator: a pretrained pipeline, a tiny model trained from scratch, or a random tiny one."""

    family: Literal["flow", "flux", "ddim"] = "flow"
    """"flow" (SD3 transformer) and "flux" (Flux transformer) are flow matching; "ddim" is a UNet with DDIM (DDPO)."""
    pretrained: str | None = None
    """A hub id or folder (SD3 for flow, FLUX.1 for flux, SD 1.x/2.x for ddim); None: a tiny model."""
    resolution: int = 512
    """Image side in pixels of a pretrained model (a tiny model's is `tiny.resolution`)."""
    trained_tiny: str | None = None
    """A tiny model trained from scratch: the folder `vlmr pretrain-generator` saved (its `output_dir/model`)."""
    tiny: TinyModel = pydantic.Field(default_factory=TinyModel)
    """The random tiny model, used when neither `pretrained` nor `trained_tiny` is set."""
    lora: Lora = pydantic.Field(default_factory=Lora)
    """The trained LoRA adapter."""


class SamplerSettings(Settings):
    """How a rollout batch is sampled: the steps, the SDE window and its noise, CFG."""

    num_steps: int = pydantic.Field(10, gt=0)
    """Denoising steps per trajectory."""
    noise_level: float = DEFAULT_NOISE_LEVEL
    """Noise of the stochastic steps: the Flow-SDE/CPS noise level a for flow models, DDIM's η for ddim; 0: none."""
    method: Literal["sde", "cps"] = "sde"
    """Flow models' stochastic step: Flow-GRPO's SDE, or coefficient-preserving sampling (see `sde`)."""
    window_size: int | None = None
    """Stochastic (recorded, trained) steps per trajectory, the others being ODE/DDIM steps. None: every step but
    the last, as Flow-GRPO trains (its `timestep_fraction` 0.99): the last step's noise is nearly 0 (std 7e-4 for
    the tiny flow model at 10 steps and a = 0.7), so it explores nothing and its log-probs are ill-conditioned."""
    window_starts: tuple[int, int] | None = None
    """The window's first step is drawn from [low, high) per batch; None: anywhere the window fits. Needs a
    window_size (the default window starts at step 0)."""
    guidance_scale: float = 1.0
    """Classifier-free guidance scale, in sampling and training alike; applied when > 1."""
    same_noise_in_group: bool = False
    """Start all the images of a prompt from the same noise, so a group branches only in the SDE window."""

    @property
    def usable_steps(self) -> int:
        """Steps that can be stochastic: CPS's last step has no noise (σ_next = 0)."""
        return self.num_steps - 1 if self.method == "cps" else self.num_steps

    @property
    def steps_per_trajectory(self) -> int:
        """Recorded (trained) steps per trajectory."""
        return self.num_steps - 1 if self.window_size is None else self.window_size

    def stochastic_steps(self, rng: np.random.Generator | None = None) -> range:
        """The window of SDE steps for one rollout batch; its start drawn with `rng` (None: the lowest start)."""
        if self.window_size is None:
            if self.num_steps < 2 or self.window_starts is not None:
                raise ValueError(
                    f"window_size null (every step but the last) needs num_steps >= 2 (got {self.num_steps}) and "
                    f"no window_starts (got {self.window_starts}); set window_size to choose the window"
                )
            return range(self.num_steps - 1)
        usable, size = self.usable_steps, self.window_size
        if not 1 <= size <= usable:
            raise ValueError(f"window_size {size}: expected 1..{usable} with {self.num_steps} steps ({self.method})")
        low, high = self.window_starts or (0, usable - size + 1)
        if not 0 <= low < high <= usable - size + 1:
            raise ValueError(f"window_starts {(low, high)}: a window of {size} must start in [0, {usable - size + 1})")
        start = low if rng is None or high - low == 1 else int(rng.integers(low, high))
        return range(start, start + size)


class Sampling(SamplerSettings):
    """The rollout sampler's settings, plus the deterministic evaluation sampler's step count."""

    eval_num_steps: int = pydantic.Field(10, gt=0)
    """Denoising steps of the evaluation's deterministic (ODE, or η = 0 DDIM) samples."""
    eval_guidance_scale: float | None = None
    """Classifier-free guidance scale of the evaluation samples (applied when > 1); None: `guidance_scale`."""

    @property
    def evaluation_guidance_scale(self) -> float:
        """The guidance scale evaluation samples with."""
        return self.guidance_scale if self.eval_guidance_scale is None else self.eval_guidance_scale


class RewardEntry(Settings):
    """One named reward."""

    name: str
    """The reward's name in logs and in `keep_best_by`; unique across trained and gold rewards."""
    config: str | dict[str, Any]
    """A reward YAML path, a shipped reward's name, or an inline `kind: ...` mapping."""
    weight: float = 1.0
    """Weight in the combined advantage (trained rewards only)."""


class Rewards(Settings):
    """The rewards trained on and those only watched."""

    trained: list[RewardEntry] = [
        RewardEntry(
            name="redness", config={"kind": "function", "function": "vlm_rewards.generation.rule_rewards:redness"}
        )
    ]
    """The rewards GRPO trains on, combined by `aggregation`."""
    gold: list[RewardEntry] = []
    """Rewards scored on every rollout and at evaluation, never trained on (to see reward hacking)."""
    aggregation: Literal["reward", "advantage"] = "reward"
    """How several trained rewards combine: "reward" sums the batch-normalised rewards, then takes group
    advantages; "advantage" sums each reward's group advantages (`vlm_rewards.generation.grpo`)."""


class PromptFile(Settings):
    """A prompt dataset file (read by `vlm_rewards.generation.prompts`); a bare path string means this."""

    path: Path
    """The file; a relative path is read from the working folder, like the job's other paths."""
    format: Literal["auto", "text", "jsonl", "geneval"] = "auto"
    """"text": a prompt per line ("#" comments, blank lines skipped); "jsonl": `{"prompt": ...}` per line, other
    keys kept as metadata; "geneval": GenEval's evaluation_metadata.jsonl; "auto": .txt is text, .jsonl is
    geneval when its first line has "tag" and "include", else jsonl."""


def _prompt_path(value: Any) -> Any:
    return {"path": value} if isinstance(value, str | Path) else value


PromptSource = Annotated[list[str] | PromptFile, pydantic.BeforeValidator(_prompt_path)]
"""Prompts inline (a list) or from a file (`PromptFile`, or its path as a string)."""


class Train(Settings):
    """Prompts, batch sizes and the PPO-clip optimisation."""

    prompts: PromptSource = ["a red circle", "a blue square", "a green triangle", "a yellow star"]
    """Training prompts, a list or a prompt file; each batch draws sample_batch_size / group_size of them."""
    eval_prompts: PromptSource = ["a red circle", "a blue square"]
    """Evaluation prompts, a list or a prompt file; empty list: no evaluation. When either split is a file, a
    prompt in both is refused at the start of the run (`vlm_rewards.generation.prompts`)."""
    eval_images_per_prompt: int = pydantic.Field(1, gt=0)
    """Evaluation images per prompt, each from its own fixed-seed noise."""
    group_size: int = 4
    """Images per prompt in a batch: the group its advantages are relative to (at least 2)."""
    sample_batch_size: int = pydantic.Field(8, gt=0)
    """Images per sampling call, in whole groups (a multiple of group_size)."""
    batches_per_epoch: int = pydantic.Field(2, gt=0)
    """Sampling calls per epoch."""
    train_batch_size: int = pydantic.Field(4, gt=0)
    """Samples per PPO minibatch; = sample_batch_size gives bit-identical forwards (ratio exactly 1 at first)."""
    epochs: int = pydantic.Field(4, gt=0)
    """Epochs of sampling and updating."""
    inner_epochs: int = pydantic.Field(1, gt=0)
    """Passes of PPO updates over each epoch's samples."""
    lr: float = 3e-4
    """Learning rate of AdamW on the LoRA weights."""
    lr_schedule: LRSchedule = "constant"
    """"cosine": from lr at epoch 0 towards 0 at the last epoch."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip per optimizer step."""
    gradient_checkpointing: bool = False
    """Recompute the denoiser's activations in the backward pass instead of storing them (diffusers'
    `enable_gradient_checkpointing`): less memory for about one more forward per trained step; same gradients."""
    clip_range: float = 1e-4
    """PPO's clip range ε: ratios outside [1 − ε, 1 + ε] stop contributing gradient."""
    advantage_clip: float = 5.0
    """Advantages are clipped to [−advantage_clip, advantage_clip]."""
    advantage_epsilon: float = 1e-4
    """ε of the group z-score (r − mean) / (std + ε)."""
    advantage: Literal["pointwise", "pairwise"] = "pointwise"
    """"pointwise": advantages from each image's reward. "pairwise" (Pref-GRPO): from its win rate in its prompt
    group under each trained reward's `prefer`, the mean P(it beats j) over the group's other images j, then
    normalised like a pointwise reward. It costs G(G − 1)/2 `prefer` judgements per group of G (each pair judged
    once, in one order) on top of the pointwise scores, which the logs and the evaluation still use."""
    global_std: bool = False
    """Divide by the reward std of the whole batch (every process) instead of each prompt group's (Flow-GRPO's
    `global_std`): a group whose rewards barely differ then gets small advantages, not its noise blown up to ±1."""
    kl_beta: float = 0.0
    """Weight β of the KL to the reference policy (the model with its LoRA disabled); 0: no KL term. The KL is
    ‖μθ − μref‖² / (2·std²) with std the step's full standard deviation (Flow-SDE: std_dev_t·sqrt(−dt)), where
    Flow-GRPO divides by std_dev_t² alone: ours is 1/(−dt) times theirs, so at 10 steps (−dt ≈ 0.1) the same β
    weighs the KL about 10x as much as in Flow-GRPO."""
    log_reference_kl: bool = True
    """Compute and log the KL to the reference even when kl_beta is 0."""
    ema_decay: float | None = None
    """Evaluate (and keep) an EMA of the LoRA weights with this decay (e.g. 0.9); None: off."""


class Export(Settings):
    """What a run writes of its final weights (the EMA's when ema_decay is set) to output_dir/export/<format>."""

    formats: list[Literal["lora", "merged"]] = ["lora"]
    """"lora": the adapter, as peft's save_pretrained and (SD3, Flux) diffusers' pytorch_lora_weights.safetensors;
    "merged": the denoiser with the adapter merged in (a full copy of its weights); []: nothing. Any checkpoint
    exports later with `vlmr export-generator` (`vlm_rewards.generation.export`)."""


class GRPOConfig(JobConfig):
    """`vlmr grpo`: GRPO fine-tuning of a generator with LoRA on one or several rewards."""

    output_dir: Path = Path("runs/grpo_tiny")
    """The run's folder: metrics.jsonl, evaluation grids, checkpoints and `best`."""
    seed: int = 0
    """Seed every draw (prompts, noise, windows, shuffles) is derived from, with the epoch, batch and process."""
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    """accelerate's mixed precision."""
    model: ModelSettings = pydantic.Field(default_factory=ModelSettings)
    """The generator and its LoRA."""
    sampling: Sampling = pydantic.Field(default_factory=Sampling)
    """The rollout and evaluation samplers."""
    rewards: Rewards = pydantic.Field(default_factory=Rewards)
    """The trained and gold rewards."""
    train: Train = pydantic.Field(default_factory=Train)
    """Prompts, batches and optimisation."""
    export: Export = pydantic.Field(default_factory=Export)
    """The final weights' export formats."""
    eval_every: int = pydantic.Field(2, ge=0)
    """Evaluate every this many epochs; 0: never."""
    checkpoint_every: int = pydantic.Field(2, ge=0)
    """Save a resumable checkpoint every this many epochs, and always after the last epoch; 0: only then."""
    keep_checkpoints: int = pydantic.Field(2, gt=0)
    """Checkpoints kept; older ones are deleted."""
    keep_best_by: str | None = None
    """A trained reward's name: the LoRA weights of the evaluation with its highest mean go to output_dir/best
    (model selection on the reward being trained, never on gold); None: off."""
    resume: bool = True
    """Continue from the latest complete checkpoint in output_dir, if any."""

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
            source = getattr(train, field)  # a prompt file is checked when it is read
            empty = [i for i, prompt in enumerate(source) if not prompt.strip()] if isinstance(source, list) else []
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
        self.sampling.stochastic_steps()  # window size and starts fit the schedule
        return self


class RWRConfig(GRPOConfig):
    """`vlmr rwr`: reward-weighted regression on a GRPO config's prompts, rewards and sampling budget."""

    temperature: float = pydantic.Field(1.0, gt=0)
    """Sample weights are exp(advantage / temperature), normalised to mean 1."""


class NFT(Settings):
    """DiffusionNFT (Zheng et al. 2025, arXiv 2509.16117): flow matching on the policy's own clean samples, pulled
    towards the better ones and away from the worse through implicit positive and negative policies."""

    beta: float = pydantic.Field(1.0, gt=0)
    """Mixing coefficient β: v+ = (1 − β)·v_old + β·v_θ, v− = (1 + β)·v_old − β·v_θ. The reference trains with 1
    (GenEval, PickScore) or 0.1 (OCR, several rewards)."""
    timesteps_per_sample: int | None = pydantic.Field(None, gt=0)
    """Noise levels each sample is trained at per pass, drawn without replacement from the sampling schedule's
    `sampling.num_steps` (one backward each, one optimizer step per minibatch); None: all but one (the reference's
    `timestep_fraction` 0.99 of 10 steps)."""
    kl_beta: float = pydantic.Field(0.0, ge=0)
    """Weight of mean((v_θ − v_ref)²), the velocity's squared distance to the reference (the LoRA disabled); the
    reference uses 1e-4 on SD3.5-M. 0: off. (`train.kl_beta` is GRPO's and must stay 0.)"""
    old_decay_rate: float = pydantic.Field(0.001, ge=0)
    """After each epoch the sampling ("old") policy moves to old ← d·old + (1 − d)·θ, with d = min(rate·(s −
    delay), old_decay_max) after s optimizer steps (0 before the delay): on-policy first, then ever slower."""
    old_decay_max: float = pydantic.Field(0.5, ge=0, lt=1)
    """The largest d of the sampling policy's update (the reference: 0.5; 0.999 for OCR)."""
    old_decay_delay: int = pydantic.Field(0, ge=0)
    """Optimizer steps with d = 0, the sampling policy copying the trained one (the reference: 0; 75 for OCR)."""


class NFTConfig(GRPOConfig):
    """`vlmr nft`: DiffusionNFT on a GRPO config's prompts, rewards, sampler and sampling budget (flow models)."""

    output_dir: Path = Path("runs/nft_tiny")
    """The run's folder: metrics.jsonl, evaluation grids, checkpoints and `best`."""
    nft: NFT = pydantic.Field(default_factory=NFT)
    """DiffusionNFT's loss and sampling-policy update."""

    @pydantic.model_validator(mode="after")
    def _check_nft(self) -> NFTConfig:
        if self.model.family == "ddim":
            raise ValueError(
                "nft: model.family 'ddim' is an ε-prediction UNet; DiffusionNFT trains flow-matching velocity "
                "models: use family 'flow' or 'flux'"
            )
        if self.sampling.guidance_scale > 1:
            raise ValueError(
                f"nft: sampling.guidance_scale {self.sampling.guidance_scale}: DiffusionNFT is CFG-free (it samples "
                "and trains the conditional model); set it to 1 (sampling.eval_guidance_scale may differ)"
            )
        if self.train.kl_beta:
            raise ValueError(f"nft: train.kl_beta {self.train.kl_beta} is GRPO's KL; set it to 0 and use nft.kl_beta")
        if self.sampling.noise_level == 0 and self.sampling.same_noise_in_group:
            raise ValueError(
                "nft: sampling.same_noise_in_group with noise_level 0 (the ODE sampler) draws a group's images "
                "alike, so no group has a reward spread; set same_noise_in_group: false"
            )
        steps = self.nft.timesteps_per_sample
        if steps is not None and steps > self.sampling.num_steps:
            raise ValueError(f"nft.timesteps_per_sample {steps}: at most sampling.num_steps {self.sampling.num_steps}")
        return self

    @property
    def trained_timesteps(self) -> int:
        """Noise levels per sample and pass: `nft.timesteps_per_sample`, by default all steps but one."""
        return self.nft.timesteps_per_sample or max(1, self.sampling.num_steps - 1)


ALGORITHM_CONFIGS: dict[str, type[GRPOConfig]] = {"grpo": GRPOConfig, "nft": NFTConfig, "rwr": RWRConfig}
"""Each generation trainer (`vlmr grpo`, `vlmr nft`, `vlmr rwr`) and its run config."""


class PretrainConfig(JobConfig):
    """`vlmr pretrain-generator`: a tiny text-to-image flow model trained from scratch on ShapesWorld."""

    output_dir: Path = Path("runs/shapes_base")
    """The run's folder; the model goes to output_dir/model (what a GRPO config names as `model.trained_tiny`)."""
    seed: int = 0
    """Seed of the training batches (prompts, renders, noise) and of the evaluation's noise."""
    family: Literal["flow", "flux"] = "flow"
    """The tiny model's family (flow matching only)."""
    model: TinyModel = pydantic.Field(
        default_factory=lambda: TinyModel(resolution=32, layers=4, heads=4, head_dim=32, text_dim=64, patch_size=4)
    )
    """The tiny model's architecture and initial weights' seed."""
    train_split: Split = "train"
    """The prompts trained on; "all" would show the model the held-out combinations too."""
    holdout: Holdout = "triples"
    """Which combinations "held_out" means."""
    steps: int = pydantic.Field(2000, gt=0)
    """Optimizer steps."""
    batch_size: int = pydantic.Field(64, gt=0)
    """Rendered images per step."""
    lr: float = 1e-3
    """AdamW learning rate after the warmup."""
    warmup_steps: int = pydantic.Field(100, gt=0)
    """Steps of linear learning-rate warmup."""
    lr_schedule: LRSchedule = "constant"
    """After the warmup: "constant", or "cosine" from lr towards 0 at the last step."""
    ema_decay: float | None = pydantic.Field(None, gt=0, lt=1)
    """Evaluate and save an EMA of the weights with this decay (e.g. 0.999); None: the trained weights."""
    eval_every: int = pydantic.Field(500, ge=0)
    """Evaluate gold accuracy on the train and held-out prompts every this many steps; 0: only at the end."""
    eval_num_steps: int = pydantic.Field(10, gt=0)
    """Denoising steps of the evaluation's ODE samples."""
    eval_images_per_prompt: int = pydantic.Field(4, gt=0)
    """Evaluation images per prompt."""


TUNING_NOISE_SEED = 7
"""The evaluation noise seed the GRPO demo's settings were chosen on (docs/generation.md): never a reported one."""
BASE_GROUP = "base"
"""The base model's group in the benchmark's results (evaluated on each of `base_seeds`): no arm may take it."""


class BenchmarkArm(Settings):
    """One algorithm of the generation benchmark: a run config, trained once per training seed."""

    algorithm: Literal["grpo", "nft", "rwr"]
    """The trainer: `vlmr grpo`, `vlmr nft` (DiffusionNFT) or `vlmr rwr` (reward-weighted regression)."""
    config: Path
    """The run config it trains (a GRPO config; NFT's adds its `nft` section), relative to the working folder.
    The benchmark sets its `seed`, `output_dir` (output_dir/<arm>_seed<S>) and `resume: true`."""
    seeds: list[int] = pydantic.Field(min_length=2)
    """Training seeds, one run each (at least 2: the arm's interval is over them)."""

    @pydantic.field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds {seeds}: each training seed once")
        return seeds


class SplitImages(Settings):
    """Evaluation images per prompt on each split of the `six_pairs` holdout (`generation/shapes_t2i.py`)."""

    grpo: int = pydantic.Field(16, gt=0)
    """On the `grpo` split's 15 prompts (the pairs the runs train on)."""
    unseen: int = pydantic.Field(16, gt=0)
    """On the `unseen` split's 15 prompts (pairs no run trains on)."""
    train: int = pydantic.Field(4, gt=0)
    """On the `train` split's 60 prompts (the base's own)."""


def _default_arms() -> dict[str, BenchmarkArm]:
    five = [0, 1, 2, 3, 4]
    return {
        "grpo": BenchmarkArm(algorithm="grpo", config=Path("configs/grpo/shapes_six_pairs.yaml"), seeds=five),
        "nft": BenchmarkArm(algorithm="nft", config=Path("configs/nft/shapes_six_pairs.yaml"), seeds=five),
        "rwr": BenchmarkArm(algorithm="rwr", config=Path("configs/rwr/shapes_six_pairs.yaml"), seeds=five[:3]),
    }


class BenchmarkConfig(JobConfig):
    """`vlmr generation-benchmark`: every arm's runs on the `six_pairs` holdout and the base, evaluated on every
    split, aggregated over seeds (`vlm_rewards.generation.benchmark`). Resumable."""

    output_dir: OutputDir = Path("runs/six_pairs")
    """The benchmark's folder: a run per arm and seed (<arm>_seed<S>), evaluations/, report.md, results.json and
    the figure."""
    arms: dict[str, BenchmarkArm] = pydantic.Field(default_factory=_default_arms, json_schema_extra=REPLACED_BY_FILE)
    """The compared algorithms by name (letters, digits, - and _; not "base"); a config's arms replace these. Every
    arm must sample the same number of images in training and start from the same base model (checked before
    anything trains)."""
    base_seeds: list[int] = pydantic.Field([2000, 2001, 2002, 2003, 2004], min_length=2)
    """Evaluation noise seeds of the base model (one evaluation each; its interval is over them)."""
    eval_seed: int = 2000
    """The evaluation noise seed of every run: not a training seed, not the tuning seed 7."""
    images: SplitImages = pydantic.Field(default_factory=SplitImages)
    """Evaluation images per prompt, per split."""
    checkpoint: Literal["last"] = "last"
    """Which checkpoint of a run is reported: the last one (its EMA weights when the run keeps an EMA). Nothing is
    selected on the evaluation splits."""

    @pydantic.model_validator(mode="after")
    def _check_seeds_and_arms(self) -> BenchmarkConfig:
        if not self.arms:
            raise ValueError("arms: at least one arm is needed")
        for name, arm in self.arms.items():
            if name == BASE_GROUP or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(f"arms: name {name!r}: expected letters, digits, - and _, and not {BASE_GROUP!r}")
            if self.eval_seed in arm.seeds:
                raise ValueError(f"eval_seed {self.eval_seed} is a training seed of arm {name!r}; use another")
        if len(set(self.base_seeds)) != len(self.base_seeds):
            raise ValueError(f"base_seeds {self.base_seeds}: each noise seed once")
        if TUNING_NOISE_SEED in (self.eval_seed, *self.base_seeds):
            raise ValueError(f"noise seed {TUNING_NOISE_SEED} chose the demo's settings; report other seeds")
        return self
