"""`run_annotation(config)`: list episodes, skip finished ones, decode in workers, score in batches,
write per-episode shards, then merge (see `vlm_rewards.annotation.outputs` for the folder layout).

The local engine decodes in a process (or thread) pool that runs ahead of the reward, at most
`decode.pool_size * decode.prefetch` episodes in flight, so the reward scores batch k while the workers
decode batch k+1. The pool starts before the reward is built, so that the workers' start-up overlaps
loading the model. `engine: ray` hands the same work to `vlm_rewards.annotation.ray_engine`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlm_rewards.annotation.config import AnnotateConfig
from vlm_rewards.annotation.decode import DecodedEpisode, decode_or_failure
from vlm_rewards.annotation.outputs import (
    FORMAT,
    FORMAT_VERSION,
    OutputStore,
    finalize,
    lerobot_values,
    write_lerobot_copy,
    write_lerobot_progress_table,
)
from vlm_rewards.annotation.report import episode_flags, write_report
from vlm_rewards.annotation.scoring import check_reward_for_annotation, episode_budget, score_batch
from vlm_rewards.annotation.sources import EpisodeOutcome, EpisodeRef, iter_episodes, source_name
from vlm_rewards.fingerprint import fingerprint, sha256_file
from vlm_rewards.interface import RewardModel
from vlm_rewards.registry import build_reward
from vlm_rewards.tracking import Track

logger = logging.getLogger(__name__)


@dataclass
class AnnotationSummary:
    output_dir: Path
    fingerprint: str
    num_episodes: int
    num_annotated: int
    num_failed: int
    num_skipped: int  # already done before this run
    failures: list[dict[str, Any]] = field(default_factory=list)
    decode_workers_used: set[str] = field(default_factory=set)
    report: Path | None = None

    @property
    def ok(self) -> bool:
        return self.num_failed == 0


def job_fingerprint(config: AnnotateConfig, reward: RewardModel) -> tuple[str, dict[str, Any]]:
    """What changes outputs: the reward (name, version), sampling and preprocessing, the source's
    identity (its resolved path) and instruction settings (sidecar and reference contents). Not the
    engine, workers or batch size: outputs do not depend on them. Each episode's own files are
    stamped apart (`sources.input_stamp`), so that a changed file redoes its episode only."""
    source = config.source
    parts = {
        "format": [FORMAT, FORMAT_VERSION],
        "reward": {"name": reward.spec.name, "version": reward.spec.version, "dense": reward.spec.dense,
                   "max_frames": reward.spec.max_frames},
        "sampling": config.sampling.model_dump(mode="json"),
        "source": {
            "kind": source.kind,
            "path": str(Path(source.path).resolve()),
            "name": source_name(source),
            "instruction": source.instruction,
            "instructions_sha256": _sha256(source.instructions, "source.instructions"),
            "reference_sha256": _sha256(source.reference, "source.reference"),
            "camera": source.camera,
            "views": dict(sorted(source.views.items())),
            "extensions": sorted(e.lower() for e in source.extensions),
            "limit": source.limit,
        },
    }  # fmt: skip
    return fingerprint(parts), parts


def _sha256(path: Path | None, key: str) -> str | None:
    """The hash of the optional input file given as `key`; a missing one is a ValueError naming it."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise ValueError(f"{key} {path}: no such file")
    return sha256_file(path)


def run_annotation(
    config: AnnotateConfig,
    track: Track | None = None,
    reward: RewardModel | Callable[[], RewardModel] | None = None,
) -> AnnotationSummary:
    """Annotate the configured source into `config.output_dir`; resumable, see module docstring.

    reward: an already-built reward (tests, callers with a remote client), or a function that builds
        one; default: `build_reward(config.reward)`. The local engine starts its decode workers first,
        so that their start-up (a fresh interpreter importing the decoder) overlaps loading the model.
    track: an optional progress wrapper `track(iterable, description, total=...)` (the CLI's tqdm).
    """
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(start_decode_pool(config)) if config.engine == "local" else None
        if reward is None:
            reward = build_reward(config.reward)
        elif not isinstance(reward, RewardModel):
            reward = reward()
        return _annotate(config, reward, pool, track)


