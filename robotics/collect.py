"""`vlmr collect`: scripted rollouts of the tasks written as an episode dataset (data/README.md) or, with
`format: lerobot`, as a LeRobot v3 dataset (`to_lerobot`).

Policies: `expert`, `noisy` (expert + Gaussian action noise), `wrong_object` (the expert for a
distractor: a failure that looks competent), `random`, `detour` (the expert after a random waypoint),
and trained SB3 policies (`checkpoints`): an RL run's own states, e.g. to teach a reward model the
states its policies reach. Episodes run the full time limit (no termination on success), `num_envs`
at a time in a gymnasium vector env; episode j is reset with seed `seed + j`, so a config fixes the
dataset.

Progress labels (`progress_label`):
- `geometric`: the env's task progress per frame (right for every policy, failures included);
- `time`: linear from 0 at the first frame to 1 at the first successful frame, 1 after it; all 0 for
  an unsuccessful episode (ReWiND's convention: a clip that does not do the task earns nothing);
- `stage`: like `time`, but the way to success is split into the task's stages (Push: approach,
  then push) with their progress budgets, spread inside a stage by visual change
  (`vlm_rewards.data.labels.stage_budget_progress`).

Every frame also gets the env's `stage` (stages completed) and `is_success` as the episode's per-frame
`stage` and `frame_success` labels, for the success and stage heads of a progress RM, and, where the env
reports it (Reach, Carry), where the effector heads next as `goal_offset`, for the goal-offset head.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator

from vlm_rewards.data.episodes import EpisodeDataset, EpisodeRecord, write_episodes
from vlm_rewards.data.labels import stage_budget_progress, visual_change
from vlm_rewards.data.lerobot import LeRobotEpisodeData, write_lerobot
from vlm_rewards.robotics.config import CollectConfig
from vlm_rewards.robotics.envs import make_gym_vector
from vlm_rewards.robotics.experts import (
    detour_reached,
    detour_waypoint,
    make_expert,
    pick_wrong_target,
    scripted_action,
)
from vlm_rewards.robotics.reward_wrapper import unstack_infos
from vlm_rewards.tracking import Track, untracked

logger = logging.getLogger("vlm_rewards.robotics.collect")


@dataclass
class Rollout:
    """One episode as stepped: frames per camera, the env's info per frame, the policy; per step (one fewer than
    frames) the observation acted on, the action and the env's reward."""

    policy: str
    frames: dict[str, list[np.ndarray]]
    infos: list[dict]
    reference: np.ndarray | None
    states: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)

    @property
    def success(self) -> bool:
        return bool(self.infos[-1]["is_success"])


def policy_schedule(config: CollectConfig) -> list[str]:
    """The policy of every episode, in a seeded shuffled order (so every batch mixes policies)."""
    names = [name for name, count in config.episodes.items() for _ in range(count)]
    if not names:
        raise ValueError("collect: episodes asks for 0 episodes; give at least one policy a count > 0")
    return [names[i] for i in np.random.default_rng(config.seed).permutation(len(names))]


def run_rollouts(config: CollectConfig, track: Track | None = None) -> Iterator[Rollout]:
    """Roll out every scheduled episode, `num_envs` at a time."""
    cameras = [config.env.camera, *[view for view in config.views if view != config.env.camera]]
    schedule = policy_schedule(config)
    trained = load_checkpoint_policies(config)
    envs = make_gym_vector(config.env, cameras=cameras, terminate_on_success=False, goal_image=config.goal_reference)
    expert = make_expert(gym.make(config.env.id, num_distractors=config.env.num_distractors))
    rng = np.random.default_rng(config.seed)
    batches = range(0, len(schedule), envs.num_envs)
    try:
        for start in (track or untracked)(batches, "collect"):
            policies = schedule[start : start + envs.num_envs]
            yield from _run_batch(envs, expert, trained, policies, config, rng, seed=config.seed + start)
    finally:
        envs.close()


