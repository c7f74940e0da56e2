"""Settings of the robotics jobs: `vlmr collect`, `vlmr rl`, `vlmr pipeline` and `vlmr grounding-sets`.

Pydantic only, every knob with a default: importing this module loads neither torch, stable-baselines3
nor MuJoCo, so a config is read and checked before any of them starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pydantic

from vlm_rewards.config import JobConfig, OutputDir, Settings, deep_merge, format_validation_error
from vlm_rewards.training.config import BackboneTraining, TrainRMConfig

# the scripted policies of vlm_rewards.robotics.experts
POLICIES = ("expert", "noisy", "wrong_object", "random", "detour")
# EnvConfig fields that only the vlmr/* tasks take, passed to them as keyword arguments of the same name
VLMR_SETTINGS = ("table", "marker_radius", "highlights", "palette", "success_distance")

# a Meta-World v3 task (robotics/metaworld.py; the metaworld extra, in its own venv)
MetaWorldId = Annotated[str, pydantic.StringConstraints(pattern=r"^metaworld/[a-z-]+-v\d+$")]


# ---------------------------------------------------------------------- env and collection


class EnvConfig(Settings):
    """The task and how it is rendered, shared by collection and RL."""

    id: Literal["vlmr/Reach-v0", "vlmr/Push-v0", "vlmr/Carry-v0"] | MetaWorldId = "vlmr/Reach-v0"
    """The task: a vlmr/* task, or a Meta-World v3 task `metaworld/<task>-v3`."""
    num_envs: int = pydantic.Field(4, ge=1)
    """Envs stepped side by side in the vector env."""
    vectorization: Literal["sync", "async"] = "sync"
    """sync: all envs in this process; async: one process per env (renders in parallel)."""
    width: int = pydantic.Field(64, ge=16)
    """Rendered frame width in pixels."""
    height: int = pydantic.Field(64, ge=16)
    """Rendered frame height in pixels."""
    camera: str = "top"
    """The main camera: the frames the reward reads."""
    num_distractors: int = pydantic.Field(2, ge=1)
    """Objects beside the named one (other targets, blocks or zones)."""
    table: Literal["plain", "gradient"] = "plain"
    """vlmr/* tasks: "gradient" shades the table by position (a visual cue for rotary-only vision towers)."""
    marker_radius: float = pydantic.Field(0.05, gt=0, le=0.1)
    """vlmr/Reach-v0: drawn radius of the targets and of the effector's footprint."""
    highlights: bool = True
    """vlmr/* tasks: False renders without specular highlights. With them, the camera straight above sees
    every flat marker washed pale (red as pink, the effector's dark footprint as grey); without, colours
    are saturated."""
    palette: list[str] | None = None
    """vlmr/* tasks: the colours objects are drawn from; None: all seven of
    vlm_rewards.robotics.tasks.COLOURS."""
    push_distance: tuple[float, float] | None = None
    """vlmr/Push-v0: (low, high) distance from the named block's start to its zone; None: anywhere at
    least 0.17 away."""
    push_start_angle: float | None = None
    """vlmr/Push-v0: the effector starts behind the named block, within this many degrees of the push line
    (30: a straight push; 180: anywhere around the block); None: anywhere."""
    success_distance: float | None = pydantic.Field(None, gt=0)
    """vlmr/* tasks: how close to its goal counts as success; None: the task's own (Reach 0.04, Push and
    Carry 0.05)."""
    max_episode_steps: int | None = None
    """Time limit of an episode; None: the task's default (Reach 50, Push 100, Carry 60)."""
    sparse_step_cost: float = pydantic.Field(0.0, ge=0)
    """Sparse reward only: −cost on every step without success. 1 gives the goal-reaching convention (−1 a
    step until success), the urgency the dense reward (progress − 1) has; 0: 1 on success, else 0."""

    @pydantic.model_validator(mode="after")
    def _task_settings_are_for_their_tasks(self) -> EnvConfig:
        for name in ("push_distance", "push_start_angle"):
            if getattr(self, name) is not None and self.id != "vlmr/Push-v0":
                raise ValueError(f"{name} is a vlmr/Push-v0 setting; env.id is {self.id!r}")
        for name in VLMR_SETTINGS:
            if getattr(self, name) != type(self).model_fields[name].default and not self.id.startswith("vlmr/"):
                raise ValueError(f"{name} is a setting of the vlmr/* tasks; env.id is {self.id!r}")
        return self


class CheckpointPolicy(Settings):
    """A trained SB3 policy as a collection policy: its own states, which scripted experts do not visit."""

    path: str
    """An SB3 model, e.g. a `vlmr rl` run's checkpoints/model.zip."""
    algo: Literal["ppo", "sac"] = "sac"
    """The algorithm that trained it."""
    deterministic: bool = False
    """False: sample actions, as the RL loop explores."""


class CollectConfig(JobConfig):
    """`vlmr collect`: scripted (or trained) rollouts written as an episode dataset."""

    output: str = "runs/collect/reach"
    """The episode dataset folder written."""
    env: EnvConfig = EnvConfig()
    """The task the episodes are rolled out in."""
    episodes: dict[str, pydantic.NonNegativeInt] = {"expert": 24, "noisy": 16, "wrong_object": 12, "random": 12}
    """Episodes per policy (>= 0): a scripted one (POLICIES) or a name of `checkpoints`."""
    checkpoints: dict[str, CheckpointPolicy] = {}
    """Trained policies by name, e.g. {sac_learned0: {path: runs/carry/rl/learned_seed0/checkpoints/model.zip}};
    their observations must be this env's (the same env settings as their RL run)."""
    noise: float = pydantic.Field(0.3, ge=0)
    """Action noise std of the `noisy` expert."""
    progress_label: Literal["geometric", "distance", "time", "stage"] = "geometric"
    """How frames are labelled with progress (see vlm_rewards.robotics.collect). geometric: the env's progress,
    1 − distance / the episode's start distance; distance (single-goal tasks): 1 − distance / distance_scale,
    the frame's own."""
    distance_scale: float = pydantic.Field(2.0, gt=0)
    """progress_label=distance: the goal distance (workspace units, objects in [−1, 1]²) labelled 0."""
    frame_stride: int = pydantic.Field(2, ge=1)
    """Keep every k-th frame (the first and the last always)."""
    relabel_targets: bool = False
    """Reach and Carry: also write every rollout once per other target (Carry: zone), the instruction
    naming it and the geometric labels toward it (policy "<policy>_relabelled"): the same frames under
    different instructions get different labels, so a reward model must bind the colour word to the scene."""
    views: list[str] = ["front"]
    """Extra cameras stored as views."""
    goal_reference: bool = True
    """Store the goal render as the episode's `reference`."""
    frame_format: Literal["npz", "mp4"] = "npz"
    """How the frames are stored (format episodes)."""
    format: Literal["episodes", "lerobot"] = "episodes"
    """episodes: the project's episode dataset; lerobot: a LeRobot v3 dataset for policy training (every step:
    state, action, next.reward / next.done / next.success, task, camera videos; docs/robotics.md)."""
    fps: int = 10
    """Frame rate of the stored clips."""
    seed: int = 0
    """Episode j resets with seed + j; also shuffles the policy order."""

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


# ---------------------------------------------------------------------- RL


class PPOParams(Settings):
    """SB3 PPO's arguments (their SB3 meaning), and the MLP sizes."""

    n_steps: int = 128
    """Env steps per env and rollout."""
    batch_size: int = 128
    """Minibatch size of an update."""
    n_epochs: int = 10
    """Passes over each rollout."""
    learning_rate: float = 3e-4
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE's bias-variance trade-off."""
    clip_range: float = 0.2
    """PPO's clipping of the probability ratio."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    net_arch: list[int] = [64, 64]
    """Hidden layer sizes of the policy and value MLPs."""


class SACParams(Settings):
    """SB3 SAC's arguments (their SB3 meaning), and the MLP sizes."""

    learning_rate: float = 1e-3
    """Adam learning rate."""
    buffer_size: int = 100_000
    """Replay buffer capacity, in transitions."""
    batch_size: int = 256
    """Minibatch size of an update."""
    learning_starts: int = 500
    """Env steps collected before the first update."""
    train_freq: int = 1
    """Env steps between updates."""
    gradient_steps: int = 1
    """Gradient steps per update."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Soft update coefficient of the target networks."""
    ent_coef: str | float = "auto_0.05"
    """Entropy weight; "auto_<init>": learned, starting at <init> (SB3's default start of 1.0 drowns
    rewards in [-1, 0])."""
    net_arch: list[int] = [128, 128]
    """Hidden layer sizes of the actor and critic MLPs."""


def check_ppo_batch(algo: str, ppo: PPOParams, env: EnvConfig) -> None:
    """PPO's minibatches are drawn from one rollout of n_steps * num_envs transitions: a larger batch_size is
    an error (SB3 would silently train on the whole rollout as one batch)."""
    rollout = ppo.n_steps * env.num_envs
    if algo == "ppo" and ppo.batch_size > rollout:
        raise ValueError(
            f"ppo.batch_size={ppo.batch_size} is larger than a rollout of ppo.n_steps * env.num_envs = "
            f"{ppo.n_steps} * {env.num_envs} = {rollout} transitions; use a batch_size <= {rollout}"
        )


class RewardWrapperConfig(Settings):
    """How a learned reward enters the env reward (the formulas: vlm_rewards.robotics.reward_wrapper)."""

    mode: Literal["replace", "add", "shaping"] = "shaping"
    """replace: the reward alone; add: on top of the env reward; shaping: potential-based shaping."""
    gamma: float = pydantic.Field(0.99, ge=0, le=1)
    """The shaping discount; use the RL algorithm's."""
    scale: float = 1.0
    """Multiplies the reward's progress (or its step, in shaping)."""
    terminal_potential: Literal["zero", "predicted"] = "zero"
    """Shaping: zero takes Φ = 0 at terminal states (the optimal policy unchanged); predicted keeps the
    reward's prediction."""
    success_bonus: float = 0.0
    """Added on the steps that succeed: the env's `is_success`, or with success_threshold the reward's."""
    success_threshold: float | None = pydantic.Field(None, gt=0, le=1)
    """None: success is the env's `is_success`. A number: success is the reward's `success` component (e.g. a
    trained RM's success head) at the step's frame ≥ this, as LeRobot's reward classifier; needs reward_every 1."""
    terminate_on_success: bool = False
    """End the episode (terminated) at the step the reward predicts success; needs success_threshold, and
    reward_every 1 without async_inference (the SB3 wrapper, `vlmr rl`, resets that env)."""
    normalize: bool = False
    """Divide the reward by its running std."""
    normalize_center: bool = False
    """With normalize, also subtract the running mean; scale-only keeps the sign of the reward (a success
    stays a gain)."""
    camera: str = "top"
    """The camera whose frames the reward reads."""
    views: list[str] = []
    """Extra cameras sent as `views` (for rewards that read several cameras)."""
    goal_image: bool = False
    """Send the env's goal render as `reference` (`vlmr rl`: on for any reward that needs one)."""
    reward_every: int = pydantic.Field(1, ge=0)
    """Call the reward every step (1), every k steps (k), or at rollout end only (0)."""
    async_inference: bool = False
    """With reward_every 1: run the reward call in a worker thread while the envs step on."""
    on_error: Literal["raise", "env_reward"] = "raise"
    """When a reward call fails: raise, or fall back to the env reward for that call (logged)."""
    monitor_key: str = "dense_reward"
    """The info key of the true reward that the hacking monitor correlates with."""

    @pydantic.model_validator(mode="after")
    def _predicted_success(self) -> RewardWrapperConfig:
        if self.terminate_on_success and self.success_threshold is None:
            raise ValueError("terminate_on_success needs success_threshold (the reward's success that ends an episode)")
        if self.success_threshold is not None and self.reward_every != 1:
            raise ValueError("success_threshold needs reward_every 1: success is read at each step's frame")
        if self.terminate_on_success and self.async_inference:
            raise ValueError("terminate_on_success needs async_inference false: the step must know it ended")
        return self


class RewardChoice(Settings):
    """sparse / dense: the env's own reward; learned: any reward config through the wrapper;
    goal_image: `goal_pixel_progress` against the env's goal render, through the wrapper."""

    source: Literal["sparse", "dense", "learned", "goal_image", "oracle"] = "sparse"
    """Where the RL reward comes from; oracle: the env's true progress (`info["progress"]`) as the potential
    through the wrapper, with the same weight: what a perfect progress RM would give."""
    config: str | None = None
    """source=learned: the reward YAML (a path or a shipped name)."""
    wrapper: RewardWrapperConfig = RewardWrapperConfig()
    """How a learned or goal-image reward enters the env reward."""

    @pydantic.model_validator(mode="after")
    def _config_for_learned(self) -> RewardChoice:
        if self.source == "learned" and not self.config:
            raise ValueError("reward.source=learned needs reward.config (a reward YAML path or shipped name)")
        return self


class EvalConfig(Settings):
    """Success rate on fixed seeds during training."""

    every: int = pydantic.Field(2048, ge=1)
    """Env steps between evaluations."""
    episodes: int = pydantic.Field(10, ge=1)
    """Episodes per evaluation, on the fixed seeds seed_start, seed_start + 1, ..."""
    seed_start: int = 10_000
    """The first evaluation seed."""
    video: bool = True
    """Write an mp4 of the first evaluation episode at each evaluation."""


class RLConfig(JobConfig):
    """`vlmr rl`: SB3 PPO or SAC on a task with a sparse, dense, learned, goal-image or oracle reward."""

    run_dir: str = "runs/rl/reach_sparse"
    """The run folder: config, logs, evaluations, videos and checkpoints."""
    algo: Literal["ppo", "sac"] = "ppo"
    """The RL algorithm; its settings are the section of the same name."""
    env: EnvConfig = EnvConfig()
    """The task trained on."""
    reward: RewardChoice = RewardChoice()
    """The reward the policy is trained with."""
    total_timesteps: int = pydantic.Field(20_000, ge=1)
    """The env step budget (a resumed run trains up to it)."""
    ppo: PPOParams = PPOParams()
    """Settings of algo=ppo."""
    sac: SACParams = SACParams()
    """Settings of algo=sac."""
    eval: EvalConfig = EvalConfig()
    """Evaluation on fixed seeds."""
    checkpoint_every: int = pydantic.Field(4096, ge=1)
    """Env steps between checkpoints."""
    keep_policy_snapshots: bool = False
    """Also keep each checkpoint's policy as checkpoints/model_<steps>.zip: the early policies a reward's
    next round of data can roll out (`vlmr collect` checkpoints)."""
    resume: bool = True
    """Continue from run_dir/checkpoints if it holds one."""
    seed: int = 0
    """Seeds the envs and the algorithm."""
    device: str = "cpu"
    """The torch device of the policy (and of the pipeline's learned reward)."""

    @pydantic.model_validator(mode="after")
    def _ppo_batch_fits_the_rollout(self) -> RLConfig:
        check_ppo_batch(self.algo, self.ppo, self.env)
        return self

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> RLConfig:
        algo_gamma = self.ppo.gamma if self.algo == "ppo" else self.sac.gamma
        wrapper = self.reward.wrapper
        if (
            self.reward.source in ("learned", "goal_image", "oracle")
            and wrapper.mode == "shaping"
            and wrapper.gamma != algo_gamma
        ):
            raise ValueError(
                f"reward.wrapper.gamma={wrapper.gamma} differs from {self.algo}.gamma={algo_gamma}; potential shaping "
                "keeps the optimal policy only with the algorithm's discount"
            )
        return self


# ---------------------------------------------------------------------- pipeline

Condition = Literal["sparse", "dense", "learned", "goal_image", "scripted", "oracle"]
# the shipped hand-written frame-reading rewards of the `scripted` condition, per (task, env.highlights):
# their palettes hold the colours as the camera renders them, which the highlights change
SCRIPTED_REWARDS = {
    ("vlmr/Reach-v0", True): "reach_marker_progress",
    ("vlmr/Reach-v0", False): "reach_marker_progress_matte",
    ("vlmr/Push-v0", True): "push_marker_progress",
    ("vlmr/Carry-v0", False): "carry_marker_progress_matte",
}
# held-out episodes at k x the episode length reset with seeds from collect.seed + k * this: past any training
# rollout (rollout j resets with collect.seed + j), so no held-out episode starts where a training one did
HELD_OUT_SEED_STRIDE = 1_000_000
# round k's rollouts reset from collect.seed + k * this (the config refuses ranges that overlap)
ROUND_SEED_STRIDE = 100_000
# at most this many tuning seeds per candidate (issue #36's protocol)
MAX_TUNING_SEEDS = 2


def _default_env() -> EnvConfig:
    # −1 a step until success: the urgency without which shaped policies stop short of the target
    return EnvConfig(max_episode_steps=30, sparse_step_cost=1.0)


def _default_collect() -> CollectConfig:
    # each rollout relabelled once per target: three progress curves, and two wrong-object ones, per render
    return CollectConfig(
        episodes={"expert": 48, "noisy": 32, "wrong_object": 32, "random": 16},
        views=[],
        frame_stride=1,
        goal_reference=False,
        relabel_targets=True,
    )


def _default_progress_rm() -> TrainRMConfig:
    # fine-tuned from the shipped backbone on (frame 0, frame t) clips: the clips the frame-by-frame reward scores;
    # the bins head (progress as a distribution, read as its mean) was chosen over regression on the tuning set, and
    # the goal-offset head (Reach's simulation state as an auxiliary target, weight 0.3) over none
    return TrainRMConfig(
        model={"backbone": "simworld", "reward": {"head": "bins", "max_frames": 128, "goal_offset_head": True}},
        data={
            "clip_frames": 2,
            "augment": {"mismatch": 0.0, "reverse": 0.0, "rewind": 0.0, "stall": 0.0, "subsample": 0.0},
        },
        optim={
            "steps": 400,
            "batch_size": 32,
            "lr": 2e-4,
            "warmup_steps": 50,
            "step_loss_weight": 1.0,
            "goal_offset_loss_weight": 0.3,
        },
        eval_every=400,
        save_every=200,
    )


def _default_rl() -> RLConfig:
    return RLConfig(
        algo="sac",
        total_timesteps=6000,
        sac={
            "learning_rate": 1e-3,
            "learning_starts": 500,
            "batch_size": 256,
            "ent_coef": "auto_0.05",
            "net_arch": [128, 128],
        },
        # the shaping term against the step cost of 1; Φ kept at the success step (Reach terminates there), chosen
        # over Φ(terminal) = 0 on tuning seeds (configs/experiments/robotics/main_job_tuning.yaml)
        reward={"wrapper": {"scale": 10.0, "terminal_potential": "predicted"}},
        eval={"every": 1500, "episodes": 20, "video": False},
    )


class RewardWindow(Settings):
    """The RM read frame by frame (`frame_window` reward): frame t scored as the clip [frame 0] + the last
    `window` frames up to t, so the potential is a function of what the frames show, not of the path."""

    window: int = pydantic.Field(1, ge=1)
    """Frames up to t in each scored clip."""
    keep_first: bool = True
    """Put the episode's first frame in front of each clip."""


class RewardShifts(Settings):
    """The RM averaged over shifted copies of each clip (`shift_average` reward), for an RM trained with
    `data.augment.shift`: a potential of one plateau per image token becomes ramps as wide as the shifts."""

    max_shift: int = pydantic.Field(8, ge=1)
    """The largest shift in pixels along each axis."""
    points: int = pydantic.Field(3, ge=2)
    """Shifts per axis, evenly spaced in −max_shift..max_shift: points² RM calls per scored clip."""


class Tuning(Settings):
    """Hyper-parameter candidates, tried on `tuning_seeds` only; the chosen one is the `rl` section of every
    test run."""

    candidates: dict[str, dict] = {}
    """Candidates by name, each a partial `rl` section merged into the pipeline's, e.g. {x10: {reward: {wrapper:
    {scale: 10.0}}}, x20: {reward: {wrapper: {scale: 20.0}}}}; empty: no tuning, the `rl` section as it is."""
    condition: Condition = "learned"
    """The condition the candidates are run with (one of `conditions`)."""
    rule: Literal["mean_success", "final_success"] = "mean_success"
    """How the best candidate is picked, by its mean over the tuning seeds of: mean_success, the success rate
    averaged over every evaluation (the area under the curve: final level and speed); final_success, the
    last evaluation's. Ties go to the candidate listed first."""
    eval_seed_start: int = 20_000
    """The first evaluation seed of every RL run not on a test seed (tuning candidates, rounds' policies), so
    the test runs' evaluation states steer nothing."""


class Round(Settings):
    """One round of a reward recipe: RL with the current RM keeps a policy snapshot at every checkpoint, each
    snapshot's rollouts are labelled with the env's progress, and the RM is trained further on them beside
    every earlier round's data."""

    seeds: list[int] = [100, 101]
    """RL seeds of the round's policies (none of them a test seed)."""
    rl: dict = {}
    """A partial `rl` section merged into the pipeline's for this round's runs, e.g. {total_timesteps: 30000,
    checkpoint_every: 5000}; every checkpoint's policy is kept and rolled out."""
    episodes: int = pydantic.Field(250, ge=1)
    """Rollouts per policy snapshot (sampled actions, as RL explores)."""
    progress_rm: dict = {}
    """A partial `vlmr train-rm` config merged into the last progress stage's, e.g. {optim: {steps: 4000}};
    trained from the model of the round before."""


class PipelineConfig(JobConfig):
    """`vlmr pipeline`: every knob of the stages; `env` is shared by collection and RL. Trainer and RL
    sections are the `vlmr train-rm` / `vlmr rl` configs (their output folders and data paths are set by
    the pipeline)."""

    output_dir: Path = Path("runs/pipeline")
    """The folder of every stage's output and of the report."""
    env: EnvConfig = pydantic.Field(default_factory=_default_env)
    """The task, for collection and RL."""
    collect: CollectConfig = pydantic.Field(default_factory=_default_collect)
    """The training episodes (its env and output are set by the pipeline)."""
    eval_episodes: dict[str, int] = {"expert": 24, "noisy": 8, "wrong_object": 8, "random": 8}
    """Held-out episodes per policy: a scripted one or a name of collect.checkpoints (an RL policy's own
    states). The expert episodes carry the VOC and instruction metrics: at 8, own-instruction accuracy moves
    in steps of 0.125."""
    eval_length_factors: list[int] = [1, 2]
    """Held-out episodes at k times the training episode length, one set per k."""
    preference_stage: TrainRMConfig | None = None
    """A preference RM on ShapesWorld pairs the progress RM starts from (grounds the colour words of a
    backbone trained from scratch); None: skip it (the shipped backbone knows them)."""
    progress_rm: TrainRMConfig = pydantic.Field(default_factory=_default_progress_rm)
    """The progress RM trained on the collected episodes (`max_frames` must cover the RL episode + 1)."""
    progress_rm_continued: list[dict] = []
    """Further progress-RM stages, each a partial `vlmr train-rm` config merged into progress_rm and
    started from the model of the stage before, e.g. {optim: {steps: 3000, lr: 3.0e-4}, data: {clip_frames:
    null}}: whole episodes after 8-frame clips. The RL conditions use the last stage's model."""
    earlier_training_data: list[Path] = []
    """Episode folders of earlier rounds the RM trains on beside this run's own data/train (a round of new
    rollouts that keeps what the earlier rounds collected); each is read as is, none is copied."""
    reward_window: RewardWindow | None = pydantic.Field(default_factory=RewardWindow)
    """Read the RM frame by frame (default: frame t as [frame 0, frame t], a potential of the state); None:
    the RM streams whole episodes (its context grows with t)."""
    reward_shifts: RewardShifts | None = None
    """Average the RM over shifted copies of each clip before reading it frame by frame; None: one copy."""
    rounds: list[Round] = []
    """Rounds after the RM stages, each RL with the RM so far, rollouts of its policies and the RM trained
    further on them; the test conditions use the last round's RM."""
    rl: RLConfig = pydantic.Field(default_factory=_default_rl)
    """The RL runs of every condition and seed (run_dir, env, reward source and seed set by the pipeline)."""
    rl_workers: int = pydantic.Field(2, ge=1)
    """RL runs trained at the same time, each in its own process with an equal share of the CPU cores as its
    torch threads (1: one after another, in this process; the small SAC networks leave a second core mostly
    idle). A run's numbers can differ in the last float bits with its thread count, so compare runs made
    with the same setting."""
    conditions: list[Condition] = ["sparse", "learned", "oracle"]
    """The rewards RL is run with on the test seeds, under equal budgets. The main job's default compares the
    learned potential with the task's sparse reward and with the oracle (the true progress as the potential,
    same weight: what a perfect RM gives); the full experiments add dense and scripted."""
    scripted_reward: str | None = None
    """The reward YAML (path or shipped name) of `scripted`; None: the task's shipped one (SCRIPTED_REWARDS)."""
    tuning: Tuning = Tuning()
    """Hyper-parameter candidates, run on the tuning seeds before any test run."""
    tuning_seeds: list[int] = []
    """RL seeds of every tuning candidate (at most 2; none of them a test seed)."""
    test_seeds: list[int] = [0, 1]
    """RL seeds of every condition, run once, at the end, with the chosen candidate."""
    hacking_rise: float = 0.2
    """Flagged as hacked: learned progress rose by this much while success stayed below 0.2."""

    @pydantic.model_validator(mode="after")
    def _scripted_reward_for_the_task(self) -> PipelineConfig:
        scene = (self.env.id, self.env.highlights)
        if "scripted" in self.conditions and self.scripted_reward is None and scene not in SCRIPTED_REWARDS:
            raise ValueError(
                f"conditions has 'scripted' and no scripted_reward; there is no shipped one for env.id "
                f"{self.env.id!r} with env.highlights {self.env.highlights} (only for (id, highlights) "
                f"{sorted(SCRIPTED_REWARDS)}): set scripted_reward or drop 'scripted'"
            )
        return self

    @pydantic.model_validator(mode="after")
    def _ppo_batch_fits_the_rollout(self) -> PipelineConfig:
        try:  # with the env the RL runs get (the rl section was checked with its own)
            check_ppo_batch(self.rl.algo, self.rl.ppo, self.env)
        except ValueError as error:
            raise ValueError(f"rl: {error}") from None
        return self

    @pydantic.model_validator(mode="after")
    def _held_out_policies_are_known(self) -> PipelineConfig:
        try:
            self.collect.model_validate({**self.collect.model_dump(), "episodes": self.eval_episodes})
        except pydantic.ValidationError as error:
            raise ValueError(f"eval_episodes: {format_validation_error(error)}") from None
        return self

    @pydantic.model_validator(mode="after")
    def _candidates_and_rounds_are_valid_sections(self) -> PipelineConfig:
        for name, update in self.tuning.candidates.items():
            self.rl_section(update, where=f"tuning.candidates.{name}")
        for index, round_ in enumerate(self.rounds):
            self.rl_section(round_.rl, where=f"rounds[{index}].rl")
            self.round_progress_stage(index)
        return self

    @pydantic.model_validator(mode="after")
    def _seed_protocol(self) -> PipelineConfig:
        for name in ("tuning_seeds", "test_seeds"):
            seeds = getattr(self, name)
            if len(set(seeds)) != len(seeds):
                raise ValueError(f"{name} {seeds} repeats a seed; each seed is run once")
        if self.conditions and not self.test_seeds:
            raise ValueError(f"conditions {self.conditions} with no test_seeds; name the seeds every condition runs")
        tuning = self.tuning
        if tuning.candidates and not 1 <= len(self.tuning_seeds) <= MAX_TUNING_SEEDS:
            raise ValueError(
                f"tuning.candidates need 1 to {MAX_TUNING_SEEDS} tuning_seeds (each candidate runs on all of them), "
                f"got {self.tuning_seeds}"
            )
        if self.tuning_seeds and not tuning.candidates:
            raise ValueError(f"tuning_seeds {self.tuning_seeds} without tuning.candidates: there is nothing to tune")
        if tuning.candidates and tuning.condition not in self.conditions:
            raise ValueError(f"tuning.condition {tuning.condition!r} is not one of conditions {self.conditions}")
        others = {"tuning_seeds": self.tuning_seeds}
        others |= {f"rounds[{index}].seeds": round_.seeds for index, round_ in enumerate(self.rounds)}
        for name, seeds in others.items():
            shared = sorted(set(seeds) & set(self.test_seeds))
            if shared:
                raise ValueError(
                    f"{name} and test_seeds share {shared}: a test seed must not choose the hyper-parameters or the "
                    "reward's data it reports on; use disjoint seeds"
                )
        return self

    @pydantic.model_validator(mode="after")
    def _reset_seeds_are_disjoint(self) -> PipelineConfig:
        ranges = {"collect (training rollouts)": (self.collect.seed, sum(self.collect.episodes.values()))}
        for factor in self.eval_length_factors:
            ranges[f"eval_{factor}x (held out)"] = (self.held_out_seed(factor), sum(self.eval_episodes.values()))
        ranges["rl.eval"] = (self.rl.eval.seed_start, self.rl.eval.episodes)
        if self.tuning.candidates or self.rounds:
            ranges["tuning.eval_seed_start"] = (self.tuning.eval_seed_start, self.rl.eval.episodes)
        for index, round_ in enumerate(self.rounds):
            rl = self.rl_section(round_.rl)
            snapshots = rl.total_timesteps // rl.checkpoint_every + 1  # at most: every checkpoint, and the last
            rollouts = len(round_.seeds) * snapshots * round_.episodes
            ranges[f"rounds[{index}] (rollouts)"] = (self.round_seed(index), rollouts)
        named = sorted(ranges.items(), key=lambda item: item[1][0])
        for (first, (start, count)), (second, (next_start, _)) in zip(named, named[1:]):
            if start + count > next_start:
                raise ValueError(
                    f"the reset seeds of {first} ({start}..{start + count - 1}) reach into those of {second} (from "
                    f"{next_start}): the same start states would be in both; move collect.seed, rl.eval.seed_start "
                    "or tuning.eval_seed_start"
                )
        return self

    def held_out_seed(self, factor: int) -> int:
        return self.collect.seed + HELD_OUT_SEED_STRIDE * factor

    def round_seed(self, index: int) -> int:
        """The reset seed of the first rollout of rounds[index]."""
        return self.collect.seed + ROUND_SEED_STRIDE * (index + 1)

    def rl_section(self, update: dict, where: str = "rl") -> RLConfig:
        """The `rl` section with a partial one merged in (a tuning candidate's, a round's), validated."""
        try:
            return RLConfig.model_validate(deep_merge(self.rl.model_dump(mode="json"), update))
        except pydantic.ValidationError as error:
            raise ValueError(f"{where}: {format_validation_error(error)}") from None

    def round_progress_stage(self, index: int) -> TrainRMConfig:
        """The RM stage of rounds[index]: its partial config merged into the last progress stage's."""
        last = [self.progress_rm, *self.continued_progress_stages()][-1].model_dump(mode="json")
        try:
            return TrainRMConfig.model_validate(deep_merge(last, self.rounds[index].progress_rm))
        except pydantic.ValidationError as error:
            raise ValueError(f"rounds[{index}].progress_rm: {format_validation_error(error)}") from None

    @pydantic.model_validator(mode="after")
    def _continued_stages_are_trainer_configs(self) -> PipelineConfig:
        self.continued_progress_stages()  # a bad key or value fails here, naming the stage
        return self

    def continued_progress_stages(self) -> list[TrainRMConfig]:
        base = self.progress_rm.model_dump(mode="json")
        stages = []
        for index, update in enumerate(self.progress_rm_continued, start=1):
            try:
                stages.append(TrainRMConfig.model_validate(deep_merge(base, update)))
            except pydantic.ValidationError as error:
                raise ValueError(f"progress_rm_continued[{index - 1}]: {format_validation_error(error)}") from None
        return stages

    @property
    def scripted_reward_config(self) -> str | None:
        return self.scripted_reward or SCRIPTED_REWARDS.get((self.env.id, self.env.highlights))


# ---------------------------------------------------------------------- grounding sets


class GroundingConfig(JobConfig):
    """`vlmr grounding-sets`: probe sets that tell whether an RM matches a colour word to the pixels."""

    source: Path = Path("runs/collect/reach")
    """A `vlmr collect` dataset of vlmr/Reach-v0 (not relabelled)."""
    output: Path = Path("runs/grounding/presence")
    """The episode dataset folder written."""
    kind: Literal["presence", "pixels", "text"] = "presence"
    """Which probe set (see vlm_rewards.robotics.grounding)."""
    frames_per_episode: int = pydantic.Field(4, ge=1)
    """Evenly spaced frames kept of each episode."""
    pixel_colour: str = "red"
    """kind=pixels: the one colour every instruction names."""
    text_colours: list[str] = ["red", "green", "blue"]
    """kind=text: the colour words labelled 1."""
    seed: int = 0
    """Draws the distractor and absent colours."""

    @pydantic.field_validator("pixel_colour")
    @classmethod
    def _known_colour(cls, colour: str) -> str:
        colours = _scene_colours()
        if colour not in colours:
            raise ValueError(f"pixel_colour {colour!r}; expected one of {colours}")
        return colour

    @pydantic.field_validator("text_colours")
    @classmethod
    def _known_colours(cls, chosen: list[str]) -> list[str]:
        colours = _scene_colours()
        if set(chosen) - set(colours) or not chosen:
            raise ValueError(f"text_colours {chosen}; expected a non-empty subset of {colours}")
        return chosen


def _scene_colours() -> list[str]:
    """The colour names of the vlmr/* tasks (imported here: the tasks module loads MuJoCo)."""
    from vlm_rewards.robotics.tasks import COLOURS

    return sorted(COLOURS)


class ShapesSource(Settings):
    """ShapesWorld questions in the backbone's pretraining (`vlm_rewards.data.questions.ShapesQuestions`)."""

    weight: float = pydantic.Field(0.5, ge=0)
    """Share of the question stream, relative to the other sources' weights."""
    frame_size: int = pydantic.Field(56, ge=16)
    """Height and width of the frames in pixels."""
    num_frames: int = pydantic.Field(8, ge=2)
    """Frames per episode that two-frame questions (closer, order) pick from."""
    held_out: list[tuple[str, str]] = [("green", "triangle")]
    """(colour, shape) pairs never shown in pretraining: a combination the backbone meets first downstream."""


class ReachSource(Settings):
    """Reach scenes in the backbone's pretraining (`vlm_rewards.robotics.questions`); Push and Carry stay out."""

    weight: float = pydantic.Field(0.5, ge=0)
    """Share of the question stream, relative to the other sources' weights."""
    env: EnvConfig = pydantic.Field(default_factory=lambda: EnvConfig(num_envs=1))
    """The Reach env that renders the pool (its id must be vlmr/Reach-v0)."""
    num_episodes: int = pydantic.Field(2000, ge=1)
    """Episodes rendered into the training pool (cached in output_dir/reach_pool.npz)."""
    eval_episodes: int = pydantic.Field(100, ge=1)
    """Episodes of the separate evaluation pool (other reset seeds)."""
    num_frames: int = pydantic.Field(12, ge=2)
    """Frames kept per episode."""
    steps_per_frame: int = pydantic.Field(4, ge=1)
    """Env steps between kept frames."""

    @pydantic.field_validator("env")
    @classmethod
    def _reach_only(cls, env: EnvConfig) -> EnvConfig:
        if env.id != "vlmr/Reach-v0":
            raise ValueError(f"env.id {env.id!r}: the pretraining corpus renders vlmr/Reach-v0 only (Push and Carry "
                             "are the held-out task family)")  # fmt: skip
        return env


class BackboneConfig(JobConfig):
    """`vlmr pretrain-backbone`: a small Qwen2.5-VL pretrained on questions about ShapesWorld and Reach frames."""

    output_dir: OutputDir = Path("runs/backbone")
    """The run folder: the Reach pools, checkpoints, logs, eval.jsonl, curves.png and the exported `model/`."""
    training: BackboneTraining = pydantic.Field(default_factory=BackboneTraining)
    """The backbone's shape, the optimizer and the checkpoints."""
    shapes: ShapesSource = pydantic.Field(default_factory=ShapesSource)
    """ShapesWorld questions."""
    reach: ReachSource = pydantic.Field(default_factory=ReachSource)
    """Reach questions."""
    eval_questions: int = pydantic.Field(240, ge=1)
    """Fixed evaluation questions per source (and for the held-out pairs), drawn from held-out seeds."""
    seed: int = 0
    """Seed of the rendered pools and of the evaluation questions (the training stream's is training.seed)."""
    init_from: Path | None = None
    """Continue an earlier stage instead of starting from random weights: a backbone config file (.yaml),
    which is run (or resumed) first, or a backbone folder. The run keeps that model's weights and
    tokenizer and starts a fresh optimizer, schedule and scene readout (a warm restart); give it its own
    `training.seed` so it draws new questions. None: random weights of `training.model`."""
    ship_to: Path | None = None
    """Also copy the exported model (with its card) to this folder, replacing it: the shipped backbone lives
    in data/models/simworld-backbone. None: only output_dir/model."""
