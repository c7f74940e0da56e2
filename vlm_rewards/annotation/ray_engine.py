"""`engine: ray`: the same job on Ray Data — decoding as CPU tasks, scoring on an actor pool.

    pending refs --from_items--> map(decode, num_cpus=decode_num_cpus)      # parallel PyAV decoding
                 --map_batches(RewardActor, concurrency=num_actors,          # one reward per actor,
                               num_gpus=num_gpus_per_actor, batch_size)      # batched calls
                 --iter_rows--> the driver writes each episode's shard atomically

Outputs are identical to the local engine: the same decode and scoring functions, the same shard
writer, and rewards are batch-invariant and deterministic. Shards are written by the driver, so only
the input videos must be readable from the workers (a shared file system on a cluster).
Ray Data has no job-level checkpoint: resume is ours (shards), as with the local engine.

Cluster: set `ray.address` (or `RAY_ADDRESS`, e.g. "auto" on a head node or "ray://head:10001");
without either a local instance starts (`ray.num_cpus` CPUs if given).
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from vlm_rewards.annotation.config import AnnotateConfig, SamplingConfig
from vlm_rewards.annotation.decode import DecodedEpisode, decode_or_failure
from vlm_rewards.annotation.outputs import OutputStore
from vlm_rewards.annotation.scoring import check_reward_for_annotation, score_batch
from vlm_rewards.annotation.sources import EpisodeOutcome, EpisodeRef

logger = logging.getLogger(__name__)


def outcome_to_json(outcome: EpisodeOutcome) -> str:
    """Exact round trip (float64 reprs; NaN as NaN) so the driver writes what the local engine would."""
    return json.dumps(
        {
            "ref": outcome.ref.to_json(),
            "num_frames": outcome.num_frames,
            "reward": outcome.reward,
            "progress": None if outcome.progress is None else outcome.progress.tolist(),
            "scored": None if outcome.scored is None else outcome.scored.tolist(),
            "components": outcome.components,
            "info": outcome.info,
            "error": outcome.error,
            "stage": outcome.stage,
        }
    )


def outcome_from_json(text: str) -> EpisodeOutcome:
    data = json.loads(text)
    return EpisodeOutcome(
        ref=EpisodeRef.from_json(data["ref"]),
        num_frames=data["num_frames"],
        reward=math.nan if data["reward"] is None else data["reward"],
        progress=None if data["progress"] is None else np.asarray(data["progress"], dtype=np.float64),
        scored=None if data["scored"] is None else np.asarray(data["scored"], dtype=bool),
        components=data["components"],
        info=data["info"],
        error=data["error"],
        stage=data["stage"],
    )


def decode_row(row: dict[str, Any], sampling: dict[str, Any]) -> dict[str, Any]:
    """Ray task: one episode ref -> its decoded frames as an .npz payload, or the failure."""
    ref = EpisodeRef.from_json(json.loads(row["ref"]))
    result = decode_or_failure(ref, SamplingConfig.model_validate(sampling))
    if isinstance(result, EpisodeOutcome):
        return {"ref": row["ref"], "payload": b"", "failure": outcome_to_json(result)}
    return {"ref": row["ref"], "payload": result.to_bytes(), "failure": ""}


class RewardActor:
    """Builds the reward once per actor; scores each batch of decoded episodes in one call."""

    def __init__(self, reward: str, max_frames: int | None):
        from vlm_rewards.registry import build_reward

        self.reward = build_reward(reward)
        check_reward_for_annotation(self.reward.spec)
        self.max_frames = max_frames

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[str]]:
        outcomes: list[str] = []
        decoded: list[DecodedEpisode] = []
        for ref_text, payload, failure in zip(batch["ref"], batch["payload"], batch["failure"]):
            if failure:
                outcomes.append(str(failure))
                continue
            ref = EpisodeRef.from_json(json.loads(ref_text))
            decoded.append(DecodedEpisode.from_bytes(ref, bytes(payload)))
        outcomes.extend(outcome_to_json(o) for o in score_batch(self.reward, decoded, self.max_frames))
        return {"outcome": outcomes}


def _reward_reference(reward: str) -> str:
    """A reward YAML path made absolute (Ray workers need not share the driver's working directory)."""
    path = Path(reward)
    if "/" in reward or path.suffix in (".yaml", ".yml"):
        return str(path.resolve())
    return reward


def run_ray(config: AnnotateConfig, pending: list[EpisodeRef], store: OutputStore, track=None) -> None:
    import ray

    if not ray.is_initialized():
        address = config.ray.address or os.environ.get("RAY_ADDRESS")
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address:
            kwargs["address"] = address
        elif config.ray.num_cpus:
            kwargs["num_cpus"] = config.ray.num_cpus
        ray.init(**kwargs)
    import ray.data
    from ray.data import ActorPoolStrategy

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    items = [{"ref": json.dumps(ref.to_json())} for ref in pending]
    dataset = ray.data.from_items(items, override_num_blocks=max(1, min(len(items), 200)))
    dataset = dataset.map(
        decode_row, fn_kwargs={"sampling": config.sampling.model_dump(mode="json")}, num_cpus=config.ray.decode_num_cpus
    )
    dataset = dataset.map_batches(
        RewardActor,
        fn_constructor_kwargs={"reward": _reward_reference(config.reward), "max_frames": config.sampling.max_frames},
        batch_size=config.batch_size,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=config.ray.num_actors),
        num_cpus=config.ray.num_cpus_per_actor,
        num_gpus=config.ray.num_gpus_per_actor or None,
    )
    rows = dataset.iter_rows()
    if track is not None:
        rows = track(rows, "annotate (ray)", total=len(pending))
    for row in rows:
        outcome = outcome_from_json(row["outcome"])
        if not outcome.ok:
            logger.warning("%s %s: %s", outcome.ref.source, outcome.ref.episode, outcome.error)
        store.write(outcome)
