"""The output folder of an annotation job: per-episode shards, merged tables, manifest, LeRobot outputs.

    <output_dir>/
      job.json                the fingerprint of the job that owns this folder (written first)
      shards/<stem>.parquet   one per finished episode, written atomically (the resume state), with the
                              stamp of the episode's inputs (`sources.input_stamp`) in its metadata
      failures/<stem>.json    one per failed episode, with the stage, reason and input stamp
      frames.parquet          merged: source, episode, frame, scored, progress (listing order)
      episodes.parquet        per episode: reward, components, progress summary, success, flags
      failures.json           every failure of the last run, in listing order
      manifest.json           fingerprint, settings, counts (no timestamps: reruns are byte-identical)
      lerobot_progress.parquet, lerobot_dataset/   for LeRobot input
      report/                 PNG curves and index.html

A re-run skips episodes that have a shard of the same input stamp (an episode whose files changed is
redone); a job whose fingerprint differs from job.json refuses to write into the folder, naming the
settings that differ, unless `overwrite` is set (which deletes the old outputs first). Temporary files of
writers killed mid-write are removed anywhere in the folder when a job starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlm_rewards.annotation.sources import EpisodeOutcome, EpisodeRef
from vlm_rewards.io import atomic_path, process_alive, write_json

logger = logging.getLogger(__name__)

FORMAT = "vlm-rewards/annotation"
FORMAT_VERSION = 2  # 2: shards and failure files carry their episode's input stamp
META_KEY = b"vlm_rewards.annotation"
FRAME_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("episode", pa.string()),
        ("frame", pa.int64()),
        ("scored", pa.bool_()),
        ("progress", pa.float64()),
    ]
)
MERGED = ("frames.parquet", "episodes.parquet", "failures.json", "manifest.json", "lerobot_progress.parquet")
TEMPORARY = re.compile(r"^\..+\.(\d+)\.[0-9a-f]+\.tmp$")


def shard_stem(source: str, episode: str) -> str:
    """A file name for (source, episode): readable, and unique through a hash of the exact key."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{source}__{episode}").strip("._")[:80]
    digest = hashlib.sha256(f"{source}\0{episode}".encode()).hexdigest()[:12]
    return f"{readable}-{digest}"


class OutputStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.shards = self.root / "shards"
        self.failures = self.root / "failures"

    # -------------------------------------------------------------- ownership and resume

    def prepare(self, fingerprint: str, parts: dict[str, Any], overwrite: bool = False) -> None:
        """Claim the folder for a job with `fingerprint`; refuse a folder of another job unless `overwrite`."""
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"output_dir {self.root}: exists and is not a folder")
        job_path = self.root / "job.json"
        existing, existing_parts = None, {}
        if job_path.is_file():
            job = json.loads(job_path.read_text())
            existing, existing_parts = job.get("fingerprint"), job.get("parts") or {}
        elif self.shards.is_dir() and any(self.shards.iterdir()):
            existing = "<unknown: shards without job.json>"
        if existing is not None and existing != fingerprint:
            if not overwrite:
                changes = "; ".join(changed_parts(existing_parts, parts)) or "a different reward, sampling or source"
                raise ValueError(
                    f"{self.root} holds annotations of another job (fingerprint {existing}, this job {fingerprint}: "
                    f"{changes}). Refusing to mix them; use another output_dir, or set overwrite=true to delete "
                    "the old outputs."
                )
            logger.warning("overwrite: deleting the outputs of job %s in %s", existing, self.root)
            self.clear()
        self.root.mkdir(parents=True, exist_ok=True)
        self.remove_orphans()
        write_json(job_path, {"format": FORMAT, "format_version": FORMAT_VERSION, "fingerprint": fingerprint,
                              "parts": parts})  # fmt: skip

    def clear(self) -> None:
        for name in ("shards", "failures", "report", "lerobot_dataset"):
            shutil.rmtree(self.root / name, ignore_errors=True)
        for name in (*MERGED, "job.json"):
            (self.root / name).unlink(missing_ok=True)

    def remove_orphans(self) -> None:
        """Temporary files and folders (`io.atomic_path`, `io.atomic_folder`) of writers that died (SIGKILL)
        mid-write, anywhere in the folder: shards, merged tables, the report's PNGs."""
        for path in sorted(self.root.rglob(".*.tmp")):
            match = TEMPORARY.match(path.name)
            if match and not process_alive(int(match.group(1))):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    def shard_path(self, ref: EpisodeRef) -> Path:
        return self.shards / f"{shard_stem(ref.source, ref.episode)}.parquet"

    def failure_path(self, ref: EpisodeRef) -> Path:
        return self.failures / f"{shard_stem(ref.source, ref.episode)}.json"

    def is_done(self, ref: EpisodeRef, retry_failed: bool = True) -> bool:
        """Whether `ref` has a shard (or, unless `retry_failed`, a failure) written from the same inputs."""
        shard, failure = self.shard_path(ref), self.failure_path(ref)
        if shard.is_file():
            return json.loads(pq.read_schema(shard).metadata[META_KEY]).get("inputs") == ref.inputs
        return not retry_failed and failure.is_file() and json.loads(failure.read_text()).get("inputs") == ref.inputs

    # -------------------------------------------------------------- per-episode writes

    def write(self, outcome: EpisodeOutcome) -> None:
        ref = outcome.ref
        if outcome.ok:
            frames = np.arange(outcome.num_frames, dtype=np.int64)
            progress = np.asarray(outcome.progress, dtype=np.float64)
            table = pa.table(
                {
                    "source": pa.array([ref.source] * outcome.num_frames, pa.string()),
                    "episode": pa.array([ref.episode] * outcome.num_frames, pa.string()),
                    "frame": pa.array(frames),
                    "scored": pa.array(outcome.scored),
                    "progress": pa.array(progress, mask=np.isnan(progress)),
                },
                schema=FRAME_SCHEMA,
            )
            meta = {
                "source": ref.source,
                "episode": ref.episode,
                "instruction": ref.instruction,
                "num_frames": outcome.num_frames,
                "num_scored": int(outcome.scored.sum()),
                "reward": outcome.reward,
                "components": outcome.components,
                "info": outcome.info,
                "success": ref.success,
                "episode_index": ref.episode_index,
                "index_start": ref.index_start,
                "inputs": ref.inputs,
            }
            table = table.replace_schema_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode()})
            with atomic_path(self.shard_path(ref)) as temporary:
                pq.write_table(table, temporary)
            self.failure_path(ref).unlink(missing_ok=True)
        else:
            record = failure_record(ref, outcome.stage or "decode", outcome.error or "")
            write_json(self.failure_path(ref), record | {"inputs": ref.inputs})
            self.shard_path(ref).unlink(missing_ok=True)  # a shard of the episode's earlier inputs

    def read_shard(self, ref: EpisodeRef) -> tuple[pa.Table, dict[str, Any]]:
        # ParquetFile, not read_table: 4x less overhead per small file, which the merge pays per episode
        with pq.ParquetFile(self.shard_path(ref)) as shard:
            table = shard.read()
        meta = json.loads(table.schema.metadata[META_KEY])
        return table.replace_schema_metadata(None), meta


def failure_record(ref: EpisodeRef, stage: str, reason: str) -> dict[str, Any]:
    return {"source": ref.source, "episode": ref.episode, "path": ref.path, "stage": stage, "reason": reason}


