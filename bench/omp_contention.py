"""A CPU torch job beside one busy process: OpenMP's default spin-waiting against `OMP_WAIT_POLICY=PASSIVE`.

Each condition runs the same small training loop (an MLP's forward, backward and AdamW step, the shape of a
tiny model's step) in a fresh interpreter, since the OpenMP runtime reads its settings once, when torch
loads. "busy" starts one single-threaded process that spins for the whole measurement, as a second job on
a 2-core machine does. `vlmr` sets `OMP_WAIT_POLICY=PASSIVE` unless the user set it (vlm_rewards/cli.py).

    .venv/bin/python bench/omp_contention.py                 # about a minute on 2 cores
    .venv/bin/python bench/omp_contention.py --steps 5 --width 128   # the reduced run the tests use

Prints seconds per step for each condition and the ratios; writes the JSON to --output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

WORKLOAD = """
import json, sys, time, torch
steps, width = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(*(layer for _ in range(4) for layer in (torch.nn.Linear(width, width), torch.nn.GELU())))
optimizer = torch.optim.AdamW(model.parameters())
batch = torch.randn(256, width)

def step():
    optimizer.zero_grad()
    model(batch).square().mean().backward()
    optimizer.step()

step()  # warm-up: allocations and the OpenMP thread pool
start = time.perf_counter()
for _ in range(steps):
    step()
print(json.dumps({"seconds_per_step": (time.perf_counter() - start) / steps, "threads": torch.get_num_threads()}))
"""
SPIN = "while True: pass"
WAIT_POLICIES = {"default": None, "passive": "PASSIVE"}


def run_workload(steps: int, width: int, wait_policy: str | None) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy
    command = [sys.executable, "-c", WORKLOAD, str(steps), str(width)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(completed.stdout)


def measure(steps: int, width: int) -> dict:
    results = {}
    for load in ("quiet", "busy"):
        spinner = subprocess.Popen([sys.executable, "-c", SPIN]) if load == "busy" else None
        try:
            for policy, value in WAIT_POLICIES.items():
                results[f"{load}/{policy}"] = run_workload(steps, width, value)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    seconds = {name: result["seconds_per_step"] for name, result in results.items()}
    return {
        "cpus": os.cpu_count(),
        "steps": steps,
        "width": width,
        "conditions": results,
        "busy_slowdown_default": seconds["busy/default"] / seconds["quiet/default"],
        "busy_slowdown_passive": seconds["busy/passive"] / seconds["quiet/passive"],
        "busy_default_over_passive": seconds["busy/default"] / seconds["busy/passive"],
        "quiet_passive_over_default": seconds["quiet/passive"] / seconds["quiet/default"],
    }


def main(
    steps: Annotated[int, typer.Option(help="Timed training steps per condition.")] = 40,
    width: Annotated[int, typer.Option(help="Width of the MLP's layers.")] = 512,
    output: Annotated[Path, typer.Option(help="Where the JSON goes.")] = Path("outputs/bench/omp_contention.json"),
) -> None:
    result = measure(steps, width)
    for name, condition in result["conditions"].items():
        print(f"{name:<16} {condition['seconds_per_step'] * 1e3:8.2f} ms/step  ({condition['threads']} threads)")
    for key in ("busy_slowdown_default", "busy_slowdown_passive", "busy_default_over_passive"):
        print(f"{key:<28} {result[key]:.2f}x")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    typer.run(main)
