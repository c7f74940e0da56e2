"""Questions about MuJoCo Reach scenes, for pretraining the backbone of the simulated world.

Only Reach is rendered: Push and Carry ("a block into a zone") stay out of pretraining, so a reward model
fine-tuned on them meets a goal relation the backbone never saw. Episodes are rendered once into a pool
(`build_reach_pool`, cached as .npz): the effector heads for one of the targets or for a random point, with
noise, so frames show it near, away from and moving between discs. `ReachQuestions` then draws questions
of every skill of `vlm_rewards.data.questions` from the pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from vlm_rewards.data.questions import (
    MIN_CHANGE,
    MIN_PROGRESS_GAP,
    SKILLS,
    PlacedObject,
    Question,
    order_question,
    placed,
    placed_objects,
    region_name,
    two_frames,
    with_article,
    yes_no,
)
from vlm_rewards.io import atomic_path
from vlm_rewards.robotics.config import EnvConfig
from vlm_rewards.robotics.tasks import COLOURS, reach_instruction
from vlm_rewards.tracking import Track, untracked

ACTION_NOISE = 0.3  # std of the Gaussian noise on the scripted actions
GAIN = 8.0  # action per metre of position error


@dataclass
class ReachPool:
    """Rendered Reach episodes: E episodes of T frames, K targets each."""

    frames: np.ndarray
    """(E, T, H, W, 3) uint8 top-camera renders."""
    effector: np.ndarray
    """(E, T, 2) effector positions in the picture, x right and y down in [0, 1]."""
    targets: np.ndarray
    """(E, K, 2) target positions in the picture."""
    colours: np.ndarray
    """(E, K) int indices into `COLOURS`."""
    heading: np.ndarray
    """(E,) the target each episode's effector heads for, -1 for a random point."""

    def save(self, path: Path) -> None:
        with atomic_path(path) as temporary, open(temporary, "wb") as file:
            np.savez(file, **{field.name: getattr(self, field.name) for field in fields(self)})

    @classmethod
    def load(cls, path: Path) -> ReachPool:
        with np.load(path) as data:
            return cls(**{field.name: data[field.name] for field in fields(cls)})


def build_reach_pool(
    env_config: EnvConfig, num_episodes: int, num_frames: int, steps_per_frame: int, seed: int, track: Track | None
) -> ReachPool:
    from vlm_rewards.robotics.envs import make_env

    env = make_env(env_config.model_copy(update={"num_envs": 1}))
    task = env.unwrapped
    camera = task.model.camera(env_config.camera)
    half_width = float(camera.pos[2]) * math.tan(math.radians(float(camera.fovy[0]) / 2))

    def picture(xy: np.ndarray) -> np.ndarray:  # world (x, y) -> picture (right, down) in [0, 1]
        return np.stack([0.5 + xy[..., 0] / (2 * half_width), 0.5 - xy[..., 1] / (2 * half_width)], axis=-1)

    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    episodes = []
    try:
        for episode in (track or untracked)(range(num_episodes), "render Reach pool"):
            env.reset(seed=seed + episode)
            targets = task.layout.positions.copy()
            heading = int(rng.integers(-1, len(targets)))
            goal = targets[heading] if heading >= 0 else rng.uniform(-0.3, 0.3, size=2)
            frames, effector = [], []
            for _ in range(num_frames):
                frames.append(task.render())
                effector.append(task.ee_position.copy())
                for _ in range(steps_per_frame):
                    action = np.clip(GAIN * (goal - task.ee_position) + rng.normal(0, ACTION_NOISE, 2), -1, 1)
                    task.step(action.astype(np.float32))  # the bare task: no render per step
            colours = [names.index(colour) for colour in task.layout.colours]
            episodes.append((np.stack(frames), picture(np.stack(effector)), picture(targets), colours, heading))
    finally:
        env.close()
    frames, effector, targets, colours, heading = (np.stack(part) for part in zip(*episodes))
    return ReachPool(frames, effector, targets, colours.astype(np.int64), heading.astype(np.int64))