def load_checkpoint_policies(config: CollectConfig) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Each used `checkpoints` entry as a function from one observation to one action."""
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.utils import set_random_seed

    algorithms = {"ppo": PPO, "sac": SAC}
    used = {name: checkpoint for name, checkpoint in config.checkpoints.items() if config.episodes.get(name, 0)}
    if not used:
        return {}
    env = gym.make(config.env.id, num_distractors=config.env.num_distractors)
    env_shape = env.observation_space.shape
    env.close()
    policies = {}
    set_random_seed(config.seed)  # the policies sample their actions with torch's global generator
    for name, checkpoint in used.items():
        if not Path(checkpoint.path).is_file():
            raise FileNotFoundError(
                f"collect: checkpoints.{name}.path {checkpoint.path!r} is not a file (an SB3 model.zip)"
            )
        model = algorithms[checkpoint.algo].load(checkpoint.path, device="cpu")
        if model.observation_space.shape != env_shape:
            raise ValueError(
                f"collect: checkpoints.{name} takes observations of shape {model.observation_space.shape}; "
                f"{config.env.id} with num_distractors={config.env.num_distractors} gives {env_shape}"
            )
        policies[name] = partial(_checkpoint_action, model, checkpoint.deterministic)
    return policies


def _checkpoint_action(model, deterministic: bool, obs: np.ndarray) -> np.ndarray:
    return model.predict(obs, deterministic=deterministic)[0].astype(np.float32)


def _run_batch(envs, expert, trained, policies: list[str], config: CollectConfig, rng, seed: int) -> Iterator[Rollout]:
    num_envs = envs.num_envs
    obs, infos = envs.reset(seed=[seed + i for i in range(num_envs)])
    per_env = unstack_infos(infos, num_envs)
    rollouts = [
        Rollout(policy, {name: [frame] for name, frame in info["frames"].items()}, [info], info.get("reference"))
        for policy, info in zip(policies, per_env)
    ]
    policies = policies + ["random"] * (num_envs - len(policies))  # spare envs of a last, short batch
    noises = [config.noise if policy == "noisy" else 0.0 for policy in policies]
    wrong = [pick_wrong_target(expert, o, rng) for o in obs]
    waypoints = [detour_waypoint(expert, rng) if policy == "detour" else None for policy in policies]
    done = np.zeros(num_envs, bool)
    while not done.all():
        actions = np.stack(
            [
                trained[p](o) if p in trained else scripted_action(expert, _base_policy(p), o, rng, n, w, d)
                for p, o, n, w, d in zip(policies, obs, noises, wrong, waypoints)
            ]
        )
        states = obs
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        waypoints = [detour_reached(o, waypoint) for o, waypoint in zip(obs, waypoints)]
        for i, info in enumerate(unstack_infos(infos, num_envs)[: len(rollouts)]):
            if not done[i]:
                rollouts[i].states.append(states[i])
                rollouts[i].actions.append(actions[i])
                rollouts[i].rewards.append(float(rewards[i]))
                for name, frame in info["frames"].items():
                    rollouts[i].frames[name].append(frame)
                rollouts[i].infos.append(info)
        done |= terminated | truncated
    yield from rollouts


def _base_policy(policy: str) -> str:
    return "expert" if policy == "noisy" else policy


def progress_labels(
    rollout: Rollout, kind: str, stage_budgets: tuple[float, ...], camera: str, distance_scale: float
) -> np.ndarray:
    geometric = np.array([info["progress"] for info in rollout.infos], dtype=np.float32)
    if kind == "geometric":
        return geometric
    if kind == "distance":
        if "goal_offset" not in rollout.infos[0]:
            raise ValueError("collect: progress_label=distance needs an env that reports goal_offset (Reach does)")
        offsets = np.array([info["goal_offset"] for info in rollout.infos])
        return distance_progress(offsets, np.array([info["is_success"] for info in rollout.infos]), distance_scale)
    num_frames = len(geometric)
    successes = np.flatnonzero([info["is_success"] for info in rollout.infos])
    if len(successes) == 0:
        return np.zeros(num_frames, np.float32)
    reached = int(successes[0])
    labels = np.ones(num_frames, np.float32)
    if reached == 0:
        return labels
    if kind == "time":
        labels[: reached + 1] = np.linspace(0.0, 1.0, reached + 1)
        return labels
    stages = np.array([info["stage"] for info in rollout.infos[: reached + 1]])
    ends = [int(np.argmax(stages >= k)) for k in range(1, len(stage_budgets))] + [reached]
    budgets = list(stage_budgets)
    keep = [k for k in range(len(ends)) if ends[k] >= 1 and (k == 0 or ends[k] > ends[k - 1])]
    ends, budgets = [ends[k] for k in keep], [budgets[k] for k in keep]
    if not ends or ends[-1] != reached:  # a stage skipped at the very end: one stage for everything
        ends, budgets = [reached], [1.0]
    frames = np.stack(rollout.frames[camera][: reached + 1])
    labels[: reached + 1] = stage_budget_progress(ends, budgets, reached + 1, change=visual_change(frames))
    return labels


def distance_progress(offsets: np.ndarray, reached: np.ndarray, scale: float) -> np.ndarray:
    """1 − |offset| / scale, clipped to [0, 1], and 1 where the goal is reached: a function of the frame alone.
    Geometric progress divides by the episode's start distance instead, so one state has as many labels as
    there are starts, and an RM reading the state fits their mean."""
    progress = np.clip(1.0 - np.linalg.norm(offsets, axis=-1) / scale, 0.0, 1.0)
    return np.where(reached, 1.0, progress).astype(np.float32)


def to_record(rollout: Rollout, episode_id: int, config: CollectConfig, stage_budgets) -> EpisodeRecord:
    camera = config.env.camera
    progress = progress_labels(rollout, config.progress_label, stage_budgets, camera, config.distance_scale)
    keep = _strided(len(progress), config.frame_stride)
    views = {name: np.stack(frames)[keep] for name, frames in rollout.frames.items() if name != camera}
    return EpisodeRecord(
        episode_id=episode_id,
        instruction=rollout.infos[0]["instruction"],
        frames=np.stack(rollout.frames[camera])[keep],
        progress=progress[keep],
        success=rollout.success,
        policy=rollout.policy,
        views=views,
        reference=rollout.reference,
        stage=np.array([info.get("stage", -1) for info in rollout.infos])[keep],  # -1: an env without stages
        frame_success=np.array([bool(info["is_success"]) for info in rollout.infos])[keep],
        goal_offset=np.array([info["goal_offset"] for info in rollout.infos])[keep]
        if "goal_offset" in rollout.infos[0]
        else None,
    )


def relabelled_records(rollout: Rollout, first_id: int, config: CollectConfig) -> list[EpisodeRecord]:
    """The rollout once per target it was not told to reach: that target's instruction, geometric
    progress toward it (`target_progress` in the env's info), policy `<policy>_relabelled`."""
    if "target_progress" not in rollout.infos[0]:
        raise ValueError(
            f"collect: relabel_targets needs an env that reports target_progress ({config.env.id} does not)"
        )
    instruction = rollout.infos[0]["instruction"]
    keep = _strided(len(rollout.infos), config.frame_stride)
    progress = np.array([info["target_progress"] for info in rollout.infos], dtype=np.float32)
    offsets = (
        np.array([info["target_offsets"] for info in rollout.infos]) if "target_offsets" in rollout.infos[0] else None
    )
    if config.progress_label == "distance":
        progress = distance_progress(offsets, progress >= 1.0, config.distance_scale)
    frames = np.stack(rollout.frames[config.env.camera])[keep]
    views = {name: np.stack(f)[keep] for name, f in rollout.frames.items() if name != config.env.camera}
    records = []
    for index, text in enumerate(rollout.infos[0]["target_instructions"].split("|")):
        if text == instruction:
            continue
        records.append(
            EpisodeRecord(
                episode_id=first_id + len(records),
                instruction=text,
                frames=frames,
                progress=progress[keep, index],
                success=bool(progress[-1, index] >= 1.0),
                policy=f"{rollout.policy}_relabelled",
                views=views,
                reference=None,
                frame_success=progress[keep, index] >= 1.0,  # the target's stages are unknown
                goal_offset=None if offsets is None else offsets[keep, index],
            )
        )
    return records


def to_lerobot(rollout: Rollout, config: CollectConfig, stage_budgets) -> LeRobotEpisodeData:
    """LeRobot's convention, one row per step t: the frames and state acted on, the action, and what the step
    brought (`next.reward`, `next.done`, `next.success`); the observation after the last step is not a row.
    Every step is kept (frame_stride is for the episode format); the progress labels go to sarm_progress.parquet."""
    steps = len(rollout.actions)
    progress = progress_labels(rollout, config.progress_label, stage_budgets, config.env.camera, config.distance_scale)
    return LeRobotEpisodeData(
        task=rollout.infos[0]["instruction"],
        videos={f"observation.images.{name}": np.stack(frames[:steps]) for name, frames in rollout.frames.items()},
        features={
            "observation.state": np.asarray(rollout.states, np.float32),
            "action": np.asarray(rollout.actions, np.float32),
            "next.reward": np.asarray(rollout.rewards, np.float32),
            "next.done": np.arange(steps) == steps - 1,
            "next.success": np.array([bool(info["is_success"]) for info in rollout.infos[1:]]),
        },
        success=rollout.success,
        policy=rollout.policy,
        progress=progress[:steps],
    )


def _strided(num_frames: int, stride: int) -> np.ndarray:
    keep = np.arange(0, num_frames, stride)
    return keep if keep[-1] == num_frames - 1 else np.append(keep, num_frames - 1)


def collect(config: CollectConfig, track: Track | None = None) -> EpisodeDataset | Path:
    """Roll out the configured policies and write the dataset to `config.output` (format lerobot: returns its
    folder; read it with `vlm_rewards.data.lerobot`)."""
    stage_budgets = load_env_creator(gym.spec(config.env.id).entry_point).stage_budgets
    counts: dict[str, list[int]] = {}

    if config.progress_label == "distance" and len(stage_budgets) > 1:
        raise ValueError(
            f"collect: progress_label=distance measures toward one goal; {config.env.id} has "
            f"{len(stage_budgets)} stages (its goal changes), so use geometric or stage"
        )
    if config.format == "lerobot":
        return _collect_lerobot(config, stage_budgets, track)
    if config.relabel_targets and (config.progress_label not in ("geometric", "distance") or config.goal_reference):
        raise ValueError(
            "collect: relabel_targets needs progress_label geometric or distance and goal_reference=false (the "
            "goal render shows the instructed target only)"
        )

    def records() -> Iterator[EpisodeRecord]:
        episode_id = 0
        for rollout in run_rollouts(config, track):
            counts.setdefault(rollout.policy, []).append(rollout.success)
            yield to_record(rollout, episode_id, config, stage_budgets)
            episode_id += 1
            for record in relabelled_records(rollout, episode_id, config) if config.relabel_targets else []:
                yield record
                episode_id += 1

    generator = {"name": "vlm_rewards.robotics.collect", **config.model_dump(mode="json")}
    try:  # write_episodes checks its folder before it draws the first record, so before any rollout runs
        dataset = write_episodes(config.output, records(), config.frame_format, fps=config.fps, generator=generator)
    except FileExistsError as error:
        raise ValueError(f"collect: output {config.output!r}: {error}") from None
    for policy, successes in sorted(counts.items()):
        logger.info("%s: %d episodes, success rate %.2f", policy, len(successes), np.mean(successes))
    logger.info("wrote %d episodes to %s", len(dataset), config.output)
    return dataset


def _collect_lerobot(config: CollectConfig, stage_budgets, track: Track | None) -> Path:
    if config.relabel_targets:
        raise ValueError("collect: relabel_targets writes the episode format only; set format: episodes")
    rollouts = run_rollouts(config, track)
    episodes = (to_lerobot(rollout, config, stage_budgets) for rollout in rollouts)
    try:  # write_lerobot checks its folder before it draws the first episode, so before any rollout runs
        root = write_lerobot(config.output, episodes, fps=config.fps, robot_type=config.env.id)
    except FileExistsError as error:
        raise ValueError(f"collect: output {config.output!r}: {error}") from None
    logger.info("wrote a LeRobot v3 dataset to %s", root)
    return root