def changed_parts(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """The fingerprint parts that differ between two jobs, as `dotted.key: old -> new`."""
    changes = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        if isinstance(before, dict) and isinstance(after, dict):
            changes += changed_parts(before, after, f"{prefix}{key}.")
        elif before != after:
            changes.append(f"{prefix}{key}: {before!r} -> {after!r}")
    return changes


# ----------------------------------------------------------------------------- merged outputs


def finalize(
    store: OutputStore,
    refs: Sequence[EpisodeRef],
    manifest: dict[str, Any],
    component_names: Sequence[str],
    flag_fn,
) -> dict[str, Any]:
    """Merge the shards of `refs` (in listing order) into the final tables; returns the manifest. `flag_fn`
    gives an episode's quality flags (`report.episode_flags`; the flags are listed in `report.FLAG_NAMES`)."""
    root = store.root
    episodes_rows: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    progress_by_episode: dict[str, tuple[EpisodeRef, dict[str, Any], np.ndarray]] = {}
    num_frames = 0
    with atomic_path(root / "frames.parquet") as temporary, pq.ParquetWriter(temporary, FRAME_SCHEMA) as writer:
        for ref in refs:
            if not store.shard_path(ref).is_file():
                failure_file = store.failure_path(ref)
                if failure_file.is_file():
                    record = json.loads(failure_file.read_text())
                    record.pop("inputs", None)
                    failures.append(record)
                else:
                    failures.append(failure_record(ref, "missing", "not processed (the run stopped early?)"))
                continue
            table, meta = store.read_shard(ref)
            writer.write_table(table)
            num_frames += table.num_rows
            progress = table["progress"].to_numpy(zero_copy_only=False).astype(np.float64)
            progress_by_episode[ref.episode] = (ref, meta, progress)
            episodes_rows.append(_episode_row(meta, progress, component_names, flag_fn))
    episode_schema = pa.schema(
        [
            ("source", pa.string()),
            ("episode", pa.string()),
            ("instruction", pa.string()),
            ("num_frames", pa.int64()),
            ("num_scored", pa.int64()),
            ("reward", pa.float64()),
            *[(f"component.{name}", pa.float64()) for name in component_names],
            ("progress_first", pa.float64()),
            ("progress_final", pa.float64()),
            ("progress_min", pa.float64()),
            ("progress_max", pa.float64()),
            ("success", pa.bool_()),
            ("flags", pa.string()),
        ]
    )
    with atomic_path(root / "episodes.parquet") as temporary:
        pq.write_table(pa.Table.from_pylist(episodes_rows, schema=episode_schema), temporary)
    with atomic_path(root / "failures.json") as temporary:
        temporary.write_text(json.dumps(failures, indent=2, sort_keys=True) + "\n")
    manifest = dict(manifest) | {
        "counts": {
            "episodes": len(refs),
            "annotated": len(episodes_rows),
            "failed": len(failures),
            "frames": num_frames,
            "flagged": sum(1 for row in episodes_rows if row["flags"]),
        },
    }
    write_json(root / "manifest.json", manifest)
    return {"manifest": manifest, "episodes": episodes_rows, "failures": failures, "progress": progress_by_episode}


def _episode_row(meta: dict[str, Any], progress: np.ndarray, component_names: Sequence[str], flag_fn) -> dict:
    finite = progress[~np.isnan(progress)]
    has = finite.size > 0
    row = {
        "source": meta["source"],
        "episode": meta["episode"],
        "instruction": meta["instruction"],
        "num_frames": meta["num_frames"],
        "num_scored": meta["num_scored"],
        "reward": meta["reward"],
        **{f"component.{name}": meta["components"].get(name) for name in component_names},
        "progress_first": float(finite[0]) if has else None,
        "progress_final": float(finite[-1]) if has else None,
        "progress_min": float(finite.min()) if has else None,
        "progress_max": float(finite.max()) if has else None,
        "success": meta["success"],
    }
    row["flags"] = ",".join(flag_fn(finite, meta["success"])) if has else ""
    return row


# ----------------------------------------------------------------------------- LeRobot outputs


def lerobot_values(progress: np.ndarray, value: str) -> np.ndarray:
    if value == "progress_delta":
        return np.append(np.diff(progress), 0.0).astype(np.float32)
    return progress.astype(np.float32)


def write_lerobot_progress_table(path: Path, episodes: Sequence[tuple[EpisodeRef, dict, np.ndarray]]) -> int:
    """LeRobot's progress table: index, episode_index, frame_index, progress_sparse, progress_dense.

    A single-head reward gives one progress per frame: both columns hold it (interpolated between the
    frames the reward saw when sampling or the frame budget skipped some)."""
    columns: dict[str, list[np.ndarray]] = {n: [] for n in ("index", "episode_index", "frame_index", "p")}
    for _ref, meta, progress in episodes:
        n = len(progress)
        columns["index"].append(meta["index_start"] + np.arange(n, dtype=np.int64))
        columns["episode_index"].append(np.full(n, meta["episode_index"], dtype=np.int64))
        columns["frame_index"].append(np.arange(n, dtype=np.int64))
        columns["p"].append(progress.astype(np.float32))
    joined = {name: np.concatenate(parts) if parts else np.zeros(0) for name, parts in columns.items()}
    table = pa.table(
        {
            "index": pa.array(joined["index"], pa.int64()),
            "episode_index": pa.array(joined["episode_index"], pa.int64()),
            "frame_index": pa.array(joined["frame_index"], pa.int64()),
            "progress_sparse": pa.array(joined["p"], pa.float32()),
            "progress_dense": pa.array(joined["p"], pa.float32()),
        }
    )
    with atomic_path(path) as temporary:
        pq.write_table(table, temporary)
    return table.num_rows


def write_lerobot_copy(
    source_root: Path,
    destination: Path,
    values_by_episode: dict[int, np.ndarray],
    column: str,
    link_videos: bool = True,
) -> None:
    """A copy of a LeRobot v3 dataset with a new float32 per-frame `column` (NaN for episodes that
    were not annotated): data parquet files rewritten with the column, meta/info.json features and
    meta/stats.json updated, videos hard-linked (copied across file systems), the rest copied.
    Built in a hidden folder and renamed into place."""
    source_root, destination = Path(source_root), Path(destination)
    temporary = destination.parent / f".{destination.name}.build"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    all_values: list[np.ndarray] = []
    for path in sorted(source_root.rglob("*")):
        relative = path.relative_to(source_root)
        target = temporary / relative
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        parts = relative.parts
        if parts[0] == "data" and path.suffix == ".parquet":
            all_values.append(_rewrite_data_file(path, target, values_by_episode, column))
        elif parts[0] == "videos" and link_videos:
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)
        elif relative.as_posix() not in ("meta/info.json", "meta/stats.json"):
            shutil.copyfile(path, target)
    info = json.loads((source_root / "meta" / "info.json").read_text())
    if column in info.get("features", {}):
        logger.warning("the dataset already has a feature %r; the annotated copy replaces it", column)
    info.setdefault("features", {})[column] = {"dtype": "float32", "shape": [1], "names": None}
    (temporary / "meta" / "info.json").write_text(json.dumps(info, indent=4) + "\n")
    stats_path = source_root / "meta" / "stats.json"
    if stats_path.is_file():
        stats = json.loads(stats_path.read_text())
        values = np.concatenate(all_values) if all_values else np.zeros(0, np.float32)
        stats[column] = _feature_stats(values[~np.isnan(values)], stats)
        (temporary / "meta" / "stats.json").write_text(json.dumps(stats, indent=4) + "\n")
    shutil.rmtree(destination, ignore_errors=True)
    os.replace(temporary, destination)


