"""Annotation throughput: the whole `vlmr annotate` job vs the reward model alone, and decode speed.

One run generates a folder of synthetic videos (H.264 .mp4, the test fixtures' `write_video`) and a
progress RM with random weights (the figures are speeds, not quality):

- `--preset tiny`: a tiny trained-RM checkpoint (`build_tiny_backbone` + `RewardNetwork.from_backbone`)
  saved to disk and loaded as `{kind: trained_rm, model: <folder>}`, as `vlmr annotate` would;
- `--preset qwen2_5_vl_3b`: a Qwen2.5-VL-3B-shaped RM built in memory on `--device` (the config is
  written in code, nothing is downloaded); its "loading" is the random initialisation.

Then, interleaved over `--repeats` rounds (after an untimed warm-up: a small job and one reward call)
so that background load hits every measurement alike, it times:

- job: `run_annotation` on the folder as `vlmr annotate` runs it: it starts the decode workers, then
  builds the reward, then decodes (local engine, `--workers` workers) ahead of the reward, which
  scores batches of `--batch-size` episodes; shards and merged tables are written to a fresh folder
  (the report is off unless `--report`).
- reward alone: build the reward, then `reward.score` on the very requests the job builds (decoded
  once before timing, subsampled to the reward's frame budget, in the job's batches and order).
  Both sides count the build, as a user running either would; the build is also timed alone.
- decode alone: `decode_episode` on every video in this process, one after the other (frames/s of
  one worker), through the job's decode pool (no scoring), and the pool's start-up.

Each phase also records CPU seconds of this process and of its finished child processes (the
decode workers). With decode processes, the main-process CPU ratio (reward alone / job) is about the
best wall-clock ratio the job can reach, even where they have cores of their own; it depends much
less on other load than wall-clock times do.

Frames/s counts source frames. The headline is the ratio job / reward alone (target >= 0.9): how
much of the reward model's speed the pipeline keeps. The job's per-frame outputs (frames.parquet) are
checked against the reward-alone values; the run exits with code 1 if they differ.

    .venv/bin/python bench/annotate_throughput.py --threads 1
    python bench/annotate_throughput.py --preset qwen2_5_vl_3b --device cuda --dtype bfloat16 --workers 4
"""

from __future__ import annotations

import functools
import gc
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

# Heavy imports (torch, transformers, the package, bench._common) live in the functions: decode
# workers are spawned processes, which re-import this script as their main module, and should start
# as light as the `vlmr` CLI's workers do, or the job would be timed with a start-up cost the CLI does
# not have.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `tests.annotation_fixtures` and `bench._common` from a checkout

TARGET = 0.9
INSTRUCTION = "make the picture bright"
FRAME_SIZES = {"tiny": 128, "qwen2_5_vl_3b": 224}


@dataclass
class BenchConfig:
    preset: str = "tiny"  # tiny | qwen2_5_vl_3b
    num_videos: int = 256
    frames: int = 32  # per video
    frame_size: int | None = None  # square frames, pixels; None: the preset's
    workers: int = 2
    backend: str = "process"
    batch_size: int = 8  # episodes per reward call (job) = trained_rm batch_size
    max_frames: int = 32  # the RM's frame budget; longer videos are subsampled
    device: str = "cpu"
    dtype: str = "auto"
    repeats: int = 3
    report: bool = False
    threads: int | None = None
    num_layers: int = 2  # tiny backbone depth
    seed: int = 0

    @property
    def side(self) -> int:
        return self.frame_size or FRAME_SIZES[self.preset]


def make_videos(root: Path, config: BenchConfig) -> Path:
    from tests.annotation_fixtures import ramp_frames, write_video

    root.mkdir(parents=True, exist_ok=True)
    for i in range(config.num_videos):
        write_video(root / f"video_{i:04d}.mp4", ramp_frames(config.frames, size=config.side, seed=i))
    return root


def make_tiny_reward_model(folder: Path, config: BenchConfig) -> Path:
    import torch

    from vlm_rewards.models.backbones import build_tiny_backbone
    from vlm_rewards.models.config import RewardNetworkConfig
    from vlm_rewards.models.reward_network import RewardNetwork

    backbone = build_tiny_backbone("qwen2_5_vl", folder / "backbone", num_layers=config.num_layers, seed=config.seed)
    torch.manual_seed(config.seed)
    network = RewardNetwork.from_backbone(backbone, RewardNetworkConfig(max_frames=config.max_frames))
    network.save_pretrained(folder / "rm")
    return folder / "rm"


