"""Job configs of `vlmr collect` and `vlmr rl` (pydantic; every knob has a default)."""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic

from robotics.experts import POLICIES
from robotics.reward_wrapper import RewardWrapperConfig
from vlm_rewards.config import JobConfig

# EnvConfig fields that only the vlmr/* tasks take, passed to them as keyword arguments of the same name
VLMR_SETTINGS = ("table", "marker_radius", "highlights", "palette", "success_distance")

# a Meta-World v3 task (robotics/metaworld.py; the metaworld extra, in its own venv)
MetaWorldId = Annotated[str, pydantic.StringConstraints(pattern=r"^metaworld/[a-z-]+-v\d+$")]


class EnvConfig(pydantic.BaseModel, extra="forbid"):
    id: Literal["vlmr/Reach-v0", "vlmr/Push-v0", "vlmr/Carry-v0"] | MetaWorldId = "vlmr/Reach-v0"
    num_envs: int = pydantic.Field(4, ge=1)
    vectorization: Literal["sync", "async"] = "sync"  # async: one process per env (renders in parallel)
    width: int = pydantic.Field(64, ge=16)
    height: int = pydantic.Field(64, ge=16)
    camera: str = "top"  # the main camera (the reward's `frames`)
    num_distractors: int = pydantic.Field(2, ge=1)
    # vlmr/* tasks: "gradient" shades the table by position (a visual cue for rotary-only vision towers)
    table: Literal["plain", "gradient"] = "plain"
    marker_radius: float = pydantic.Field(0.05, gt=0, le=0.1)  # vlmr/Reach-v0: drawn radius of targets and footprint
    # vlmr/* tasks: False renders without specular highlights. With them, the camera straight above sees every
    # flat marker washed pale (red as pink, the effector's dark footprint as grey); without, colours are saturated
    highlights: bool = True
    # vlmr/* tasks: the colours objects are drawn from (None: all seven of robotics.tasks.COLOURS)
    palette: list[str] | None = None
    # vlmr/Push-v0: (low, high) distance from the named block's start to its zone; None: anywhere ≥ 0.17 away
    push_distance: tuple[float, float] | None = None
    # vlmr/Push-v0: the effector starts behind the named block, within this many degrees of the push line
    # (30: a straight push; 180: anywhere around the block); None: anywhere
    push_start_angle: float | None = None
    # vlmr/* tasks: how close to its goal counts as success (None: the task's own, Reach 0.04, Push and Carry 0.05)
    success_distance: float | None = pydantic.Field(None, gt=0)
    max_episode_steps: int | None = None  # None: the task's default (Reach 50, Push 100, Carry 60)
    # sparse reward only: −cost on every step without success. 1 gives the goal-reaching convention (−1 a
    # step until success), the urgency the dense reward (progress − 1) has; 0: 1 on success, else 0
    sparse_step_cost: float = pydantic.Field(0.0, ge=0)

    @pydantic.model_validator(mode="after")
    def _task_settings_are_for_their_tasks(self) -> EnvConfig:
        for name in ("push_distance", "push_start_angle"):
            if getattr(self, name) is not None and self.id != "vlmr/Push-v0":
                raise ValueError(f"{name} is a vlmr/Push-v0 setting; env.id is {self.id!r}")
        for name in VLMR_SETTINGS:
            if getattr(self, name) != type(self).model_fields[name].default and not self.id.startswith("vlmr/"):
                raise ValueError(f"{name} is a setting of the vlmr/* tasks; env.id is {self.id!r}")
        return self


class CheckpointPolicy(pydantic.BaseModel, extra="forbid"):
    """A trained SB3 policy as a collection policy: its own states, which scripted experts do not visit."""

    path: str  # an SB3 model, e.g. a `vlmr rl` run's checkpoints/model.zip
    algo: Literal["ppo", "sac"] = "sac"
    deterministic: bool = False  # False: sample actions, as the RL loop explores


