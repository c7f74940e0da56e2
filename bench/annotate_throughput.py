"""Annotation throughput: the whole `vlmr annotate` job vs the reward model alone, and decode speed.

One run generates a folder of synthetic videos (H.264 .mp4, the test fixtures' `write_video`) and a
tiny trained-RM checkpoint (`build_tiny_backbone` + `RewardNetwork.from_backbone`, random weights:
the figures are speeds, not quality), used as `{kind: trained_rm, model: <folder>, device: cpu}`.
Then, interleaved over `--repeats` rounds (after `--warmup` rounds) so that background load hits
every measurement alike, it times:

- job: `run_annotation` on the folder, local engine, `--workers` decode workers, episodes scored in
  batches of `--batch-size`, writing shards and the merged tables into a fresh output folder (the
  report is off unless `--report`). The reward is built once beforehand and passed in, so loading
  the model is not timed; starting the decode pool is.
- reward alone: `reward.score` on the very requests the job builds (decoded once before timing,
  subsampled to the reward's frame budget, in the job's batches and order).
- decode alone: `decode_episode` on every video in this process, one after the other (frames/s of
  one worker), and through the job's decode pool with `--workers` workers (no scoring).

Frames/s counts source frames. The headline is the ratio job / reward alone (target >= 0.9): how
much of the reward model's speed the pipeline keeps. The job's per-frame outputs (frames.parquet)
are checked against the reward-alone values; the run exits with code 1 if they differ.

    .venv/bin/python bench/annotate_throughput.py --threads 1
    python bench/annotate_throughput.py --device cuda --dtype bfloat16   # GPU, the same tiny RM

A Qwen2.5-VL-3B-shaped RM (issue #10's GPU figure) is not built here yet: no GPU was available.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

# Heavy imports (torch, transformers, the package) live in the functions: decode workers are spawned
# processes, which re-import this script as their main module, and should start as light as the
# `vlmr` CLI's workers do, or the job would be timed with a start-up cost the CLI does not have.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `tests.annotation_fixtures` from a checkout

TARGET = 0.9
INSTRUCTION = "make the picture bright"


@dataclass
class BenchConfig:
    num_videos: int = 64
    frames: int = 32  # per video
    frame_size: int = 128  # square frames, pixels
    workers: int = 2
    backend: str = "process"
    batch_size: int = 8  # episodes per reward call (job) = trained_rm batch_size
    max_frames: int = 32  # the RM's frame budget; longer videos are subsampled
    device: str = "cpu"
    dtype: str = "auto"
    warmup: int = 1
    repeats: int = 3
    report: bool = False
    threads: int | None = None
    num_layers: int = 2  # tiny backbone depth
    seed: int = 0


def make_videos(root: Path, config: BenchConfig) -> Path:
    from tests.annotation_fixtures import ramp_frames, write_video

    root.mkdir(parents=True, exist_ok=True)
    for i in range(config.num_videos):
        write_video(root / f"video_{i:04d}.mp4", ramp_frames(config.frames, size=config.frame_size, seed=i))
    return root


def make_reward_model(folder: Path, config: BenchConfig) -> Path:
    import torch

    from vlm_rewards.models.backbones import build_tiny_backbone
    from vlm_rewards.models.reward_network import RewardNetwork, RewardNetworkConfig

    backbone = build_tiny_backbone("qwen2_5_vl", folder / "backbone", num_layers=config.num_layers, seed=config.seed)
    torch.manual_seed(config.seed)
    network = RewardNetwork.from_backbone(backbone, RewardNetworkConfig(max_frames=config.max_frames))
    network.save_pretrained(folder / "rm")
    return folder / "rm"


def annotate_config(config: BenchConfig, videos: Path, output_dir: Path):
    from vlm_rewards.annotation import AnnotateConfig

    return AnnotateConfig.model_validate(
        {
            "source": {"kind": "videos", "path": str(videos), "instruction": INSTRUCTION},
            "output_dir": str(output_dir),
            "batch_size": config.batch_size,
            "decode": {"workers": config.workers, "backend": config.backend},
            "report": {"enabled": config.report},
            "overwrite": True,
        }
    )


def machine() -> dict[str, Any]:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                    if line.startswith("model name")), cpu)  # fmt: skip
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_benchmark(config: BenchConfig, workdir: Path) -> dict[str, Any]:
    """Build the inputs in `workdir`, time job / reward alone / decode alone interleaved; the result dict."""
    import torch

    from vlm_rewards.annotation import run_annotation
    from vlm_rewards.annotation.decode import decode_episode
    from vlm_rewards.annotation.runner import DecodePool, decode_or_failure, make_pool
    from vlm_rewards.annotation.scoring import build_request, episode_budget
    from vlm_rewards.annotation.sources import iter_episodes
    from vlm_rewards.registry import build_reward
    from vlm_rewards.subsample import subsample_request

    if config.threads:
        torch.set_num_threads(config.threads)
    machine_info = machine()  # before this run adds to the load average
    videos = make_videos(workdir / "videos", config)
    rm_folder = make_reward_model(workdir, config)
    reward = build_reward(
        {
            "kind": "trained_rm",
            "model": str(rm_folder),
            "device": config.device,
            "dtype": config.dtype,
            "batch_size": config.batch_size,
        }  # fmt: skip
    )
    job_config = annotate_config(config, videos, workdir / "out")
    refs = list(iter_episodes(job_config.source))
    total_frames = config.num_videos * config.frames

    # the job's requests, decoded once: the same subsampling, batches and order as `run_local`
    decoded = [decode_episode(ref, job_config.sampling) for ref in refs]
    budget = episode_budget(reward.spec, job_config.sampling.max_frames)
    requests = [subsample_request(build_request(episode), budget) for episode in decoded]
    batches = [requests[i : i + config.batch_size] for i in range(0, len(requests), config.batch_size)]

    def job() -> Any:
        shutil.rmtree(job_config.output_dir, ignore_errors=True)
        summary = run_annotation(job_config, reward=reward)
        _sync()
        return summary

    def reward_alone() -> list:
        results = [result for batch in batches for result in reward.score(batch)]
        _sync()
        return results

    def decode_serial() -> None:
        for ref in refs:
            decode_episode(ref, job_config.sampling)

    task = functools.partial(decode_or_failure, sampling=job_config.sampling)
    window = max(config.batch_size, config.workers * job_config.decode.prefetch)

    def decode_pool() -> None:
        make = functools.partial(make_pool, config.workers, config.backend)
        with DecodePool(make, task, window, lambda ref, error: None) as pool:
            for _ in pool.map(refs):
                pass

    def pool_start() -> None:  # the job's fixed start-up: workers spawned and ready, one tiny decode each
        make = functools.partial(make_pool, config.workers, config.backend)
        with DecodePool(make, task, window, lambda ref, error: None) as pool:
            for _ in pool.map(refs[: config.workers]):
                pass

    phases = {"job": job, "reward_alone": reward_alone, "decode_one_worker": decode_serial,
              "decode_pool": decode_pool, "pool_start": pool_start}  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in phases}
    outputs: dict[str, Any] = {}
    for round_index in range(config.warmup + config.repeats):
        for name, phase in phases.items():
            start = time.perf_counter()
            outputs[name] = phase()
            elapsed = time.perf_counter() - start
            if round_index >= config.warmup:
                times[name].append(elapsed)

    summary = outputs["job"]
    check = compare_outputs(job_config.output_dir, decoded, requests, outputs["reward_alone"])
    median = {name: statistics.median(values) for name, values in times.items()}
    fps = {name: total_frames / seconds for name, seconds in median.items() if name != "pool_start"}
    ratio = fps["job"] / fps["reward_alone"]
    # the ratio of each round's pair (job and reward alone ran back to back), less sensitive to load drift
    paired = [r / j for j, r in zip(times["job"], times["reward_alone"])]
    return {
        "config": asdict(config),
        "machine": machine_info,
        "frames": total_frames,
        "episodes": len(refs),
        "frames_per_request": [int(r.num_frames) for r in requests[:1]],
        "annotated": summary.num_annotated,
        "failed": summary.num_failed,
        "decode_workers_used": len(summary.decode_workers_used),
        "seconds": times,
        "median_seconds": median,
        "frames_per_s": fps,
        "decode_frames_per_s_per_worker": fps["decode_one_worker"],
        "ratio_job_vs_reward": ratio,
        "ratio_paired_median": statistics.median(paired),
        # the job less its one-off pool start-up: the ratio a much longer job tends to
        "ratio_without_pool_start": median["reward_alone"] / (median["job"] - median["pool_start"]),
        "target": TARGET,
        "target_met": ratio >= TARGET,
        "check": check,
    }


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
    title = (f"annotation throughput: {result['episodes']} videos x {config['frames']} frames of "
             f"{config['frame_size']}px, {config['workers']} {config['backend']} decode workers")  # fmt: skip
    table = Table(title=title)
    for column in ("measurement", "median s", "frames/s"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    labels = {"job": "whole job (run_annotation)", "reward_alone": "reward alone (reward.score)",
              "decode_one_worker": "decode, one worker",
              "decode_pool": f"decode, pool of {config['workers']}"}  # fmt: skip
    for name, label in labels.items():
        table.add_row(label, f"{result['median_seconds'][name]:.3f}", f"{result['frames_per_s'][name]:,.0f}")
    table.add_row("decode pool start-up (spawn + import)", f"{result['median_seconds']['pool_start']:.3f}", "")
    console.print(table)
    verdict = "holds" if result["target_met"] else "does NOT hold"
    console.print(f"ratio job / reward alone: {result['ratio_job_vs_reward']:.3f} (paired median "
                  f"{result['ratio_paired_median']:.3f}; without the pool start-up "
                  f"{result['ratio_without_pool_start']:.3f}); target >= {result['target']} {verdict}")  # fmt: skip
    console.print(f"outputs equal to reward alone: {result['check']['equal']} "
                  f"(max abs diff {result['check']['max_abs_diff']:.2e})")  # fmt: skip


def main(
    num_videos: Annotated[int, typer.Option(min=1)] = 64,
    frames: Annotated[int, typer.Option(min=2, help="frames per video")] = 32,
    frame_size: Annotated[int, typer.Option(min=28, help="frame side in pixels")] = 128,
    workers: Annotated[int, typer.Option(min=1, help="decode workers")] = 2,
    backend: Annotated[str, typer.Option(help="decode pool: process | thread")] = "process",
    batch_size: Annotated[int, typer.Option(min=1, help="episodes per reward call")] = 8,
    max_frames: Annotated[int, typer.Option(min=2, help="the RM's frame budget")] = 32,
    device: Annotated[str, typer.Option(help="cpu | cuda | auto")] = "cpu",
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16")] = "auto",
    warmup: Annotated[int, typer.Option(min=0)] = 1,
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

    from vlm_rewards.io import write_json

    if backend not in ("process", "thread"):
        raise typer.BadParameter("expected process or thread", param_hint="--backend")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    config = BenchConfig(num_videos=num_videos, frames=frames, frame_size=frame_size, workers=workers,
                         backend=backend, batch_size=batch_size, max_frames=max_frames, device=device, dtype=dtype,
                         warmup=warmup, repeats=repeats, report=report, threads=threads, num_layers=num_layers,
                         seed=seed)  # fmt: skip
    with tempfile.TemporaryDirectory() as workdir:
        result = run_benchmark(config, Path(workdir))
    console = Console()
    print_result(result, console)
    write_json(output, result)
    console.print(f"wrote {output}")
    if not result["check"]["equal"]:
        raise typer.Exit(code=1)


if __name__ == "__main__":
    typer.run(main)
