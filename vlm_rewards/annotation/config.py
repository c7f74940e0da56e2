"""The `vlmr annotate` job config (`configs/annotate/*.yaml`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pydantic

from vlm_rewards.config import JobConfig, Settings

VIDEO_EXTENSIONS = [".mp4", ".webm", ".avi", ".mkv", ".mov"]


class SourceConfig(Settings):
    """Where episodes come from."""

    kind: Literal["videos", "lerobot", "episodes"] = "videos"
    """"videos" (a folder of video files), "lerobot" (a LeRobot v3 dataset folder) or "episodes" (the
    project's episode format, `vlm_rewards.data.episodes`)."""
    path: Path = Path("data/videos")
    """The folder to annotate; the job's fingerprint names it by its resolved path."""
    name: str | None = None
    """The `source` in output keys; None: the folder's name (episodes: the dataset's name)."""
    instruction: str | None = None
    """One fixed instruction for every episode (videos: used where the sidecar has none; lerobot/episodes:
    replaces the dataset's task text)."""
    instructions: Path | None = None
    """A sidecar for a video folder: JSON {"rel/path.mp4": "text" | {"instruction", "success", "reference"}}
    or CSV (columns path, instruction[, success][, reference]); keys are paths relative to the folder (or
    bare file names / stems). Must exist when set: null it to use only `instruction`."""
    extensions: list[str] = pydantic.Field(default_factory=lambda: list(VIDEO_EXTENSIONS))
    """Video file suffixes listed in a video folder (case-insensitive)."""
    recursive: bool = True
    """List videos in subfolders too (the episode key is then the relative path)."""
    camera: str | None = None
    """LeRobot camera key scored as `frames`; None: the first video feature."""
    views: dict[str, str] = pydantic.Field(default_factory=dict)
    """Extra LeRobot cameras passed as request views, view name -> camera key."""
    reference: Path | None = None
    """A goal/reference image (or clip) given to every request (rewards that require one)."""
    limit: int | None = pydantic.Field(None, ge=1)
    """Annotate only the first `limit` episodes of the listing; None: all."""


class SamplingConfig(Settings):
    """Which frames the reward sees: every frame, every `stride`-th, or `fps` frames per second (the
    last frame always included); clips longer than the reward's `max_frames` (or `max_frames` here,
    whichever is smaller) are subsampled evenly by `vlm_rewards.subsample`. Values of frames the
    reward did not see are interpolated (`expand_to_episode`) and marked `scored = false`."""

    mode: Literal["all", "stride", "fps"] = "all"
    """"all" frames, every `stride`-th, or `fps` frames per second of the source's frame rate."""
    stride: int = pydantic.Field(1, ge=1)
    """Keep every `stride`-th frame (mode "stride")."""
    fps: float | None = pydantic.Field(None, gt=0)
    """Frames per second to keep (mode "fps", which requires it)."""
    max_frames: int | None = pydantic.Field(None, ge=2)
    """A frame budget below the reward's `spec.max_frames`; None: the reward's alone."""
    max_side: int | None = pydantic.Field(None, ge=8)
    """Downscale frames so that their longer side is at most this many pixels; None: decoded size."""

    @pydantic.model_validator(mode="after")
    def _check(self) -> SamplingConfig:
        if self.mode == "fps" and self.fps is None:
            raise ValueError("sampling.mode 'fps' needs sampling.fps")
        return self


class DecodeConfig(Settings):
    """Decoding workers (local engine), which decode episodes ahead of the reward."""

    workers: int | None = pydantic.Field(None, ge=1)
    """Decode processes (or threads); None: one per usable CPU core but one (the reward's), see `pool_size`."""
    backend: Literal["process", "thread"] = "process"
    """"process" (spawned; a crashing decoder fails its episode only) or "thread"."""
    prefetch: int = pydantic.Field(2, ge=1)
    """Episodes in flight per worker (at least a batch in all)."""
    threads: int = pydantic.Field(1, ge=0)
    """FFmpeg decoding threads per worker. 1: the workers are the parallelism; 0: FFmpeg's default (about
    one per core in every worker), which pays off for a few large videos on many cores, not many small ones."""

    @property
    def pool_size(self) -> int:
        """`workers`, or one per usable core but the one the reward (or the GPU's feeder) runs on: on a
        2-core machine two decode processes slow a CPU reward by ~7 % for decoding it does not need."""
        # the cores this process may run on: its affinity where the OS has one (Linux), else all of them
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return self.workers or max(1, cores - 1)


class LeRobotOutputConfig(Settings):
    """Outputs for LeRobot input: an annotated copy of the dataset with a per-frame `column`, and the
    progress table read by LeRobot's progress-weighted behaviour cloning."""

    column: str = "progress"
    """The per-frame feature added to the copy (e.g. `next.reward`)."""
    value: Literal["progress", "progress_delta"] = "progress"
    """"progress" (per-frame progress) or "progress_delta" (progress[t+1] - progress[t], 0 at the last
    frame: a dense shaped reward, e.g. for `column: next.reward`)."""
    write_copy: bool = True
    """Write the annotated copy of the dataset, `lerobot_dataset/`."""
    progress_table: bool = True
    """Write LeRobot's progress table, `lerobot_progress.parquet`."""
    link_videos: bool = True
    """Hard-link the copy's videos to the source's (copied across file systems); False: copy them."""


class RayConfig(Settings):
    """`engine: ray`: decoding as Ray Data tasks, scoring on an actor pool."""

    address: str | None = None
    """A Ray cluster to join ("auto", "ray://host:10001"); None: RAY_ADDRESS if set, else a local instance."""
    num_cpus: int | None = None
    """CPUs of a local Ray instance; None: all."""
    num_actors: int = pydantic.Field(1, ge=1)
    """Reward actors, each with its own copy of the reward."""
    num_cpus_per_actor: float = pydantic.Field(1.0, ge=0)
    """CPUs each reward actor reserves."""
    num_gpus_per_actor: float = pydantic.Field(0.0, ge=0)
    """GPUs each reward actor reserves: 1 for one actor per GPU."""
    decode_num_cpus: float = pydantic.Field(1.0, gt=0)
    """CPUs each decode task reserves."""


class ReportConfig(Settings):
    """The human report (PNG curves + HTML index) and the thresholds that flag episodes."""

    enabled: bool = True
    """Write `report/` (curves, histogram, index.html)."""
    max_curves: int = pydantic.Field(200, ge=0)
    """Progress curves drawn at most, flagged episodes first."""
    rise_threshold: float = 0.05
    """Flag `never_rises`: max(progress) - progress[0] below this."""
    collapse_threshold: float = 0.3
    """Flag `collapses_at_end`: max(progress) - progress[-1] above this."""
    success_threshold: float = 0.5
    """Flag `disagrees_with_success`: a success with final progress below this, or a failure with final
    progress at least 1 - this."""


class AnnotateConfig(JobConfig):
    """`vlmr annotate`: per-frame progress / reward for every episode of a dataset, resumable."""

    reward: str = "goal_pixel_progress"
    """A reward YAML path or a name in configs/rewards/."""
    source: SourceConfig = pydantic.Field(default_factory=SourceConfig)
    """Where episodes come from."""
    sampling: SamplingConfig = pydantic.Field(default_factory=SamplingConfig)
    """Which frames the reward sees."""
    decode: DecodeConfig = pydantic.Field(default_factory=DecodeConfig)
    """Decode workers of the local engine."""
    engine: Literal["local", "ray"] = "local"
    """"local" (a decode pool beside the reward, on this machine) or "ray" (Ray Data, see `ray`)."""
    batch_size: int = pydantic.Field(8, ge=1)
    """Episodes per reward call."""
    output_dir: Path = Path("outputs/annotate")
    """The job's folder: shards (the resume state), merged tables, report; see `annotation.outputs`."""
    overwrite: bool = False
    """Existing outputs of another fingerprint (other reward, sampling or source): refuse (False) or
    delete them (True)."""
    retry_failed: bool = True
    """A re-run retries episodes that failed before (an episode whose input files changed is redone
    either way)."""
    lerobot: LeRobotOutputConfig = pydantic.Field(default_factory=LeRobotOutputConfig)
    """Outputs for LeRobot input."""
    ray: RayConfig = pydantic.Field(default_factory=RayConfig)
    """Settings of `engine: ray`."""
    report: ReportConfig = pydantic.Field(default_factory=ReportConfig)
    """The human report and its flags."""
