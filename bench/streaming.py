"""Streaming (KV-cached) progress scoring vs prefix rescoring, per RL step.

An RL env adds one frame per step and wants the progress of the newest frame. Two ways:

- prefix rescoring: at step t, score the whole prefix frames[:t] in one forward (`encode` + `predict`,
  what a user without a session does; `RescoringSession` does the same). Step t costs O(t) tokens,
  an episode of T steps O(T²).
- streaming: `KVCacheSession.append` with the one new frame: one forward over that frame's tokens on
  top of the cached prefix. Step t costs O(1) tokens (plus attention over the cache, O(t) but small).

One episode of `max(lengths)` steps is run per repeat, the two methods interleaved step by step so
that load from other jobs hits both alike; each step's time is the median over repeats. Reported per
T in `lengths`: the per-step seconds at step T, their ratio, and the total over steps 1..T. Both
include input building (resizing, processor). The streamed values are checked against rescoring's.

Models have random weights (nothing is downloaded): the figures are speeds, not quality. On a
shared CPU only the ratios mean much; pass `--threads 1`.

    .venv/bin/python bench/streaming.py --threads 1
    .venv/bin/python bench/streaming.py --family qwen3_vl --frame-size 224 --lengths 8,16,32
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import transformers
import typer
from rich.console import Console
from rich.table import Table

from vlm_rewards.interface import RewardRequest
from vlm_rewards.models.backbones import FAMILIES, build_tiny_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.models.streaming import KVCacheSession

try:  # run as a script: bench/ is on sys.path
    from _common import finish, machine
except ModuleNotFoundError:  # imported as `bench.streaming` (the tests)
    from bench._common import finish, machine

TOLERANCE = 1e-4  # largest |streamed − rescored| progress accepted as the same output (float32)
TEXT = "pick up the red block and place it on the green plate"


def run_benchmark(
    workdir: Path,
    *,
    family: str = "qwen2_5_vl",
    lengths: tuple[int, ...] = (8, 16, 32, 64, 128),
    streams: int = 1,
    frame_size: int = 112,
    repeats: int = 3,
    threads: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    machine_info = machine()  # before this run adds to the load average
    steps = max(lengths)
    folder = build_tiny_backbone(family, workdir / family)
    torch.manual_seed(seed)
    network = RewardNetwork.from_backbone(folder, RewardNetworkConfig(max_frames=steps)).eval()
    rng = np.random.default_rng(seed)
    clips = [rng.integers(0, 256, (steps, frame_size, frame_size, 3), dtype=np.uint8) for _ in range(streams)]
    texts = [TEXT] * streams

    def rescore(t: int) -> np.ndarray:
        with torch.inference_mode():
            batch = network.encode([RewardRequest(clip[:t], text) for clip, text in zip(clips, texts)])
            return network.predict(batch)[:, t - 1].float().numpy()

    # warm-up: a few steps of each
    warm = KVCacheSession(network, texts)
    for t in range(1, 4):
        warm.append([clip[t - 1 : t] for clip in clips])
        rescore(t)

    stream_times = np.zeros((repeats, steps))
    rescore_times = np.zeros((repeats, steps))
    open_times = []
    max_diff = 0.0
    for repeat in range(repeats):
        start = time.perf_counter()
        session = KVCacheSession(network, texts)
        open_times.append(time.perf_counter() - start)
        for t in range(1, steps + 1):
            start = time.perf_counter()
            streamed = session.append([clip[t - 1 : t] for clip in clips])
            stream_times[repeat, t - 1] = time.perf_counter() - start
            start = time.perf_counter()
            rescored = rescore(t)
            rescore_times[repeat, t - 1] = time.perf_counter() - start
            max_diff = max(max_diff, float(np.abs(np.concatenate(streamed) - rescored).max()))
        session.close()

    stream_step = np.median(stream_times, axis=0)
    rescore_step = np.median(rescore_times, axis=0)
    with torch.inference_mode():
        tokens = network.encode([RewardRequest(clips[0][:2], TEXT)]).model_inputs["input_ids"].shape[1]
        tokens_one = network.encode([RewardRequest(clips[0][:1], TEXT)]).model_inputs["input_ids"].shape[1]
    rows = []
    for length in lengths:
        stream_total = float(stream_step[:length].sum()) + statistics.median(open_times)
        rescore_total = float(rescore_step[:length].sum())
        rows.append(
            {
                "T": length,
                "stream_step_s": float(stream_step[length - 1]),
                "rescore_step_s": float(rescore_step[length - 1]),
                "step_ratio": float(rescore_step[length - 1] / stream_step[length - 1]),
                "stream_episode_s": stream_total,
                "rescore_episode_s": rescore_total,
                "episode_ratio": rescore_total / stream_total,
            }
        )
    return {
        "config": {
            "family": family,
            "lengths": list(lengths),
            "streams": streams,
            "frame_size": frame_size,
            "tokens_per_frame": tokens - tokens_one,  # image pads + vision start/end
            "repeats": repeats,
            "threads": threads,
            "seed": seed,
            "weights": "random (tiny model; speed only)",
        },
        "machine": machine_info,
        "session_open_s": statistics.median(open_times),
        "rows": rows,
        "max_abs_diff": max_diff,
        "streaming_matches": max_diff <= TOLERANCE,
    }


def print_result(result: dict[str, Any], console: Console) -> None:
    config = result["config"]
    table = Table(
        title=(
            f"streaming vs prefix rescoring: {config['family']} tiny, {config['frame_size']} px "
            f"({config['tokens_per_frame']} tokens/frame), {config['streams']} stream(s), "
            f"{config['threads'] or 'default'} thread(s)"
        )
    )
    for column in ("T", "stream step s", "rescore step s", "step ratio", "stream episode s", "rescore episode s",
                   "episode ratio"):  # fmt: skip
        table.add_column(column, justify="right")
    for row in result["rows"]:
        table.add_row(
            str(row["T"]),
            f"{row['stream_step_s']:.4f}",
            f"{row['rescore_step_s']:.4f}",
            f"{row['step_ratio']:.1f}",
            f"{row['stream_episode_s']:.3f}",
            f"{row['rescore_episode_s']:.3f}",
            f"{row['episode_ratio']:.1f}",
        )
    console.print(table)
    console.print(
        f"session open (prefix) {result['session_open_s']:.4f} s, included in the stream episode; "
        f"max |streamed − rescored| = {result['max_abs_diff']:.2e}"
    )


def main(
    family: Annotated[str, typer.Option(help=" | ".join(FAMILIES))] = "qwen2_5_vl",
    lengths: Annotated[str, typer.Option(help="episode lengths T to report, comma-separated")] = "8,16,32,64,128",
    streams: Annotated[int, typer.Option(min=1, help="envs per session (one batched append per step)")] = 1,
    frame_size: Annotated[int, typer.Option(help="frame side in pixels (112: 16 tokens per frame)")] = 112,
    repeats: Annotated[int, typer.Option(min=1, help="episodes per method; each step's time is the median")] = 3,
    threads: Annotated[int | None, typer.Option(help="CPU threads; 1 is steadier on a shared machine")] = None,
    seed: int = 0,
    output: Annotated[Path, typer.Option(help="where to write the JSON result")] = Path("outputs/bench/streaming.json"),
) -> None:
    """Time per-step KV-cached streaming against rescoring the whole prefix, for several episode lengths."""
    if family not in FAMILIES:
        raise typer.BadParameter(f"expected one of {', '.join(FAMILIES)}", param_hint="--family")
    try:
        parsed = tuple(sorted({int(value) for value in lengths.split(",")}))
    except ValueError:
        message = f"expected comma-separated integers, got {lengths!r}"
        raise typer.BadParameter(message, param_hint="--lengths") from None
    if not parsed or parsed[0] < 1:
        raise typer.BadParameter("expected positive lengths", param_hint="--lengths")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as workdir:
        result = run_benchmark(
            Path(workdir),
            family=family,
            lengths=parsed,
            streams=streams,
            frame_size=frame_size,
            repeats=repeats,
            threads=threads,
            seed=seed,
        )
    finish(result, output, print_result, passed=result["streaming_matches"])


if __name__ == "__main__":
    typer.run(main)
