"""`vlmr grounding-sets`: probe sets that tell whether an RM can match a colour word to the pixels.

Built from a Reach episode set written by `vlmr collect` (no relabelling): each episode's scene is
recovered by resetting the env with the episode's seed (collect resets episode j with `seed + j`), and
`frames_per_episode` evenly spaced frames are kept. Labels are constant over an episode.

- `presence`: every episode three times, the instruction naming its own target (label 1), a distractor
  disc in the scene (1), and a colour absent from the scene (0). Neither the words nor the pixels alone
  say anything about the label; only the word matched against the disc colours does.
- `pixels`: the presence episodes whose instruction names `pixel_colour`. The text is then constant, so
  the pixels alone decide (is there a disc of that colour?).
- `text`: every episode with its own instruction, labelled by the colour word alone (1 for a word in
  `text_colours`), whatever the pixels show.

Train a progress RM on each kind (2-frame shuffled clips, no augmentation; see
configs/experiments/robotics/grounding_rm.yaml). An RM that learns `pixels` and `text` but not `presence`
sees the colours and reads the words, but does not bind one to the other: the failure of every from-scratch Reach RM
(`git show 9f5027e:docs/results/robotics.md`, "Fourth attempt").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from vlm_rewards.data.episodes import EpisodeDataset, EpisodeRecord, write_episodes
from vlm_rewards.robotics.config import EnvConfig, GroundingConfig
from vlm_rewards.robotics.tasks import COLOURS, reach_instruction
from vlm_rewards.tracking import Track, untracked

# `meta.json` generator names of `vlmr collect` datasets (before the package moved under vlm_rewards too)
COLLECT_GENERATORS = ("vlm_rewards.robotics.collect", "robotics.collect")


def scenes(source: EpisodeDataset, track: Track | None = None) -> Iterator[tuple[EpisodeRecord, list[str], str]]:
    """Each episode with its scene's disc colours and the named one, from the env reset with its seed."""
    from vlm_rewards.robotics.envs import make_env

    generator = source.meta.get("generator") or {}
    if generator.get("name") not in COLLECT_GENERATORS or generator.get("env", {}).get("id") != "vlmr/Reach-v0":
        raise ValueError(f"{source.root}: expected a `vlmr collect` dataset of vlmr/Reach-v0 (meta.json generator)")
    if generator.get("relabel_targets"):
        raise ValueError(f"{source.root}: relabelled datasets do not map episode ids to reset seeds; collect without")
    env = make_env(EnvConfig.model_validate(generator["env"]))
    try:
        for record in (track or untracked)(source, "grounding sets"):
            env.reset(seed=generator["seed"] + record.episode_id)
            task = env.unwrapped
            if task.instruction != record.instruction:
                raise ValueError(
                    f"{source.root}: episode {record.episode_id} says {record.instruction!r} but its reset seed "
                    f"gives {task.instruction!r}; was the dataset collected with these settings?"
                )
            yield record, list(task.layout.colours), task.layout.colours[task.layout.target]
    finally:
        env.close()


def grounding_records(config: GroundingConfig, track: Track | None = None) -> Iterator[EpisodeRecord]:
    rng = np.random.default_rng(config.seed)
    episode_id = 0
    for record, colours, named in scenes(EpisodeDataset(config.source), track):
        keep = np.linspace(0, record.num_frames - 1, config.frames_per_episode).round().astype(int)
        for colour, label, suffix in _variants(config, rng, colours, named):
            yield replace(
                record,
                episode_id=episode_id,
                instruction=reach_instruction(colour),
                frames=record.frames[keep],
                progress=np.full(len(keep), label, np.float32),
                success=bool(label),
                policy=record.policy + suffix,
                views={},
                reference=None,
                stage=None,  # the labels are the probe's, not the task's
                frame_success=None,
                goal_offset=None,
            )
            episode_id += 1


def _variants(config: GroundingConfig, rng: np.random.Generator, colours: list[str], named: str):
    """(colour the instruction names, label, policy suffix) for one episode."""
    if config.kind == "text":
        return [(named, float(named in config.text_colours), "")]
    distractor = str(rng.choice([c for c in colours if c != named]))
    absent = str(rng.choice([c for c in COLOURS if c not in colours]))
    presence = [(named, 1.0, ""), (distractor, 1.0, "_distractor"), (absent, 0.0, "_absent")]
    if config.kind == "pixels":
        return [variant for variant in presence if variant[0] == config.pixel_colour]
    return presence


def build_grounding_set(config: GroundingConfig, track: Track | None = None) -> EpisodeDataset:
    generator = {"name": "vlm_rewards.robotics.grounding", **config.model_dump(mode="json")}
    return write_episodes(config.output, grounding_records(config, track), "npz", generator=generator)
