"""ShapesWorld text-to-image: a procedural benchmark for GRPO, with a programmatic gold verifier.

Prompts follow one grammar, "a {colour} {shape} in the {region}", over the ShapesWorld vocabulary
(`vlm_rewards.data.synthetic`: 6 colours × 3 shapes × 5 regions = 90 combinations, worded as the
preference pairs the preference RM trains on). Three holdouts keep combinations out of base training:
- `triples`: those whose colour, shape and region indices sum to a multiple of 6. Every colour, shape
  and region, and every pair of them, is still seen in training; those triples are not.
- `pairs`: three colour–shape pairs (red circle, blue square, purple triangle) in every region. Each
  colour is still seen with the other shapes and each shape with the other colours, but never
  together: a compositional gap a base model can fail on.
- `six_pairs`: six colour–shape pairs in every region (30 prompts), split by pair into `grpo` (red circle,
  blue square, purple triangle: GRPO trains on them) and `unseen` (green triangle, yellow circle, orange
  square: never trained on, the generalisation test). Each colour is held out with one shape and each shape
  with two colours, so every colour is still seen with two shapes and every shape with four colours. The
  60 other prompts (`train`) are the base's own: GRPO's regression check.

Ground truth is one object drawn by the ShapesWorld renderer near its region's centre (jittered by up
to `JITTER` per axis) on ShapesWorld's grey table. The verifier reads an image back: saturated pixels
take their nearest palette colour (the table is grey), and for the prompted colour it measures
- presence: the colour's area relative to the prompted shape's area;
- position: the distance from the colour's centroid to the region's centre (in image sides);
- shape: whether, of the three shape templates centred on that centroid, the prompted one overlaps
  the colour's pixels best (IoU);
- clutter: the largest other colour's area relative to the shape's area.
`Verdict.correct` (all four pass) is the gold accuracy; `Verdict.score` is a soft product of the same
checks in [0, 1], the reward GRPO trains on: 0 for a missing colour or a far position.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import get_args

import numpy as np

from vlm_rewards.data.synthetic import COLORS, GOALS, SHAPES, SceneObject, ShapesWorld
from vlm_rewards.generation.config import Holdout, Split
from vlm_rewards.generation.models import ImageGenerator
from vlm_rewards.generation.sampling import sample_deterministic
from vlm_rewards.interface import RewardRequest, RewardResult

RADIUS = 0.15  # object half-size in image sides: 4.8 px at 32 px
JITTER = 0.05  # ground truth's offset from the region centre, per axis
MIN_AREA = 0.5  # presence: at least half the shape's area in the prompted colour
MAX_DISTANCE = 0.15  # position: centroid within this of the region centre (regions are >= 0.3 apart)
MAX_CLUTTER = 0.5  # no other colour covering more than half the shape's area
SHAPE_GRADE = 0.1  # `graded_score`'s shape term rises from 0.5 to 1 over shape margins -0.1..0.1 (renders: >= 0.11)
SOLID_FILL = 0.8  # the lowest fill of a ground-truth render: `solid_score` pays in full from here, nothing at 0.5
SATURATION = 60  # pixels with max - min channel below this are table (grey)
COLOR_DISTANCE = 80  # a saturated pixel is a palette colour only within this RGB distance of it
# the `six_pairs` holdout's held-out colour-shape pairs, by split
PAIR_SPLITS = {
    "grpo": (("red", "circle"), ("blue", "square"), ("purple", "triangle")),
    "unseen": (("green", "triangle"), ("yellow", "circle"), ("orange", "square")),
}
PROMPT = re.compile(rf"a ({'|'.join(COLORS)}) ({'|'.join(SHAPES)}) in the ({'|'.join(GOALS)})")


@dataclass(frozen=True)
class ShapePrompt:
    color: str
    shape: str
    region: str

    @property
    def text(self) -> str:
        return f"a {self.color} {self.shape} in the {self.region}"

    def held_out(self, holdout: Holdout = "triples") -> bool:
        return self.split(holdout) != "train"

    def split(self, holdout: Holdout = "triples") -> Split:
        """Where the holdout puts the prompt: "train" (the base trains on it), "held_out", or "grpo" / "unseen"."""
        color, shape = list(COLORS).index(self.color), SHAPES.index(self.shape)
        if holdout == "six_pairs":
            found = [split for split, pairs in PAIR_SPLITS.items() if (self.color, self.shape) in pairs]
            return found[0] if found else "train"
        if holdout == "pairs":
            held_out = color == 2 * shape
        else:
            held_out = (color + shape + list(GOALS).index(self.region)) % 6 == 0
        return "held_out" if held_out else "train"

    @staticmethod
    def parse(text: str) -> ShapePrompt:
        match = PROMPT.fullmatch(text.strip().lower())
        if match is None:
            raise ValueError(
                f"prompt {text!r}: expected 'a <colour> <shape> in the <region>' with colour in {list(COLORS)}, "
                f"shape in {list(SHAPES)}, region in {list(GOALS)}"
            )
        return ShapePrompt(*match.groups())


def prompts(split: Split = "all", holdout: Holdout = "triples") -> list[str]:
    """The benchmark's prompts in a fixed order: every combination, or one split of a holdout: "train", "held_out"
    and, for `six_pairs`, the held-out pairs' "grpo" and "unseen" parts."""
    for name, value, allowed in (("split", split, Split), ("holdout", holdout, Holdout)):
        if value not in get_args(allowed):
            raise ValueError(f"{name} {value!r}: expected one of {list(get_args(allowed))}")
    if split in PAIR_SPLITS and holdout != "six_pairs":
        raise ValueError(f"split {split!r}: only the 'six_pairs' holdout has it, got holdout {holdout!r}")
    every = [ShapePrompt(color, shape, region) for color in COLORS for shape in SHAPES for region in GOALS]
    if split == "all":
        return [prompt.text for prompt in every]
    if split == "held_out":
        return [prompt.text for prompt in every if prompt.held_out(holdout)]
    return [prompt.text for prompt in every if prompt.split(holdout) == split]