def _annotate(
    config: AnnotateConfig, reward: RewardModel, pool: DecodePool | None, track: Track | None
) -> AnnotationSummary:
    check_reward_for_annotation(reward.spec)
    if (
        config.source.kind == "lerobot"
        and not reward.spec.dense
        and (config.lerobot.write_copy or config.lerobot.progress_table)
    ):
        raise ValueError(
            f"reward {reward.spec.name!r} is not dense (no per-frame progress); LeRobot outputs need one value "
            "per frame: use a dense reward, or set lerobot.write_copy=false and lerobot.progress_table=false"
        )
    refs = list(iter_episodes(config.source))  # checks the source and its sidecar before anything is written
    fp, parts = job_fingerprint(config, reward)
    store = OutputStore(config.output_dir)
    store.prepare(fp, parts, overwrite=config.overwrite)
    pending = [ref for ref in refs if not store.is_done(ref, config.retry_failed)]
    logger.info(
        "annotating %s: %d episodes, %d done before, %d to do (fingerprint %s, engine %s)",
        source_name(config.source), len(refs), len(refs) - len(pending), len(pending), fp, config.engine,
    )  # fmt: skip
    workers_used: set[str] = set()
    if pending:
        if config.engine == "ray":
            from vlm_rewards.annotation.ray_engine import run_ray

            run_ray(config, pending, store, track)
        else:
            workers_used = run_local(config, reward, pending, store, track, pool)

    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "fingerprint": fp, "parts": parts,
                "source_path": str(Path(config.source.path).resolve())}  # fmt: skip
    merged = finalize(store, refs, manifest, reward.spec.components, lambda p, s: episode_flags(p, s, config.report))
    if config.source.kind == "lerobot":
        _write_lerobot_outputs(config, merged)
    report = None
    if config.report.enabled:
        report = write_report(
            store.root / "report", merged["episodes"], merged["progress"], merged["failures"], config.report,
            title=f"{source_name(config.source)} — {reward.spec.name} ({reward.spec.version})",
        )  # fmt: skip
    counts = merged["manifest"]["counts"]
    logger.info("annotated %d of %d episodes, %d failed; outputs in %s", counts["annotated"], len(refs),
                counts["failed"], store.root)  # fmt: skip
    return AnnotationSummary(
        output_dir=store.root,
        fingerprint=fp,
        num_episodes=len(refs),
        num_annotated=counts["annotated"],
        num_failed=counts["failed"],
        num_skipped=len(refs) - len(pending),
        failures=merged["failures"],
        decode_workers_used=workers_used,
        report=report,
    )


def _write_lerobot_outputs(config: AnnotateConfig, merged: dict[str, Any]) -> None:
    episodes = [entry for entry in merged["progress"].values()]
    root = Path(config.output_dir)
    if config.lerobot.progress_table:
        write_lerobot_progress_table(root / "lerobot_progress.parquet", episodes)
    if config.lerobot.write_copy:
        value = config.lerobot.value
        values = {meta["episode_index"]: lerobot_values(progress, value) for _, meta, progress in episodes}
        write_lerobot_copy(
            Path(config.source.path), root / "lerobot_dataset", values, config.lerobot.column,
            config.lerobot.link_videos,
        )  # fmt: skip


# ----------------------------------------------------------------------------- local engine


PARENT_POLL_S = 0.5  # how often a decode worker checks that the job still runs