class CollectConfig(JobConfig):
    output: str = "runs/collect/reach"
    env: EnvConfig = EnvConfig()
    # episodes per policy: the scripted ones (robotics.experts.POLICIES) or a name of `checkpoints`
    episodes: dict[str, int] = {"expert": 24, "noisy": 16, "wrong_object": 12, "random": 12}
    # trained policies by name, e.g. {sac_learned0: {path: runs/carry_v1/rl/learned_seed0/checkpoints/model.zip}};
    # their observations must be this env's (the same env settings as their RL run)
    checkpoints: dict[str, CheckpointPolicy] = {}
    noise: float = pydantic.Field(0.3, ge=0)  # action noise std of the `noisy` expert
    progress_label: Literal["geometric", "time", "stage"] = "geometric"
    frame_stride: int = pydantic.Field(2, ge=1)  # keep every k-th frame (the first and last always)
    # Reach and Carry: also write every rollout once per other target (Carry: zone), the instruction naming it and the
    # geometric labels toward it (policy "<policy>_relabelled"): the same frames under different
    # instructions get different labels, so a reward model must bind the colour word to the scene
    relabel_targets: bool = False
    views: list[str] = ["front"]  # extra cameras stored as views
    goal_reference: bool = True  # store the goal render as the episode's `reference`
    frame_format: Literal["npz", "mp4"] = "npz"
    fps: int = 10
    seed: int = 0

    @pydantic.model_validator(mode="after")
    def _policies_are_known(self) -> CollectConfig:
        known = (*POLICIES, *self.checkpoints)
        unknown = [name for name in self.episodes if name not in known]
        if unknown:
            raise ValueError(
                f"episodes names policies {unknown}; expected scripted ones {POLICIES} or a name of checkpoints"
            )
        clashing = [name for name in self.checkpoints if name in POLICIES]
        if clashing:
            raise ValueError(f"checkpoints {clashing} take the name of a scripted policy; rename them")
        return self


class PPOParams(pydantic.BaseModel, extra="forbid"):
    n_steps: int = 128  # per env, per rollout
    batch_size: int = 128
    n_epochs: int = 10
    learning_rate: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    ent_coef: float = 0.0
    net_arch: list[int] = [64, 64]


class SACParams(pydantic.BaseModel, extra="forbid"):
    learning_rate: float = 1e-3
    buffer_size: int = 100_000
    batch_size: int = 256
    learning_starts: int = 500
    train_freq: int = 1
    gradient_steps: int = 1
    gamma: float = 0.99
    tau: float = 0.005
    # "auto_<init>": learned, starting at <init>; SB3's default start of 1.0 drowns rewards in [-1, 0]
    ent_coef: str | float = "auto_0.05"
    net_arch: list[int] = [128, 128]


class RewardChoice(pydantic.BaseModel, extra="forbid"):
    """sparse / dense: the env's own reward; learned: any reward config through the wrapper;
    goal_image: `goal_pixel_progress` against the env's goal render, through the wrapper."""

    source: Literal["sparse", "dense", "learned", "goal_image"] = "sparse"
    config: str | None = None  # reward YAML (path or shipped name) for source=learned
    wrapper: RewardWrapperConfig = RewardWrapperConfig()

    @pydantic.model_validator(mode="after")
    def _config_for_learned(self) -> RewardChoice:
        if self.source == "learned" and not self.config:
            raise ValueError("reward.source=learned needs reward.config (a reward YAML path or shipped name)")
        return self


class EvalConfig(pydantic.BaseModel, extra="forbid"):
    every: int = pydantic.Field(2048, ge=1)  # env steps between evaluations
    episodes: int = pydantic.Field(10, ge=1)  # on fixed seeds seed_start, seed_start + 1, ...
    seed_start: int = 10_000
    video: bool = True  # an mp4 of the first evaluation episode at each evaluation


class RLConfig(JobConfig):
    run_dir: str = "runs/rl/reach_sparse"
    algo: Literal["ppo", "sac"] = "ppo"
    env: EnvConfig = EnvConfig()
    reward: RewardChoice = RewardChoice()
    total_timesteps: int = pydantic.Field(20_000, ge=1)
    ppo: PPOParams = PPOParams()
    sac: SACParams = SACParams()
    eval: EvalConfig = EvalConfig()
    checkpoint_every: int = pydantic.Field(4096, ge=1)  # env steps
    # also keep each checkpoint's policy as checkpoints/model_<steps>.zip: the early policies a reward's
    # next round of data can roll out (`vlmr collect` checkpoints)
    keep_policy_snapshots: bool = False
    resume: bool = True  # continue from run_dir/checkpoints if it holds one
    seed: int = 0
    device: str = "cpu"

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> RLConfig:
        algo_gamma = self.ppo.gamma if self.algo == "ppo" else self.sac.gamma
        wrapper = self.reward.wrapper
        if (
            self.reward.source in ("learned", "goal_image")
            and wrapper.mode == "shaping"
            and wrapper.gamma != algo_gamma
        ):
            raise ValueError(
                f"reward.wrapper.gamma={wrapper.gamma} differs from {self.algo}.gamma={algo_gamma}; potential shaping "
                "keeps the optimal policy only with the algorithm's discount"
            )
        return self
