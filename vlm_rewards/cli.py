"""`vlmr`: one console script for every job. Each job takes `[CONFIG.yaml] [dotted.key=value ...]`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console

from vlm_rewards.config import JobConfig, dump_config, load_job_config

app = typer.Typer(
    help="vlm-rewards: VLM progress and preference reward models behind one reward interface.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()

JobArgs = Annotated[
    list[str] | None,
    typer.Argument(help="An optional YAML config, then dotted.key=value overrides.", show_default=False),
]


def split_job_args(args: list[str] | None) -> tuple[Path | None, list[str]]:
    """The first argument is the config file unless it is an override (contains '=')."""
    args = list(args or [])
    if args and "=" not in args[0]:
        return Path(args[0]), args[1:]
    return None, args


@contextmanager
def clean_errors() -> Iterator[None]:
    """A bad config or bad input ends the job with its message and exit code 2, not a traceback."""
    try:
        yield
    except ValueError as error:
        console.print(f"[bold red]error:[/] {error}")
        raise typer.Exit(code=2) from None


def run_config_job(config_model: type[JobConfig], run: Callable[[JobConfig, Console], object], args) -> None:
    with clean_errors():
        config = load_job_config(config_model, *split_job_args(args))
        console.print(dump_config(config))
        run(config, console)


@app.command()
def demo(args: JobArgs = None) -> None:
    """Score synthetic clips of four policies with a configured reward; print a table and save a plot."""
    from vlm_rewards.demo import DemoConfig, run_demo

    run_config_job(DemoConfig, run_demo, args)


@app.command("train-rm")
def train_rm(args: JobArgs = None) -> None:
    """Train a progress or preference reward model (tiny from scratch by default; LoRA/bf16/accelerate)."""
    from vlm_rewards.training.config import TrainRMConfig
    from vlm_rewards.training.train import run_training

    run_config_job(TrainRMConfig, run_training, args)


@app.command("eval-rm")
def eval_rm(args: JobArgs = None) -> None:
    """Evaluate any reward: VOC (expert, reversed, random), success AUC, instruction use, pair accuracy."""
    from vlm_rewards.evaluation.evaluate import EvalRMConfig, run_eval

    run_config_job(EvalRMConfig, run_eval, args)


@app.command()
def score(
    reward: Annotated[str, typer.Argument(help="Reward YAML path or a name in configs/rewards/.")],
    clips: Annotated[list[Path], typer.Argument(help="Clips to score: .npz (key 'frames'), .mp4, .png or .jpg.")],
    text: Annotated[str, typer.Option(help="The instruction or prompt, the same for every clip.")],
    reference: Annotated[Path | None, typer.Option(help="Optional goal/reference image or clip.")] = None,
) -> None:
    """Score clips with a reward and print one JSON line per clip."""
    from vlm_rewards.interface import RewardRequest
    from vlm_rewards.media import read_clip
    from vlm_rewards.registry import build_reward

    with clean_errors():
        model = build_reward(reward)
        goal = read_clip(reference) if reference else None
        requests = [RewardRequest(read_clip(path), text, reference=goal) for path in clips]
        for path, result in zip(clips, model.score(requests)):
            progress = None if result.progress is None else np.round(result.progress, 4).tolist()
            aux = {key: value for key, value in result.aux.items() if isinstance(value, int | float | str)}
            print(json.dumps({"clip": str(path), "reward": result.reward, "progress": progress, "aux": aux}))


@app.command()
def rewards() -> None:
    """List the reward kinds and the reward configs shipped in configs/rewards/."""
    from vlm_rewards.registry import REWARDS_DIR, known_kinds

    console.print("[bold]kinds:[/] " + ", ".join(known_kinds()))
    for path in sorted(REWARDS_DIR.glob("*.yaml")):
        console.print(f"  {path.stem:<28} {path}")


if __name__ == "__main__":
    app()