def _rewrite_data_file(path: Path, target: Path, values_by_episode: dict[int, np.ndarray], column: str) -> np.ndarray:
    table = pq.read_table(path)
    episodes = table["episode_index"].to_numpy()
    frames = table["frame_index"].to_numpy()
    values = np.full(table.num_rows, np.nan, dtype=np.float32)
    for episode in np.unique(episodes):
        if int(episode) in values_by_episode:
            rows = episodes == episode
            values[rows] = values_by_episode[int(episode)][frames[rows]]
    if column in table.column_names:
        table = table.drop_columns([column])
    metadata = dict(table.schema.metadata or {})
    table = table.append_column(pa.field(column, pa.float32()), pa.array(values, pa.float32()))
    if b"huggingface" in metadata:  # HF datasets' feature list, which LeRobot's loader reads
        hf = json.loads(metadata[b"huggingface"])
        hf.setdefault("info", {}).setdefault("features", {})[column] = {"dtype": "float32", "_type": "Value"}
        metadata[b"huggingface"] = json.dumps(hf).encode()
    table = table.replace_schema_metadata(metadata)
    pq.write_table(table, target)
    return values


def _feature_stats(values: np.ndarray, stats: dict[str, Any]) -> dict[str, list[float]]:
    """min/max/mean/std/count (and the quantiles other features carry) of the new column."""
    keys = next(iter(stats.values()), {}).keys() if stats else ["min", "max", "mean", "std", "count"]
    if values.size == 0:
        values = np.zeros(1, np.float32)
    result = {}
    for key in keys:
        if key == "count":
            result[key] = [int(values.size)]
        elif key in ("min", "max", "mean", "std"):
            result[key] = [float(getattr(np, key)(values))]
        elif re.fullmatch(r"q\d\d", key):
            result[key] = [float(np.quantile(values, int(key[1:]) / 100))]
    for key in ("min", "max", "mean", "std", "count"):
        if key not in result:
            result[key] = [int(values.size)] if key == "count" else [float(getattr(np, key)(values))]
    return result