def reward_builder(config: BenchConfig, workdir: Path) -> Callable[[], Any]:
    """A function that builds (loads) the preset's reward; each call gives a fresh one with the same weights."""
    from vlm_rewards.models.device import resolve_device, resolve_dtype
    from vlm_rewards.models.trained_reward import TrainedRewardModel
    from vlm_rewards.registry import build_reward

    if config.preset == "tiny":
        params = {"kind": "trained_rm", "model": str(make_tiny_reward_model(workdir, config)),
                  "device": config.device, "dtype": config.dtype, "batch_size": config.batch_size}  # fmt: skip
        return functools.partial(build_reward, params)

    from bench._common import build_model

    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)

    def build() -> TrainedRewardModel:
        # the same random weights in every build, so that the outputs of all phases can be compared
        model = build_model(config.preset, workdir, device, dtype, config.max_frames, seed=config.seed)
        return TrainedRewardModel(model, "random", config.preset, config.batch_size)

    return build


def annotate_config(config: BenchConfig, videos: Path, output_dir: Path, limit: int | None = None):
    from vlm_rewards.annotation import AnnotateConfig

    return AnnotateConfig.model_validate(
        {
            "source": {"kind": "videos", "path": str(videos), "instruction": INSTRUCTION, "limit": limit},
            "output_dir": str(output_dir),
            "batch_size": config.batch_size,
            "decode": {"workers": config.workers, "backend": config.backend},
            "report": {"enabled": config.report},
            "overwrite": True,
        }
    )


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_benchmark(config: BenchConfig, workdir: Path) -> dict[str, Any]:
    """Build the inputs in `workdir`, time the phases interleaved; the result dict."""
    import torch

    from bench._common import machine
    from vlm_rewards.annotation import run_annotation
    from vlm_rewards.annotation.decode import decode_episode
    from vlm_rewards.annotation.runner import start_decode_pool
    from vlm_rewards.annotation.scoring import build_request, episode_budget
    from vlm_rewards.annotation.sources import iter_episodes
    from vlm_rewards.models.device import resolve_device
    from vlm_rewards.subsample import subsample_request

    if config.threads:
        torch.set_num_threads(config.threads)
    machine_info = machine(resolve_device(config.device))  # before this run adds to the load average
    videos = make_videos(workdir / "videos", config)
    build = reward_builder(config, workdir)
    reward = build()  # for its spec and the warm-up
    job_config = annotate_config(config, videos, workdir / "job")
    refs = list(iter_episodes(job_config.source))
    total_frames = config.num_videos * config.frames

    # the job's requests, decoded once: the same subsampling, batches and order as `run_local`
    decoded = [decode_episode(ref, job_config.sampling) for ref in refs]
    budget = episode_budget(reward.spec, job_config.sampling.max_frames)
    requests = [subsample_request(build_request(episode), budget) for episode in decoded]
    batches = [requests[i : i + config.batch_size] for i in range(0, len(requests), config.batch_size)]

    in_reward: dict[str, list[float]] = {"seconds": [], "cpu_seconds": []}

    def build_timed() -> Any:
        """The job's reward with its `score` calls timed: how much of the job is the reward itself."""
        reward = build()
        score = reward.score

        def timed_score(batch: list) -> list:
            start, cpu = time.perf_counter(), time.thread_time()
            results = score(batch)
            in_reward["seconds"][-1] += time.perf_counter() - start
            in_reward["cpu_seconds"][-1] += time.thread_time() - cpu
            return results

        reward.score = timed_score
        return reward

    def job(settings) -> Any:  # as `vlmr annotate`: run_annotation starts the decode pool, then builds the reward
        shutil.rmtree(settings.output_dir, ignore_errors=True)
        for values in in_reward.values():
            values.append(0.0)
        summary = run_annotation(settings, reward=build_timed)
        _sync()
        return summary

    def score(reward) -> list:
        results = [result for batch in batches for result in reward.score(batch)]
        _sync()
        return results

    def build_only() -> None:
        build()  # and dropped at once, freeing its memory (GPU memory for the 3B preset)

    def decode_serial() -> None:
        for ref in refs:
            decode_episode(ref, job_config.sampling)

    def decode_pool(items: list) -> None:
        with start_decode_pool(job_config) as pool:
            for _ in pool.map(items):
                pass

    # untimed warm-up of every code path: a job of two batches, one reward call
    job(annotate_config(config, videos, workdir / "warmup", limit=2 * config.batch_size))
    score(reward)
    del reward
    for values in in_reward.values():
        values.clear()
    phases = {
        "job": lambda: job(job_config),
        "reward_alone": lambda: score(build()),
        "reward_build": build_only,
        "decode_one_worker": decode_serial,
        "decode_pool": lambda: decode_pool(refs),
        "pool_start": lambda: decode_pool(refs[: config.workers]),  # spawn and import, one small decode each
    }
    times: dict[str, list[float]] = {name: [] for name in phases}
    cpu_times: dict[str, list[tuple[float, float]]] = {name: [] for name in phases}
    outputs: dict[str, Any] = {}
    for _ in range(config.repeats):
        for name, phase in phases.items():
            start, cpu_start = time.perf_counter(), cpu_seconds()
            outputs[name] = phase()
            times[name].append(time.perf_counter() - start)
            cpu_times[name].append(tuple(end - begin for end, begin in zip(cpu_seconds(), cpu_start)))
            gc.collect()  # frees the phase's model now (the job's sits in a cycle through its timed score)

    summary = outputs["job"]
    check = compare_outputs(job_config.output_dir, decoded, requests, outputs["reward_alone"])
    median = {name: statistics.median(values) for name, values in times.items()}
    median_cpu = {name: {"main": statistics.median(main for main, _ in values),
                         "workers": statistics.median(workers for _, workers in values)}
                  for name, values in cpu_times.items()}  # fmt: skip
    fps = {name: total_frames / median[name] for name in phases if name not in ("reward_build", "pool_start")}
    return {
        "config": asdict(config) | {"frame_size": config.side},
        "machine": machine_info,
        "load_average_after": os.getloadavg(),
        "frames": total_frames,
        "episodes": len(refs),
        "frames_per_request": [int(r.num_frames) for r in requests[:1]],
        "annotated": summary.num_annotated,
        "failed": summary.num_failed,
        "decode_workers_used": len(summary.decode_workers_used),
        "seconds": times,
        "median_seconds": median,
        "cpu_seconds": cpu_times,
        "median_cpu_seconds": median_cpu,
        # inside the timed jobs: seconds and main-thread CPU seconds spent in reward.score
        "job_in_reward": in_reward,
        "median_job_in_reward": {name: statistics.median(values) for name, values in in_reward.items()},
        "frames_per_s": fps,
        "decode_frames_per_s_per_worker": fps["decode_one_worker"],
        "ratio_job_vs_reward": fps["job"] / fps["reward_alone"],
        # the ratio of each round's pair (they ran back to back), less sensitive to load drift
        "ratio_paired_median": statistics.median(r / j for r, j in zip(times["reward_alone"], times["job"])),
        # CPU time of the main process, reward alone / job: with decode processes, about the best
        # wall-clock ratio the job can reach, even where they have cores of their own
        "ratio_main_cpu": median_cpu["reward_alone"]["main"] / median_cpu["job"]["main"],
        "target": TARGET,
        "target_met": fps["job"] / fps["reward_alone"] >= TARGET,
        "check": check,
    }


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by this process (all its threads) and by its finished child processes
    (the decode workers of pools already shut down)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time(), children.ru_utime + children.ru_stime


