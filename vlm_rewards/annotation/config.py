"""The `vlmr annotate` job config (`configs/annotate/*.yaml`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pydantic

from vlm_rewards.config import JobConfig

VIDEO_EXTENSIONS = [".mp4", ".webm", ".avi", ".mkv", ".mov"]


class _Section(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


class SourceConfig(_Section):
    """Where episodes come from.

    kind: "videos" (a folder of video files), "lerobot" (a LeRobot v3 dataset folder) or "episodes"
        (the project's episode format, `vlm_rewards.data.episodes`).
    name: the `source` in output keys; defaults to the folder name.
    instruction: one fixed instruction for every episode (videos: used where the sidecar has none;
        lerobot/episodes: replaces the dataset's task text).
    instructions: a sidecar JSON ({"rel/path.mp4": "text" | {"instruction": ..., "success": ...}})
        or CSV (columns path, instruction[, success]) for a video folder; keys are paths relative to
        the folder (or bare file names / stems).
    camera: LeRobot camera key scored as `frames` (default: the first video feature).
    views: extra LeRobot cameras passed as request views, view name -> camera key.
    reference: a goal/reference image (or clip) given to every request (rewards that require one).
    """

    kind: Literal["videos", "lerobot", "episodes"] = "videos"
    path: Path = Path("data/videos")
    name: str | None = None
    instruction: str | None = None
    instructions: Path | None = None
    extensions: list[str] = pydantic.Field(default_factory=lambda: list(VIDEO_EXTENSIONS))
    recursive: bool = True
    camera: str | None = None
    views: dict[str, str] = pydantic.Field(default_factory=dict)
    reference: Path | None = None
    limit: int | None = pydantic.Field(None, ge=1)


class SamplingConfig(_Section):
    """Which frames the reward sees: every frame, every `stride`-th, or `fps` frames per second (the
    last frame always included); clips longer than the reward's `max_frames` (or `max_frames` here,
    whichever is smaller) are subsampled evenly by `vlm_rewards.subsample`. Values of frames the
    reward did not see are interpolated (`expand_to_episode`) and marked `scored = false`.
    max_side: downscale frames so that their longer side is at most this many pixels."""

    mode: Literal["all", "stride", "fps"] = "all"
    stride: int = pydantic.Field(1, ge=1)
    fps: float | None = pydantic.Field(None, gt=0)
    max_frames: int | None = pydantic.Field(None, ge=2)
    max_side: int | None = pydantic.Field(None, ge=8)

    @pydantic.model_validator(mode="after")
    def _check(self) -> SamplingConfig:
        if self.mode == "fps" and self.fps is None:
            raise ValueError("sampling.mode 'fps' needs sampling.fps")
        return self


class DecodeConfig(_Section):
    """Decoding workers (local engine): `workers` processes (or threads) decode episodes ahead of the
    reward, at most `prefetch` episodes per worker in flight. `threads`: FFmpeg decoding threads per
    worker (1: the workers are the parallelism; 0: FFmpeg's default, about one per core in every
    worker, which pays off for a few large videos on many cores, not for many small ones)."""

    workers: int | None = pydantic.Field(None, ge=1)  # None: one per CPU core but one (the reward's)
    backend: Literal["process", "thread"] = "process"
    prefetch: int = pydantic.Field(2, ge=1)
    threads: int = pydantic.Field(1, ge=0)

    @property
    def pool_size(self) -> int:
        """`workers`, or one per usable core but the one the reward (or the GPU's feeder) runs on: on a
        2-core machine two decode processes slow a CPU reward by ~7 % for decoding it does not need."""
        # the cores this process may run on: its affinity where the OS has one (Linux), else all of them
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return self.workers or max(1, cores - 1)


class LeRobotOutputConfig(_Section):
    """Outputs for LeRobot input: an annotated copy of the dataset with a per-frame `column`, and the
    progress table read by LeRobot's progress-weighted behaviour cloning.

    value: "progress" (per-frame progress) or "progress_delta" (progress[t+1] - progress[t], 0 at the
        last frame: a dense shaped reward, e.g. for `column: next.reward`)."""

    column: str = "progress"
    value: Literal["progress", "progress_delta"] = "progress"
    write_copy: bool = True
    progress_table: bool = True
    link_videos: bool = True


class RayConfig(_Section):
    """`engine: ray`: decoding as Ray Data tasks, scoring on an actor pool.

    address: a Ray cluster to join ("auto", "ray://host:10001"); None uses RAY_ADDRESS if set, else
        starts a local instance (with `num_cpus` CPUs if given).
    num_actors: reward actors; num_gpus_per_actor: 1 for one actor per GPU."""

    address: str | None = None
    num_cpus: int | None = None
    num_actors: int = pydantic.Field(1, ge=1)
    num_cpus_per_actor: float = pydantic.Field(1.0, ge=0)
    num_gpus_per_actor: float = pydantic.Field(0.0, ge=0)
    decode_num_cpus: float = pydantic.Field(1.0, gt=0)


class ReportConfig(_Section):
    """The human report (PNG curves + HTML index) and the thresholds that flag episodes."""

    enabled: bool = True
    max_curves: int = pydantic.Field(200, ge=0)
    rise_threshold: float = 0.05  # never rises: max(progress) - progress[0] below this
    collapse_threshold: float = 0.3  # collapses: max(progress) - progress[-1] above this
    success_threshold: float = 0.5  # disagrees: success but final < this, or failure but final >= 1 - this


class AnnotateConfig(JobConfig):
    """`vlmr annotate`: per-frame progress / reward for every episode of a dataset, resumable."""

    reward: str = "goal_pixel_progress"  # a reward YAML path or a name in configs/rewards/
    source: SourceConfig = pydantic.Field(default_factory=SourceConfig)
    sampling: SamplingConfig = pydantic.Field(default_factory=SamplingConfig)
    decode: DecodeConfig = pydantic.Field(default_factory=DecodeConfig)
    engine: Literal["local", "ray"] = "local"
    batch_size: int = pydantic.Field(8, ge=1)  # episodes per reward call
    output_dir: Path = Path("outputs/annotate")
    overwrite: bool = False  # existing output of another fingerprint: refuse (False) or delete it (True)
    retry_failed: bool = True  # a re-run retries episodes that failed before
    lerobot: LeRobotOutputConfig = pydantic.Field(default_factory=LeRobotOutputConfig)
    ray: RayConfig = pydantic.Field(default_factory=RayConfig)
    report: ReportConfig = pydantic.Field(default_factory=ReportConfig)