def check_pair_splits(splits: dict[str, Iterable[str]]) -> None:
    """Refuse a colour–shape pair whose prompts are in two of the named prompt lists (in any regions)."""
    owner: dict[tuple[str, str], tuple[str, str]] = {}
    for name, prompt_list in splits.items():
        for text in prompt_list:
            parsed = ShapePrompt.parse(text)
            pair = (parsed.color, parsed.shape)
            first_name, first_text = owner.setdefault(pair, (name, text))
            if first_name != name:
                raise ValueError(
                    f"colour-shape pair '{parsed.color} {parsed.shape}' crosses splits: {first_text!r} is in "
                    f"{first_name!r} and {text!r} in {name!r}; expected each pair in one split only"
                )


def render(prompt: str, rng: np.random.Generator, size: int = 32) -> np.ndarray:
    """A ground-truth (size, size, 3) uint8 image of the prompt."""
    parsed = ShapePrompt.parse(prompt)
    world = ShapesWorld(size=size, num_objects=1, radius=RADIUS)
    centre = np.array(GOALS[parsed.region]) + rng.uniform(-JITTER, JITTER, size=2)
    return world.render([SceneObject(parsed.color, parsed.shape)], centre[None], world.background(rng))


# ----------------------------------------------------------------------------- the verifier


