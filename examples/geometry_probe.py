"""Synthetic clips that ask a progress RM to read geometry, without a simulator (robotics results, eighth attempt:
`git show 9f5027e:docs/results/robotics.md`).

64-px clips of 30 frames: a red and a blue 9-px disc stay where they are drawn, and a dark 7-px square (the
"effector") moves on a smooth random walk. The label per frame is 1 − (square ↔ red disc) / 90 px. Each kind
changes one thing, to find what slows a tiny backbone down on Reach:

- `x`: the label is the square's column / 63 (reading one object's position);
- `dist`: as above;
- `expert`: 60 % of the episodes head straight for the red disc and stay there, as Reach's experts do;
- `rel`: Reach's label, 1 − d/d_0 clipped to [0, 1] (a frame's label depends on the first frame);
- `grad`: Reach's table colours behind the scene (bilinear between its rendered corners);
- `dot`: `grad` with the effector drawn as Reach renders it with specular highlights (a pale grey disc, a dark core);
- `bind`: three discs of six colours; the instruction names one, and the label follows that one.

    python examples/geometry_probe.py runs/geometry/dist/train dist --seed 0 --episodes 1000
    python examples/geometry_probe.py runs/geometry/dist/eval dist --seed 1 --episodes 40
    vlmr train-rm <a progress config> data.train=runs/geometry/dist/train data.eval=runs/geometry/dist/eval ...
"""

from typing import Literal

import numpy as np
import typer

from vlm_rewards.data.episodes import EpisodeRecord, write_episodes

Kind = Literal["x", "dist", "expert", "rel", "grad", "dot", "bind"]
SIZE, FRAMES = 64, 30
PALETTE = {
    "red": (230, 40, 40), "green": (40, 200, 40), "blue": (40, 60, 230),
    "yellow": (240, 215, 30), "purple": (150, 50, 200), "cyan": (30, 215, 215),
}  # fmt: skip
ROWS, COLS = np.mgrid[:SIZE, :SIZE]


def background(kind: Kind) -> np.ndarray:
    if kind not in ("grad", "dot"):
        return np.full((SIZE, SIZE, 3), 150, np.uint8)
    across, down = (COLS / (SIZE - 1))[..., None], (ROWS / (SIZE - 1))[..., None]
    top = (1 - across) * np.array([116, 94, 72]) + across * np.array([189, 163, 137])
    bottom = (1 - across) * np.array([82, 94, 106]) + across * np.array([154, 163, 172])
    return ((1 - down) * top + down * bottom).astype(np.uint8)


def disc_mask(centre: np.ndarray) -> np.ndarray:
    return (ROWS - centre[0]) ** 2 + (COLS - centre[1]) ** 2 <= 20


def draw(scene: np.ndarray, discs: list[np.ndarray], names: list[str], effector: np.ndarray, kind: Kind) -> np.ndarray:
    frame = scene.copy()
    for centre, name in zip(discs, names):
        frame[disc_mask(centre)] = PALETTE[name]
    row, col = np.round(effector).astype(int)
    if kind == "dot":
        footprint = disc_mask(effector)
        frame[footprint] = (frame[footprint] * 0.5 + 35).astype(np.uint8)
        frame[row - 1 : row + 2, col - 1 : col + 2] = 25
    else:
        frame[row - 3 : row + 4, col - 3 : col + 4] = 20
    return frame


def label(kind: Kind, effector: np.ndarray, target: np.ndarray, start_distance: float) -> float:
    distance = np.linalg.norm(effector - target)
    if kind == "x":
        return np.round(effector[1]) / (SIZE - 1)
    if kind == "rel":
        return float(np.clip(1 - distance / start_distance, 0.0, 1.0))
    return max(0.0, 1 - distance / 90)


def episode(index: int, kind: Kind, scene: np.ndarray, rng: np.random.Generator) -> EpisodeRecord:
    discs = [rng.uniform(8, 56, 2), rng.uniform(8, 56, 2)]
    names = list(rng.choice(list(PALETTE), 3, replace=False)) if kind == "bind" else ["red", "blue"]
    if kind == "bind":
        discs.append(rng.uniform(8, 56, 2))
    effector, velocity = rng.uniform(6, 58, 2), rng.normal(0, 2.5, 2)
    straight = kind == "expert" and rng.uniform() < 0.6
    target, start_distance = discs[0], np.linalg.norm(effector - discs[0])
    frames, labels = [], []
    for _ in range(FRAMES):
        frames.append(draw(scene, discs, names, effector, kind))
        labels.append(label(kind, effector, target, start_distance))
        velocity = 0.7 * velocity + rng.normal(0, 1.5, 2)
        if straight:  # 2 px a step toward the disc, then stay on it
            distance = np.linalg.norm(target - effector)
            velocity = (target - effector) / max(distance, 1e-6) * min(2.0, distance) + rng.normal(0, 0.3, 2)
        effector = np.clip(effector + velocity, 4, 59)
    instruction = f"reach the {names[0]} target"
    return EpisodeRecord(index, instruction, np.stack(frames), np.array(labels, np.float32), False, "expert")


def main(output: str, kind: Kind, seed: int = 0, episodes: int = 1000) -> None:
    rng, scene = np.random.default_rng(seed), background(kind)
    write_episodes(output, (episode(i, kind, scene, rng) for i in range(episodes)), name="geometry_probe")


if __name__ == "__main__":
    typer.run(main)