def _watch_parent(parent: int) -> None:
    """A decode worker's initializer: a daemon thread ends the worker once the job `parent` is gone.

    A killed job's workers are re-parented (POSIX), so `os.getppid()` changes; with the last worker
    gone, multiprocessing's resource_tracker (which waits for every holder of its pipe) exits too.
    Unpickling the initializer imports this module (and the decoder with it) while the worker starts,
    not when its first episode arrives."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="vlmr-watch-parent", daemon=True).start()


def _worker_started() -> None:
    """A no-op task: one per worker starts them all."""


def make_pool(workers: int, backend: str) -> concurrent.futures.Executor:
    """A pool of `workers` decode threads or processes, all started now."""
    if backend == "thread":
        return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="vlmr-decode")
    # spawn, not fork: the parent may hold threads (reward backends, Ray) that fork would copy mid-state
    context = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_watch_parent, initargs=(os.getpid(),)
    )
    for _ in range(workers):  # spawned workers start on demand: one task each starts them all
        pool.submit(_worker_started)
    return pool


def start_decode_pool(config: AnnotateConfig) -> DecodePool:
    """The local engine's decode workers, started: they run ahead of the reward by up to
    `decode.pool_size * decode.prefetch` episodes (at least a batch)."""
    task = decode_task(config)
    window = max(config.batch_size, config.decode.pool_size * config.decode.prefetch)
    make = functools.partial(make_pool, config.decode.pool_size, config.decode.backend)
    return DecodePool(make, task, window, _decode_worker_crashed)


def decode_task(config: AnnotateConfig, budget: int | None = None) -> Callable[[EpisodeRef], Any]:
    """The decode workers' task for `config`: with the reward's frame `budget` (`episode_budget`),
    only the frames the reward will see are converted and sent back."""
    return functools.partial(decode_or_failure, sampling=config.sampling, budget=budget, threads=config.decode.threads)


def _decode_worker_crashed(ref: EpisodeRef, error: BaseException) -> EpisodeOutcome:
    return EpisodeOutcome(ref=ref, error=f"{ref.path}: the decode worker crashed ({error})", stage="decode")


class DecodePool:
    """`function(item)` for each item in a worker pool, at most `window` in flight, yielded in order.

    A worker that dies (a decoder crashing on a corrupt file) breaks a process pool: the item it held
    yields `on_crash(item)`, and a fresh pool takes over the items still in flight.
    """

    def __init__(self, make: Callable[[], concurrent.futures.Executor], function: Callable, window: int,
                 on_crash: Callable[[Any, BaseException], Any]):  # fmt: skip
        self.make, self.function, self.window, self.on_crash = make, function, window, on_crash
        self.pool = make()

    def map(self, items: Iterable, function: Callable | None = None) -> Iterator[Any]:
        """`function(item)` (default: the pool's) for each item, in order."""
        function = function or self.function
        in_flight: collections.deque = collections.deque()
        iterator = iter(items)

        def top_up() -> None:
            while len(in_flight) < self.window:
                item = next(iterator, _END)
                if item is _END:
                    return
                in_flight.append((item, self.pool.submit(function, item)))

        top_up()
        while in_flight:
            item, future = in_flight.popleft()
            try:
                result = future.result()
            except concurrent.futures.process.BrokenProcessPool as error:
                logger.warning("a decode worker died; restarting the pool")
                self.pool.shutdown(wait=False, cancel_futures=True)
                self.pool = self.make()
                waiting = [other for other, _ in in_flight]
                in_flight.clear()
                in_flight.extend((other, self.pool.submit(function, other)) for other in waiting)
                result = self.on_crash(item, error)
            top_up()  # before yielding: the workers decode ahead while the caller scores this result
            yield result

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> DecodePool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_END = object()


def run_local(
    config: AnnotateConfig,
    reward: RewardModel,
    pending: list[EpisodeRef],
    store: OutputStore,
    track: Track | None,
    pool: DecodePool,
) -> set[str]:
    """Score `pending` in batches as `pool` decodes them; the decode workers' ids."""
    workers: set[str] = set()
    # the reward is built now: the workers convert and send back only the frames it will see
    stream = pool.map(pending, decode_task(config, episode_budget(reward.spec, config.sampling.max_frames)))
    if track is not None:
        stream = track(stream, "annotate", total=len(pending))
    batch: list[DecodedEpisode] = []
    for item in stream:
        if isinstance(item, EpisodeOutcome):
            logger.warning("%s %s: %s", item.ref.source, item.ref.episode, item.error)
            store.write(item)
            continue
        workers.add(item.worker)
        batch.append(item)
        if len(batch) >= config.batch_size:
            _score_and_write(reward, batch, store, config)
            batch = []
    _score_and_write(reward, batch, store, config)
    return workers


def _score_and_write(reward: RewardModel, batch: list[DecodedEpisode], store: OutputStore, config) -> None:
    for outcome in score_batch(reward, batch, config.sampling.max_frames):
        if not outcome.ok:
            logger.warning("%s %s: %s", outcome.ref.source, outcome.ref.episode, outcome.error)
        store.write(outcome)