@dataclass(frozen=True)
class Verdict:
    area: float  # the prompted colour's area / the prompted shape's area
    distance: float  # its centroid to the region centre, in image sides (√2 when the colour is absent)
    shape_margin: float  # IoU of the prompted shape's template − the best other template's (> 0: it matches)
    clutter: float  # the largest other colour's area / the prompted shape's area
    # the share of the prompted shape's template (at the colour's centroid) the colour covers: 1 for a solid
    # object, lower for holes and stripes. A diagnostic, not a check: the checks pass a striped circle
    fill: float = 0.0

    @property
    def shape_matches(self) -> bool:
        return self.shape_margin > 0

    @property
    def checks(self) -> dict[str, bool]:
        return {
            "presence": self.area >= MIN_AREA,
            "position": self.distance <= MAX_DISTANCE,
            "shape": self.shape_matches,
            "clutter": self.clutter <= MAX_CLUTTER,
        }

    @property
    def correct(self) -> bool:
        return all(self.checks.values())

    @property
    def score(self) -> float:
        return self.soft_checks(shape=1.0 if self.shape_matches else 0.5)

    @property
    def graded_score(self) -> float:
        """`score` with a shape term that grows with the shape margin instead of jumping at 0: generated shapes sit
        within ±0.1 of it, where the jump is the only signal."""
        return self.soft_checks(shape=float(np.clip(0.75 + 0.25 * self.shape_margin / SHAPE_GRADE, 0.5, 1.0)))

    def soft_checks(self, shape: float) -> float:
        """The product of the soft presence, position and tidiness terms and the given shape term."""
        presence = min(1.0, self.area / MIN_AREA)
        position = float(np.clip((MAX_DISTANCE + 0.1 - self.distance) / 0.1, 0.0, 1.0))
        tidiness = float(np.clip(1.0 - self.clutter, 0.0, 1.0))
        return presence * position * shape * tidiness

    @property
    def solid_score(self) -> float:
        """`score`, scaled down for objects with holes or stripes (fill below a ground-truth render's)."""
        return self.score * float(np.clip((self.fill - 0.5) / (SOLID_FILL - 0.5), 0.0, 1.0))

    def info(self) -> dict[str, float | bool]:
        return {"area": self.area, "distance": self.distance, "shape_margin": self.shape_margin,
                "clutter": self.clutter, "fill": self.fill, "correct": self.correct}  # fmt: skip


def verify(image: np.ndarray, prompt: str) -> Verdict:
    """Check one (H, W, 3) uint8 image against its prompt."""
    parsed = ShapePrompt.parse(prompt)
    size = image.shape[0]
    labels = color_labels(image)
    shape_area = template(parsed.shape, (0.5, 0.5), size).sum()
    mask = labels == list(COLORS).index(parsed.color)
    others = [np.sum(labels == index) for index in range(len(COLORS)) if index != list(COLORS).index(parsed.color)]
    clutter = float(max(others) / shape_area)
    if not mask.any():
        return Verdict(0.0, float(np.sqrt(2)), -1.0, clutter)
    centroid = centroid_of(mask)
    templates = {shape: template_at_centroid(shape, centroid, size) for shape in SHAPES}
    overlaps = {shape: iou(mask, placed) for shape, placed in templates.items()}
    best_other = max(overlap for shape, overlap in overlaps.items() if shape != parsed.shape)
    prompted = templates[parsed.shape]
    return Verdict(
        area=float(mask.sum() / shape_area),
        distance=float(np.linalg.norm(centroid - np.array(GOALS[parsed.region]))),
        shape_margin=overlaps[parsed.shape] - best_other,
        clutter=clutter,
        fill=float((mask & prompted).sum() / prompted.sum()),
    )


def color_labels(image: np.ndarray) -> np.ndarray:
    """(H, W) index into COLORS of each pixel's nearest palette colour; -1 for the table and unclear pixels."""
    pixels = image.astype(np.float32)
    palette = np.array(list(COLORS.values()), dtype=np.float32)
    distances = np.linalg.norm(pixels[..., None, :] - palette, axis=-1)
    nearest = distances.argmin(axis=-1)
    saturated = pixels.max(axis=-1) - pixels.min(axis=-1) >= SATURATION
    close = distances.min(axis=-1) <= COLOR_DISTANCE
    return np.where(saturated & close, nearest, -1)


def centroid_of(mask: np.ndarray) -> np.ndarray:
    """(x, y) mean of the mask's pixel centres, in image sides."""
    ys, xs = np.nonzero(mask)
    return (np.array([xs.mean(), ys.mean()]) + 0.5) / mask.shape[0]


