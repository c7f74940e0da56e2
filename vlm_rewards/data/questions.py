"""Questions about frames, with short answers: the pretraining corpus of a backbone for simulated worlds.

A `Question` is one frame or two, a question and its answer. A stream of them teaches a small VLM what
reward models read: whether a named object is in the scene (`presence`), where it is (`location`), what
the scene holds (`caption`), whether something moved toward a named place (`closer`), and which of two
frames of a task came later (`order`). A source is a callable `source(rng) -> Question`; ShapesWorld's is
here, the MuJoCo tasks' in `vlm_rewards.robotics.questions`.

Each question also carries what its frames show and where (`Question.objects`): the targets of the
pretraining's scene readout, which teaches the vision tower what is where before the language model has
learned to ask it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from vlm_rewards.data.synthetic import COLORS, GOALS, SHAPES, SceneObject, ShapesWorld, Task

SKILLS = ("presence", "location", "caption", "closer", "order")
# a 3 x 3 grid of the frame, named as people name places in a picture (row, then column)
ROWS = ("top", "middle", "bottom")
COLUMNS = ("left", "center", "right")
MIN_CHANGE = 0.05  # `closer` asks only about moves that change the distance by at least this (frame widths)
MIN_PROGRESS_GAP = 0.2  # `order` asks only about frames at least this far apart in progress


PlacedObject = tuple[str, float, float]


@dataclass(frozen=True)
class Question:
    frames: np.ndarray
    """(T, H, W, 3) uint8: one frame, or two for `closer` and `order`."""
    question: str
    answer: str
    skill: str
    """Which of `SKILLS` the question trains (evaluation reports accuracy per skill)."""
    objects: tuple[tuple[PlacedObject, ...], ...] = ()
    """Per frame, each named thing it shows and where: (name, x, y), x right and y down in [0, 1]."""


QuestionSource = Callable[[np.random.Generator], Question]


def region_name(x: float, y: float) -> str:
    """The grid cell of a point, x rightwards and y downwards in [0, 1]: "top left", "center", ..."""
    row = ROWS[min(int(y * 3), 2)]
    column = COLUMNS[min(int(x * 3), 2)]
    if row == "middle":
        return column
    return row if column == "center" else f"{row} {column}"


def placed_objects(names: Sequence[str], positions: np.ndarray) -> tuple[PlacedObject, ...]:
    """One frame's named things with their (x, y) positions."""
    return tuple((name, float(x), float(y)) for name, (x, y) in zip(names, positions))


def placed(position: Sequence[float]) -> str:
    """Where a thing is, as a caption says it: "at the top left", "in the center"."""
    region = region_name(*position)
    return "in the center" if region == "center" else f"at the {region}"


def with_article(noun_phrase: str) -> str:
    """The phrase with its indefinite article: "a red circle", "an orange square"."""
    return f"{'an' if noun_phrase[0] in 'aeiou' else 'a'} {noun_phrase}"


def yes_no(value: bool) -> str:
    return "yes" if value else "no"


def order_question(instruction: str) -> str:
    return f"The task is to {instruction}. Which frame is later, the first or the second?"


def two_frames(rng: np.random.Generator, earlier: int, later: int) -> tuple[list[int], str]:
    """The two frame indices in a random order, and which of them (`first`/`second`) is the later one."""
    if rng.random() < 0.5:
        return [earlier, later], "second"
    return [later, earlier], "first"


def mixture(sources: Sequence[tuple[QuestionSource, float]]) -> QuestionSource:
    """One source drawing from `sources` in proportion to their weights."""
    weights = np.array([weight for _, weight in sources], dtype=np.float64)
    if not len(sources) or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"question sources need positive total weight, got weights {weights.tolist()}")

    def draw(rng: np.random.Generator) -> Question:
        return sources[rng.choice(len(sources), p=weights / weights.sum())][0](rng)

    return draw