class ReachQuestions:
    """Questions of every skill about the pool's episodes; the effector is called "the gripper"."""

    def __init__(self, pool: ReachPool):
        self.pool = pool
        self.names = list(COLOURS)
        self.headed = np.flatnonzero(pool.heading >= 0)
        if not len(self.headed):
            raise ValueError("the Reach pool has no episode heading for a target; render more episodes")

    def __call__(self, rng: np.random.Generator) -> Question:
        return getattr(self, SKILLS[rng.integers(len(SKILLS))])(rng)

    def _frame(self, rng: np.random.Generator) -> tuple[int, int]:
        return int(rng.integers(len(self.pool.frames))), int(rng.integers(self.pool.frames.shape[1]))

    def _colour(self, episode: int, target: int) -> str:
        return self.names[self.pool.colours[episode, target]]

    @property
    def object_names(self) -> list[str]:
        """The names of the things its frames show: a target of each colour, and the gripper."""
        return [f"{colour} target" for colour in self.names] + ["gripper"]

    def objects(self, episode: int, frame_indices: list[int]) -> tuple[tuple[PlacedObject, ...], ...]:
        names = [f"{self._colour(episode, k)} target" for k in range(self.pool.targets.shape[1])] + ["gripper"]
        targets = self.pool.targets[episode]
        return tuple(placed_objects(names, np.vstack([targets, self.pool.effector[episode, t]])) for t in frame_indices)

    def presence(self, rng: np.random.Generator) -> Question:
        episode, t = self._frame(rng)
        shown = {self._colour(episode, k) for k in range(self.pool.colours.shape[1])}
        candidates = sorted(shown) if rng.random() < 0.5 else sorted(set(self.names) - shown)
        colour = candidates[rng.integers(len(candidates))]
        frames = self.pool.frames[episode, t : t + 1]
        question = f"Is there {with_article(f'{colour} target')}?"
        return Question(frames, question, yes_no(colour in shown), "presence", self.objects(episode, [t]))

    def location(self, rng: np.random.Generator) -> Question:
        episode, t = self._frame(rng)
        frames = self.pool.frames[episode, t : t + 1]
        target = int(rng.integers(-1, self.pool.targets.shape[1]))
        objects = self.objects(episode, [t])
        if target < 0:
            where = region_name(*self.pool.effector[episode, t])
            return Question(frames, "Where is the gripper?", where, "location", objects)
        question = f"Where is the {self._colour(episode, target)} target?"
        return Question(frames, question, region_name(*self.pool.targets[episode, target]), "location", objects)

    def caption(self, rng: np.random.Generator) -> Question:
        episode, t = self._frame(rng)
        targets = self.pool.targets[episode]
        reading_order = np.lexsort((targets[:, 0], targets[:, 1]))
        parts = [f"{with_article(f'{self._colour(episode, k)} target')} {placed(targets[k])}" for k in reading_order]
        parts.append(f"the gripper {placed(self.pool.effector[episode, t])}")
        frames = self.pool.frames[episode, t : t + 1]
        return Question(frames, "What is in the picture?", ", ".join(parts), "caption", self.objects(episode, [t]))

    def closer(self, rng: np.random.Generator) -> Question:
        num_frames = self.pool.frames.shape[1]
        while True:
            episode = int(rng.integers(len(self.pool.frames)))
            target = int(rng.integers(self.pool.targets.shape[1]))
            first, second = sorted(rng.choice(num_frames, size=2, replace=False))
            distance = np.linalg.norm(self.pool.effector[episode] - self.pool.targets[episode, target], axis=1)
            change = distance[second] - distance[first]
            if abs(change) >= MIN_CHANGE:
                break
        question = f"Did the gripper move toward the {self._colour(episode, target)} target?"
        shown = [first, second]
        frames = self.pool.frames[episode, shown]
        return Question(frames, question, yes_no(change < 0), "closer", self.objects(episode, shown))

    def order(self, rng: np.random.Generator) -> Question:
        num_frames = self.pool.frames.shape[1]
        while True:
            episode = int(self.headed[rng.integers(len(self.headed))])
            goal = self.pool.targets[episode, self.pool.heading[episode]]
            distance = np.linalg.norm(self.pool.effector[episode] - goal, axis=1)
            progress = 1.0 - distance / max(distance[0], 1e-6)
            earlier, later = sorted(rng.choice(num_frames, size=2, replace=False))
            if progress[later] - progress[earlier] >= MIN_PROGRESS_GAP:
                break
        shown, answer = two_frames(rng, earlier, later)
        instruction = reach_instruction(self._colour(episode, int(self.pool.heading[episode])))
        question = order_question(instruction)
        return Question(self.pool.frames[episode, shown], question, answer, "order", self.objects(episode, shown))
