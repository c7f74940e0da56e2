"""A procedural video world for training reward models from scratch: colored shapes on a table.

An instruction names one object and a goal region ("move the red circle to the top left"). Episodes
come from scripted policies: `expert` moves the named object to the goal, `random` random-walks every
object, `wrong_object` moves a distractor instead, `wrong_goal` moves the named object elsewhere.
Every frame's progress label is geometric, 1 − d_t / d_0 clipped to [0, 1], with d the distance of
the named object to its goal, so labels stay right for any trajectory, rewound or stalled ones too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 50, 47),
    "green": (60, 180, 75),
    "blue": (40, 90, 230),
    "yellow": (235, 210, 40),
    "purple": (150, 70, 200),
    "orange": (245, 130, 30),
}
SHAPES = ("circle", "square", "triangle")
GOALS: dict[str, tuple[float, float]] = {
    "top left": (0.2, 0.2),
    "top right": (0.8, 0.2),
    "bottom left": (0.2, 0.8),
    "bottom right": (0.8, 0.8),
    "center": (0.5, 0.5),
}
Policy = Literal["expert", "random", "wrong_object", "wrong_goal"]
SUCCESS_DISTANCE = 0.08


@dataclass(frozen=True)
class SceneObject:
    color: str
    shape: str


@dataclass(frozen=True)
class Task:
    target: int  # index into the scene's objects
    goal: str  # a key of GOALS
    instruction: str


@dataclass
class Episode:
    frames: np.ndarray  # (T, H, W, 3) uint8
    instruction: str
    progress: np.ndarray  # (T,) float32 in [0, 1]
    success: bool
    policy: str
    goal_frame: np.ndarray  # (1, H, W, 3) uint8: the start scene with the named object at its goal
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ShapesWorld:
    size: int = 56
    num_objects: int = 3
    radius: float = 0.09  # object half-size as a fraction of the frame side
    start_distance: float = 0.35  # the named object starts at least this far from its goal

    def sample_scene(self, rng: np.random.Generator) -> list[SceneObject]:
        colors = rng.choice(list(COLORS), size=self.num_objects, replace=False)
        shapes = rng.choice(SHAPES, size=self.num_objects)
        return [SceneObject(str(c), str(s)) for c, s in zip(colors, shapes)]

    def sample_task(self, rng: np.random.Generator, scene: list[SceneObject]) -> Task:
        target = int(rng.integers(len(scene)))
        goal = str(rng.choice(list(GOALS)))
        return Task(target, goal, self.instruction(scene[target], goal))

    @staticmethod
    def instruction(obj: SceneObject, goal: str) -> str:
        """One wording per task, so that two instructions differ exactly when their tasks do."""
        return f"move the {obj.color} {obj.shape} to the {goal}"

    def sample_positions(self, rng: np.random.Generator, task: Task) -> np.ndarray:
        """Start positions (N, 2) in [0, 1]²: objects apart, the named one far from its goal."""
        goal = np.array(GOALS[task.goal])
        low, high = self.radius, 1 - self.radius
        while True:
            positions = rng.uniform(low, high, size=(self.num_objects, 2))
            apart = all(
                np.linalg.norm(positions[i] - positions[j]) > 3 * self.radius
                for i in range(self.num_objects)
                for j in range(i)
            )
            if apart and np.linalg.norm(positions[task.target] - goal) > self.start_distance:
                return positions

    def render(self, scene: list[SceneObject], positions: np.ndarray, background: np.ndarray) -> np.ndarray:
        frame = background.copy()
        ys, xs = np.mgrid[0 : self.size, 0 : self.size]
        xs = (xs + 0.5) / self.size
        ys = (ys + 0.5) / self.size
        for obj, (cx, cy) in zip(scene, positions):
            dx, dy, r = xs - cx, ys - cy, self.radius
            if obj.shape == "circle":
                mask = dx**2 + dy**2 <= r**2
            elif obj.shape == "square":
                mask = (np.abs(dx) <= 0.85 * r) & (np.abs(dy) <= 0.85 * r)
            else:  # triangle pointing up
                mask = (dy <= r) & (dy >= -r) & (np.abs(dx) <= (dy + r) / 2)
            frame[mask] = COLORS[obj.color]
        return frame

    def background(self, rng: np.random.Generator) -> np.ndarray:
        shade = rng.integers(150, 200)
        noise = rng.integers(-6, 7, size=(self.size, self.size, 1))
        return np.clip(shade + noise, 0, 255).astype(np.uint8).repeat(3, axis=2)

    def progress(self, trajectory: np.ndarray, task: Task) -> np.ndarray:
        """Geometric progress per frame: 1 − d_t / d_0 clipped to [0, 1]."""
        distances = np.linalg.norm(trajectory[:, task.target] - np.array(GOALS[task.goal]), axis=1)
        return np.clip(1.0 - distances / distances[0], 0.0, 1.0).astype(np.float32)

    def rollout(self, rng: np.random.Generator, num_frames: int = 16, policy: Policy = "expert") -> Episode:
        scene = self.sample_scene(rng)
        task = self.sample_task(rng, scene)
        start = self.sample_positions(rng, task)
        trajectory = self._trajectory(rng, start, task, num_frames, policy)
        background = self.background(rng)
        frames = np.stack([self.render(scene, positions, background) for positions in trajectory])
        goal = np.array(GOALS[task.goal])
        final_distance = float(np.linalg.norm(trajectory[-1, task.target] - goal))
        goal_positions = start.copy()
        goal_positions[task.target] = goal
        return Episode(
            frames=frames,
            instruction=task.instruction,
            progress=self.progress(trajectory, task),
            success=final_distance < SUCCESS_DISTANCE,
            policy=policy,
            goal_frame=self.render(scene, goal_positions, background)[None],
            meta={"scene": scene, "task": task, "trajectory": trajectory},
        )

    def _trajectory(
        self, rng: np.random.Generator, start: np.ndarray, task: Task, num_frames: int, policy: Policy
    ) -> np.ndarray:
        """(T, N, 2) positions: a jitter for every object plus the policy's scripted motion."""
        jitter = np.cumsum(rng.normal(0, 0.004, size=(num_frames, *start.shape)), axis=0)
        jitter[0] = 0
        positions = start[None] + jitter
        if policy == "random":
            positions = start[None] + np.cumsum(rng.normal(0, 0.04, size=(num_frames, *start.shape)), axis=0)
            positions[0] = start
        else:
            mover, goal_name = task.target, task.goal
            if policy == "wrong_object":
                mover = int(rng.choice([i for i in range(len(start)) if i != task.target]))
            if policy == "wrong_goal":
                goal_name = str(rng.choice([g for g in GOALS if g != task.goal]))
            arrival = rng.uniform(0.55, 0.9)  # fraction of the episode at which the mover arrives
            phase = np.clip(np.linspace(0, 1, num_frames) / arrival, 0, 1)
            eased = 0.5 - 0.5 * np.cos(np.pi * phase)
            goal = np.array(GOALS[goal_name])
            positions[:, mover] = start[mover] + eased[:, None] * (goal - start[mover])
        return np.clip(positions, self.radius, 1 - self.radius)

    def preference_pair(
        self, rng: np.random.Generator, min_gap: float = 0.25
    ) -> tuple[str, np.ndarray, np.ndarray, float]:
        """A text-to-image-style pair: (prompt, chosen image, rejected image, quality gap).

        Both images show the prompted object; the chosen one has it nearer the prompted region.
        Quality = 1 − distance / √2, so the gap is a distance difference.
        """
        scene = self.sample_scene(rng)
        task = self.sample_task(rng, scene)
        obj = scene[task.target]
        prompt = f"a {obj.color} {obj.shape} in the {task.goal}"
        goal = np.array(GOALS[task.goal])
        while True:
            first, second = self.sample_positions(rng, task), self.sample_positions(rng, task)
            # half of the pairs put the chosen object anywhere closer, including right on the goal
            if rng.random() < 0.5:
                first[task.target] = goal + rng.normal(0, 0.03, size=2)
            gap = (np.linalg.norm(second[task.target] - goal) - np.linalg.norm(first[task.target] - goal)) / np.sqrt(2)
            if abs(gap) >= min_gap:
                break
        chosen, rejected = (first, second) if gap > 0 else (second, first)
        background = self.background(rng)
        images = [self.render(scene, np.clip(p, self.radius, 1 - self.radius), background) for p in (chosen, rejected)]
        return prompt, images[0][None], images[1][None], float(abs(gap))