def template_at_centroid(shape: str, centroid: np.ndarray, size: int) -> np.ndarray:
    """The shape's template moved so that its own centroid is `centroid` (a triangle's lies below its centre)."""
    first = template(shape, centroid, size)
    return template(shape, 2 * centroid - centroid_of(first), size)


def template(shape: str, centre: tuple[float, float], size: int) -> np.ndarray:
    """(size, size) bool mask of the shape as ShapesWorld draws it at `centre`."""
    world = ShapesWorld(size=size, num_objects=1, radius=RADIUS)
    blank = np.zeros((size, size, 3), dtype=np.uint8)
    return world.render([SceneObject("red", shape)], np.array([centre]), blank).any(axis=-1)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 0.0


def sample_and_verify(
    generator: ImageGenerator, prompt_list: list[str], images_per_prompt: int, num_steps: int, seed: int
) -> tuple[np.ndarray, list[Verdict]]:
    """ODE samples of each prompt from fixed-seed noise (a prompt's images consecutive) and their verdicts."""
    repeated = [prompt for prompt in prompt_list for _ in range(images_per_prompt)]
    images = sample_deterministic(generator, repeated, num_steps, seed)
    return images, [verify(image, prompt) for image, prompt in zip(images, repeated)]


def sample_verdicts(
    generator: ImageGenerator, prompt_list: list[str], images_per_prompt: int, num_steps: int, seed: int
) -> list[list[Verdict]]:
    """`sample_and_verify`'s verdicts, one list per prompt."""
    _, verdicts = sample_and_verify(generator, prompt_list, images_per_prompt, num_steps, seed)
    return [verdicts[i : i + images_per_prompt] for i in range(0, len(verdicts), images_per_prompt)]


def check_rates(verdicts: list[Verdict]) -> dict[str, float]:
    """The share of the verdicts passing each check, and passing all of them (`correct`); their mean `fill`."""
    rates = {name: float(np.mean([v.checks[name] for v in verdicts])) for name in verdicts[0].checks}
    correct, fill = np.mean([v.correct for v in verdicts]), np.mean([v.fill for v in verdicts])
    return rates | {"correct": float(correct), "fill": float(fill)}


def gold_accuracy(
    generator: ImageGenerator, prompt_list: list[str], images_per_prompt: int, num_steps: int, seed: int
) -> dict[str, float]:
    """ODE samples of each prompt from fixed-seed noise: the share the verifier passes, the mean score and fill,
    and the share passing each check (`pass_presence`, `pass_shape`, ...: which one fails)."""
    _, verdicts = sample_and_verify(generator, prompt_list, images_per_prompt, num_steps, seed)
    rates = check_rates(verdicts)
    return {
        "accuracy": rates.pop("correct"),
        "fill": rates.pop("fill"),
        "score": float(np.mean([verdict.score for verdict in verdicts])),
    } | {f"pass_{name}": rate for name, rate in rates.items()}


# ----------------------------------------------------------------------------- rewards (`kind: function`)


def verifier_score(request: RewardRequest) -> RewardResult:
    """The soft verifier score of the request's last frame, in [0, 1]: GRPO's trained reward."""
    verdict = verify(request.frames[-1], request.text)
    return RewardResult(verdict.score, info=verdict.info())


def graded_verifier_score(request: RewardRequest) -> RewardResult:
    """`verifier_score` whose shape term grows with the shape margin, in [0, 1]."""
    verdict = verify(request.frames[-1], request.text)
    return RewardResult(verdict.graded_score, info=verdict.info())


def solid_verifier_score(request: RewardRequest) -> RewardResult:
    """`verifier_score` that does not pay for holes: the soft score times a fill factor, in [0, 1]."""
    verdict = verify(request.frames[-1], request.text)
    return RewardResult(verdict.solid_score, info=verdict.info())


def accuracy(request: RewardRequest) -> float:
    """1.0 when the last frame passes every check, else 0.0: the gold metric."""
    return float(verify(request.frames[-1], request.text).correct)