def compare_outputs(output_dir: Path, decoded: list, requests: list, results: list) -> dict[str, Any]:
    """The job's per-frame progress (frames.parquet) against the reward-alone results, expanded to
    every source frame the way the job expands them."""
    import numpy as np
    import pyarrow.parquet as pq

    from vlm_rewards.subsample import expand_to_episode

    table = pq.read_table(Path(output_dir) / "frames.parquet").to_pandas()
    by_episode = {name: group["progress"].to_numpy(np.float64) for name, group in table.groupby("episode", sort=False)}
    max_diff, missing = 0.0, 0
    for episode, request, result in zip(decoded, requests, results):
        expected = expand_to_episode(result.progress, request.frame_index, episode.num_frames)
        got = by_episode.get(episode.ref.episode)
        if got is None or got.shape != expected.shape:
            missing += 1
            continue
        max_diff = max(max_diff, float(np.max(np.abs(got - expected))))
    return {"episodes": len(decoded), "missing": missing, "max_abs_diff": max_diff,
            "equal": missing == 0 and max_diff == 0.0}  # fmt: skip


def print_result(result: dict[str, Any], console: Console) -> None:
    config = result["config"]
    title = (f"annotation throughput ({config['preset']} RM, {config['device']}): {result['episodes']} videos x "
             f"{config['frames']} frames of {config['frame_size']}px, {config['workers']} {config['backend']} "
             f"decode workers, median of {config['repeats']}")  # fmt: skip
    table = Table(title=title)
    for column in ("measurement", "median s", "frames/s", "CPU s: main", "CPU s: workers"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    labels = {"job": "whole job (run_annotation, builds the reward)",
              "reward_alone": "reward alone (build + reward.score)",
              "reward_build": "reward build (load) alone",
              "decode_one_worker": "decode, one worker",
              "decode_pool": f"decode, pool of {config['workers']}",
              "pool_start": "decode pool start-up (spawn + import)"}  # fmt: skip
    for name, label in labels.items():
        frames_per_s, cpu = result["frames_per_s"].get(name), result["median_cpu_seconds"][name]
        table.add_row(label, f"{result['median_seconds'][name]:.3f}", f"{frames_per_s:,.0f}" if frames_per_s else "",
                      f"{cpu['main']:.2f}", f"{cpu['workers']:.2f}")  # fmt: skip
    console.print(table)
    verdict = "holds" if result["target_met"] else "does NOT hold"
    console.print(f"ratio job / reward alone: {result['ratio_job_vs_reward']:.3f} (paired median "
                  f"{result['ratio_paired_median']:.3f}); target >= {result['target']} {verdict}")  # fmt: skip
    console.print(f"main-process CPU seconds, reward alone / job: {result['ratio_main_cpu']:.3f}")
    in_reward = result["median_job_in_reward"]
    console.print(f"inside the job, reward.score took {in_reward['seconds']:.2f} s ({in_reward['cpu_seconds']:.2f} s "
                  f"CPU) of {result['median_seconds']['job']:.2f} s")  # fmt: skip
    console.print(f"outputs equal to reward alone: {result['check']['equal']} "
                  f"(max abs diff {result['check']['max_abs_diff']:.2e})")  # fmt: skip


def main(
    preset: Annotated[str, typer.Option(help="tiny | qwen2_5_vl_3b (random weights either way)")] = "tiny",
    num_videos: Annotated[int, typer.Option(min=1)] = 256,
    frames: Annotated[int, typer.Option(min=2, help="frames per video")] = 32,
    frame_size: Annotated[int | None, typer.Option(min=28, help="frame side; default 128 tiny, 224 3B")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="decode workers; default: the job's (cores - 1)")] = None,
    backend: Annotated[str, typer.Option(help="decode pool: process | thread")] = "process",
    batch_size: Annotated[int, typer.Option(min=1, help="episodes per reward call")] = 8,
    max_frames: Annotated[int, typer.Option(min=2, help="the RM's frame budget")] = 32,
    device: Annotated[str, typer.Option(help="cpu | cuda | auto")] = "cpu",
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16")] = "auto",
    repeats: Annotated[int, typer.Option(min=1)] = 3,
    report: Annotated[bool, typer.Option(help="also write the PNG/HTML report in the job")] = False,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads; 1 is steadier on a shared machine")] = None,
    num_layers: Annotated[int, typer.Option(min=1, help="tiny backbone layers")] = 2,
    seed: int = 0,
    output: Annotated[Path, typer.Option(help="where to write the JSON result")] = Path(
        "outputs/bench/annotate_throughput.json"
    ),
) -> None:
    """Time the whole annotation job against the reward alone on decoded frames, and decoding alone."""
    import transformers

    from bench._common import finish
    from vlm_rewards.annotation.config import DecodeConfig

    if preset not in FRAME_SIZES:
        raise typer.BadParameter(f"expected one of {', '.join(FRAME_SIZES)}", param_hint="--preset")
    if backend not in ("process", "thread"):
        raise typer.BadParameter("expected process or thread", param_hint="--backend")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    workers = workers or DecodeConfig().pool_size
    config = BenchConfig(preset=preset, num_videos=num_videos, frames=frames, frame_size=frame_size, workers=workers,
                         backend=backend, batch_size=batch_size, max_frames=max_frames, device=device, dtype=dtype,
                         repeats=repeats, report=report, threads=threads, num_layers=num_layers, seed=seed)  # fmt: skip
    with tempfile.TemporaryDirectory() as workdir:
        result = run_benchmark(config, Path(workdir))
    finish(result, output, print_result, passed=result["check"]["equal"])


if __name__ == "__main__":
    typer.run(main)