class ShapesQuestions:
    """Questions about ShapesWorld scenes and episodes; `held_out` colour-shape pairs are never drawn.

    `closer` and `order` use episodes of every scripted policy (the named object moves toward its goal,
    elsewhere, or a distractor moves), so motion alone does not answer them.
    """

    def __init__(self, size: int = 56, num_frames: int = 8, held_out: Sequence[tuple[str, str]] = ()):
        self.world = ShapesWorld(size=size)
        self.num_frames = num_frames
        self.held_out = {tuple(pair) for pair in held_out}
        unknown = {pair for pair in self.held_out if pair[0] not in COLORS or pair[1] not in SHAPES}
        if unknown:
            raise ValueError(f"held_out pairs {sorted(unknown)}: expected (colour, shape) of {list(COLORS)} x {SHAPES}")
        self.pairs = [(colour, shape) for colour in COLORS for shape in SHAPES if (colour, shape) not in self.held_out]

    @property
    def object_names(self) -> list[str]:
        """The names of the things its frames show: every colour-shape pair it draws."""
        return [f"{colour} {shape}" for colour, shape in self.pairs]

    def __call__(self, rng: np.random.Generator) -> Question:
        skill = SKILLS[rng.integers(len(SKILLS))]
        return getattr(self, skill)(rng)

    def episode(self, rng: np.random.Generator, policy: str = "expert"):
        while True:
            episode = self.world.rollout(rng, self.num_frames, policy)
            if not any((obj.color, obj.shape) in self.held_out for obj in episode.meta["scene"]):
                return episode

    def scene(self, rng: np.random.Generator) -> tuple[np.ndarray, list[SceneObject], np.ndarray]:
        """One frame (1, H, W, 3), its objects and their positions (N, 2)."""
        while True:
            objects = self.world.sample_scene(rng)
            if not any((obj.color, obj.shape) in self.held_out for obj in objects):
                break
        positions = self.world.sample_positions(rng, self.world.sample_task(rng, objects))
        return self.world.render(objects, positions, self.world.background(rng))[None], objects, positions

    def presence(self, rng: np.random.Generator) -> Question:
        frames, objects, positions = self.scene(rng)
        shown = {(obj.color, obj.shape) for obj in objects}
        candidates = sorted(shown) if rng.random() < 0.5 else [pair for pair in self.pairs if pair not in shown]
        colour, shape = candidates[rng.integers(len(candidates))]
        question = f"Is there {with_article(f'{colour} {shape}')}?"
        return Question(frames, question, yes_no((colour, shape) in shown), "presence", self.placed(objects, positions))

    def location(self, rng: np.random.Generator) -> Question:
        frames, objects, positions = self.scene(rng)
        index = int(rng.integers(len(objects)))
        obj = objects[index]
        question = f"Where is the {obj.color} {obj.shape}?"
        return Question(frames, question, region_name(*positions[index]), "location", self.placed(objects, positions))

    def caption(self, rng: np.random.Generator) -> Question:
        frames, objects, positions = self.scene(rng)
        reading_order = np.lexsort((positions[:, 0], positions[:, 1]))  # by row, then column
        names = [f"{obj.color} {obj.shape}" for obj in objects]
        parts = [f"{with_article(names[i])} {placed(positions[i])}" for i in reading_order]
        return Question(frames, "What is in the picture?", ", ".join(parts), "caption", self.placed(objects, positions))

    def closer(self, rng: np.random.Generator) -> Question:
        while True:
            episode = self.episode(rng, ("expert", "wrong_goal", "wrong_object", "random")[rng.integers(4)])
            task: Task = episode.meta["task"]
            goal = np.array(GOALS[task.goal])
            distance = np.linalg.norm(episode.meta["trajectory"][:, task.target] - goal, axis=1)
            first, second = sorted(rng.choice(self.num_frames, size=2, replace=False))
            change = distance[second] - distance[first]
            if abs(change) >= MIN_CHANGE:
                break
        obj = episode.meta["scene"][task.target]
        question = f"Did the {obj.color} {obj.shape} move toward the {task.goal}?"
        shown = [first, second]
        objects = self.episode_objects(episode, shown)
        return Question(episode.frames[shown], question, yes_no(change < 0), "closer", objects)

    def order(self, rng: np.random.Generator) -> Question:
        while True:
            episode = self.episode(rng)
            earlier, later = sorted(rng.choice(self.num_frames, size=2, replace=False))
            if episode.progress[later] - episode.progress[earlier] >= MIN_PROGRESS_GAP:
                break
        shown, answer = two_frames(rng, earlier, later)
        question = order_question(episode.instruction)
        return Question(episode.frames[shown], question, answer, "order", self.episode_objects(episode, shown))

    @staticmethod
    def placed(objects: Sequence[SceneObject], positions: np.ndarray) -> tuple[tuple[PlacedObject, ...]]:
        return (placed_objects([f"{obj.color} {obj.shape}" for obj in objects], positions),)

    def episode_objects(self, episode, frame_indices: Sequence[int]) -> tuple[tuple[PlacedObject, ...], ...]:
        trajectory = episode.meta["trajectory"]
        return tuple(self.placed(episode.meta["scene"], trajectory[t])[0] for t in frame_indices)
