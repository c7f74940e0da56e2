"""Load test of the reward server on loopback: concurrent clients with dynamic batching against the same
requests sent one at a time without batching.

    python bench/serve_load.py --output outputs/bench/serve_load.json

Starts a local Ray instance and two Serve applications of the same reward: `/batched` (serve.batch up
to --max-batch-size items, waiting --wait-ms) and `/unbatched` (max batch size 1). Then

1. `--clients` concurrent `RemoteReward` clients (asyncio, httpx) each send `--requests-per-client`
   one-item requests to /batched: errors, p50/p99 latency, throughput, achieved mean batch size
   (from the replica's /metrics);
2. the same requests, one at a time from one client, to /unbatched: throughput (the baseline);
3. the same concurrent load against /unbatched (how much of the gain is batching, not concurrency).

Every result is compared with the in-process reward (exact). Bounded: each phase has --time-limit
seconds. Writes JSON with the figures and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import socket
import time
from pathlib import Path

import numpy as np

from vlm_rewards.interface import RewardRequest, SampleKey
from vlm_rewards.registry import build_reward
from vlm_rewards.serving.client import RemoteReward


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reward", default="goal_pixel_progress")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=8)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--side", type=int, default=64, help="frame side in pixels")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--wait-ms", type=float, default=5.0)
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray instance")
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds per phase at most")
    parser.add_argument("--output", type=Path, default=Path("outputs/bench/serve_load.json"))
    return parser.parse_args()


def make_requests(count: int, frames: int, side: int) -> list[RewardRequest]:
    rng = np.random.default_rng(0)
    return [
        RewardRequest(
            frames=rng.integers(0, 256, (frames, side, side, 3), dtype=np.uint8),
            text="move the red circle to the top left",
            reference=rng.integers(0, 256, (1, side, side, 3), dtype=np.uint8),
            key=SampleKey("bench", i),
        )
        for i in range(count)
    ]


def same(a, b) -> bool:
    return a.reward == b.reward and (a.progress is None or np.array_equal(a.progress, b.progress))


async def concurrent_phase(url: str, requests, expected, clients: int, time_limit: float) -> dict:
    rewards = [RemoteReward(url, retries=3, backoff=0.05) for _ in range(clients)]
    attempts_before = sum(r.attempts for r in rewards)
    latencies, errors, mismatches = [], [], 0

    async def client(index: int) -> None:
        nonlocal mismatches
        for i in range(index, len(requests), clients):
            start = time.perf_counter()
            try:
                (result,) = await rewards[index].ascore([requests[i]])
            except Exception as error:  # noqa: BLE001 - counted and reported
                errors.append(f"{type(error).__name__}: {error}")
                continue
            latencies.append(time.perf_counter() - start)
            mismatches += not same(result, expected[i])

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(clients))), timeout=time_limit)
    wall = time.perf_counter() - start
    return summary(len(requests), latencies, errors, mismatches, wall) | {
        "clients": clients,
        "retries": sum(r.attempts for r in rewards) - attempts_before - len(latencies) - len(errors),
    }


def sequential_phase(url: str, requests, expected, time_limit: float) -> dict:
    reward = RemoteReward(url, retries=3, backoff=0.05)
    latencies, errors, mismatches = [], [], 0
    start = time.perf_counter()
    for request, wanted in zip(requests, expected):
        if time.perf_counter() - start > time_limit:
            errors.append("time limit")
            break
        begin = time.perf_counter()
        try:
            (result,) = reward.score([request])
        except Exception as error:  # noqa: BLE001
            errors.append(f"{type(error).__name__}: {error}")
            continue
        latencies.append(time.perf_counter() - begin)
        mismatches += not same(result, wanted)
    return summary(len(requests), latencies, errors, mismatches, time.perf_counter() - start) | {"clients": 1}


def summary(count: int, latencies: list[float], errors: list[str], mismatches: int, wall: float) -> dict:
    ms = np.asarray(latencies) * 1e3
    return {
        "requests": count,
        "completed": len(latencies),
        "errors": len(errors),
        "error_samples": errors[:5],
        "mismatches_vs_in_process": mismatches,
        "wall_s": wall,
        "throughput_rps": len(latencies) / wall,
        "latency_ms": {
            "p50": float(np.percentile(ms, 50)) if ms.size else None,
            "p99": float(np.percentile(ms, 99)) if ms.size else None,
            "mean": float(ms.mean()) if ms.size else None,
        },
    }


def batch_counts(url: str) -> tuple[int, int]:
    import httpx

    batches = httpx.get(f"{url}/metrics", timeout=10).json()["batches"]
    return batches["count"], batches["items"]


def main() -> None:
    args = parse_args()
    import ray
    from ray import serve

    from vlm_rewards.serving.config import ServeConfig
    from vlm_rewards.serving.server import build_app

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    base = f"http://127.0.0.1:{port}"
    for name, batch_size in (("batched", args.max_batch_size), ("unbatched", 1)):
        config = ServeConfig(
            reward=args.reward,
            port=port,
            batching={"max_batch_size": batch_size, "wait_timeout_s": args.wait_ms / 1e3},
            replicas={"count": args.replicas, "num_cpus": 0.5},
        )
        serve.run(build_app(config), name=name, route_prefix=f"/{name}", blocking=False)
    total = args.clients * args.requests_per_client
    requests = make_requests(total, args.frames, args.side)
    expected = build_reward(args.reward).score(requests)
    figures: dict = {}
    try:
        single = args.replicas == 1  # /metrics is per replica: exact batch sizes with one replica
        before = batch_counts(f"{base}/batched") if single else None
        figures["batched_concurrent"] = asyncio.run(
            concurrent_phase(f"{base}/batched", requests, expected, args.clients, args.time_limit)
        )
        if single:
            after = batch_counts(f"{base}/batched")
            batches, items = after[0] - before[0], after[1] - before[1]
            figures["batched_concurrent"]["mean_batch_size"] = items / batches if batches else None
        figures["unbatched_sequential"] = sequential_phase(f"{base}/unbatched", requests, expected, args.time_limit)
        figures["unbatched_concurrent"] = asyncio.run(
            concurrent_phase(f"{base}/unbatched", requests, expected, args.clients, args.time_limit)
        )
    finally:
        serve.shutdown()
        ray.shutdown()
    batched = figures["batched_concurrent"]["throughput_rps"]
    report = {
        "command": "python bench/serve_load.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "output"),
        "machine": {"cpus": args.num_cpus, "platform": platform.platform(), "python": platform.python_version()},
        "settings": {k: str(v) for k, v in vars(args).items()},
        "figures": figures,
        "ratios": {
            "batched_concurrent_vs_unbatched_sequential": batched / figures["unbatched_sequential"]["throughput_rps"],
            "batched_concurrent_vs_unbatched_concurrent": batched / figures["unbatched_concurrent"]["throughput_rps"],
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2))
    print(json.dumps({"figures": figures, "ratios": report["ratios"]}, indent=2))
    print(f"wrote {args.output}")
    errors = sum(phase["errors"] + phase["mismatches_vs_in_process"] for phase in figures.values())
    raise SystemExit(1 if errors else 0)


if __name__ == "__main__":
    main()
