"""`vlmr`: one console script for every job. Each job takes `[CONFIG.yaml] [dotted.key=value ...]`.

The CLI is the presentation layer: library code reports through `logging` and takes an optional
progress wrapper `track(iterable, description)`; here logging goes to a rich handler on stderr and
`tqdm_track` draws the progress bars. Bad input ends a job with exit code 2 and a message naming the
file or key; `score` skips a bad clip, reports it and exits 2 after scoring the others.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vlm_rewards.config import JobConfig, dump_config, load_job_config

app = typer.Typer(
    help="vlm-rewards: VLM progress and preference reward models behind one reward interface.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)
# OpenMP threads that wait for work spin on their core by default. When another process holds one of the
# few cores, every parallel region then waits for a spinning thread that is not scheduled: a CPU job ran
# 11x slower beside one busy process (bench/omp_contention.py). Passive waiting costs nothing measurable
# on an idle machine. Set before a job loads torch (its OpenMP runtime reads the variable once, and child
# processes inherit it); a value the user set is kept.
THREAD_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
ItemT = TypeVar("ItemT")

JobArgs = Annotated[
    list[str] | None,
    typer.Argument(help="An optional YAML config, then dotted.key=value overrides.", show_default=False),
]


@app.callback()
def main(
    log_level: Annotated[
        str, typer.Option(help="Lowest level of library log messages shown on stderr: debug, info, warning, error.")
    ] = "info",
) -> None:
    """vlm-rewards: VLM progress and preference reward models behind one reward interface."""
    set_thread_defaults()
    if log_level.lower() not in LOG_LEVELS:
        raise typer.BadParameter(f"{log_level!r}; expected one of {', '.join(LOG_LEVELS)}", param_hint="--log-level")
    configure_logging(LOG_LEVELS[log_level.lower()])


def set_thread_defaults(environ: MutableMapping[str, str] = os.environ) -> None:
    """Fill in `THREAD_DEFAULTS` where the environment leaves them unset."""
    for name, value in THREAD_DEFAULTS.items():
        environ.setdefault(name, value)


def configure_logging(level: int = logging.INFO) -> None:
    """Show the library's `logging` records (logger `vlm_rewards` and below) on stderr through rich."""
    from rich.logging import RichHandler

    logger = logging.getLogger("vlm_rewards")
    logger.setLevel(level)
    if not any(getattr(handler, "_vlmr_cli", False) for handler in logger.handlers):
        handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=False, markup=False)
        handler._vlmr_cli = True
        logger.addHandler(handler)
    logger.propagate = False  # shown once, by the handler above


def tqdm_track(iterable: Iterable[ItemT], description: str = "", total: int | None = None) -> Iterable[ItemT]:
    """The CLI's progress wrapper for library loops (`track=` arguments): a tqdm bar on stderr.

    Without tqdm installed (it comes with the `training` extra) the iterable is returned unchanged.
    """
    try:
        from tqdm.auto import tqdm
    except ModuleNotFoundError:
        return iterable
    return tqdm(iterable, desc=description or None, total=total, dynamic_ncols=True, leave=False)


def report_error(message: object) -> None:
    err_console.print(f"[bold red]error:[/] {escape(str(message))}")


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
        report_error(error)
        raise typer.Exit(code=2) from None


def run_config_job(config_model: type[JobConfig], run: Callable[[JobConfig], object], args) -> None:
    with clean_errors():
        config = load_job_config(config_model, *split_job_args(args))
        console.print(dump_config(config))
        run(config)


@app.command()
def demo(args: JobArgs = None) -> None:
    """Score synthetic clips of four policies with a configured reward; print a table and save a plot."""
    from vlm_rewards.demo import DemoConfig, run_demo

    run_config_job(DemoConfig, lambda config: console.print(policy_table(run_demo(config))), args)


def metrics_table(metrics: dict) -> Table:
    """The float metrics of an evaluation."""
    table = Table("metric", "value", title=f"{metrics['reward']} ({metrics['version']})")
    for key, value in metrics.items():
        if isinstance(value, float):
            table.add_row(key, f"{value:.3f}")
    return table


def policy_table(results: dict[str, list]) -> Table:
    """Mean reward (and mean of each component) per policy of the demo."""
    import numpy as np

    components = sorted({name for batch in results.values() for result in batch for name in result.components})
    table = Table("policy", "mean reward", "std", *components, title="reward by policy (higher should be better)")
    for policy, batch in results.items():
        rewards = np.array([result.reward for result in batch])
        means = [f"{np.mean([result.components.get(name, np.nan) for result in batch]):.3f}" for name in components]
        table.add_row(policy, f"{rewards.mean():.3f}", f"{rewards.std():.3f}", *means)
    return table


@app.command("train-rm")
def train_rm(args: JobArgs = None) -> None:
    """Train a progress or preference reward model (from the shipped backbone by default; LoRA, bf16, accelerate)."""
    from vlm_rewards.training.config import TrainRMConfig
    from vlm_rewards.training.train import run_training

    run_config_job(TrainRMConfig, lambda config: run_training(config, tqdm_track), args)


@app.command("eval-rm")
def eval_rm(args: JobArgs = None) -> None:
    """Evaluate any reward: VOC (expert, reversed, random), success AUC, instruction use, pair accuracy."""
    from vlm_rewards.evaluation.config import EvalRMConfig
    from vlm_rewards.evaluation.evaluate import run_eval

    run_config_job(EvalRMConfig, lambda config: console.print(metrics_table(run_eval(config, tqdm_track))), args)


@app.command()
def score(
    reward: Annotated[str, typer.Argument(help="Reward YAML path or a name in configs/rewards/.")],
    clips: Annotated[list[Path], typer.Argument(help="Clips to score: .npz (key 'frames'), .mp4, .png or .jpg.")],
    text: Annotated[str, typer.Option(help="The instruction or prompt, the same for every clip.")],
    reference: Annotated[Path | None, typer.Option(help="Optional goal/reference image or clip.")] = None,
) -> None:
    """Score clips with a reward and print one JSON line per clip (`RewardResult.to_json()` plus "clip").

    A clip that cannot be read or that the reward rejects is skipped: its line has "reward": null and
    an "error", the message also goes to stderr, and the job exits with code 2 after the other clips.
    A bad reward config or reference ends the job at once (exit code 2).
    """
    from vlm_rewards.interface import RewardRequest, score_each, validate_request
    from vlm_rewards.media import read_clip
    from vlm_rewards.registry import build_reward

    with clean_errors():
        model = build_reward(reward)
        goal = read_clip(reference) if reference else None
    lines: list[dict | None] = [None] * len(clips)
    failed: list[Path] = []

    def skip(index: int, error: ValueError) -> None:
        path = clips[index]
        message = str(error) if str(error).startswith(str(path)) else f"{path}: {error}"
        report_error(message)
        failed.append(path)
        lines[index] = {"clip": str(path), "reward": None, "progress": None, "components": {}, "info": {}}
        lines[index]["error"] = message

    good: list[tuple[int, RewardRequest]] = []
    for index, path in enumerate(clips):
        try:
            request = RewardRequest(read_clip(path), text, reference=goal)
            validate_request(request, model.spec, "clip")
        except ValueError as error:
            skip(index, error)
            continue
        good.append((index, request))
    if good:
        for (index, _), outcome in zip(good, score_each(model, [request for _, request in good])):
            if isinstance(outcome, ValueError):
                skip(index, outcome)
            else:
                lines[index] = {"clip": str(clips[index]), **outcome.to_json()}
    for line in lines:
        typer.echo(json.dumps(line, allow_nan=False))
    if failed:
        report_error(f"{len(failed)} of {len(clips)} clips could not be scored: {', '.join(map(str, failed))}")
        raise typer.Exit(code=2)


@app.command()
def rewards() -> None:
    """List the reward kinds and the reward configs shipped in configs/rewards/."""
    from vlm_rewards.registry import REWARDS_DIR, known_kinds

    console.print("[bold]kinds:[/] " + ", ".join(known_kinds()))
    for path in sorted(REWARDS_DIR.glob("*.yaml")):
        console.print(f"  {path.stem:<28} {path}")


@app.command("serve")
def serve_reward(args: JobArgs = None) -> None:
    """Serve a reward over HTTP on Ray Serve (dynamic batching, replicas): `vlmr serve REWARD [key=value ...]`."""
    from vlm_rewards.registry import check_reward_config
    from vlm_rewards.serving.config import ServeConfig, serve_job_args

    def run(config: ServeConfig) -> None:
        check_reward_config(config.reward)  # before ray and the server load
        from vlm_rewards.serving.server import run_serve

        run_serve(config)

    with clean_errors():
        job_args = serve_job_args(args)
    run_config_job(ServeConfig, run, job_args)


@app.command()
def annotate(args: JobArgs = None) -> None:
    """Annotate a video folder, a LeRobot v3 dataset or an episode dataset with per-frame progress/reward.

    Resumable (a re-run does only what is missing), local or on Ray (`engine: ray`). Episodes that
    cannot be read or scored go to failures.json; the job then exits with code 3 after the others.
    """
    from vlm_rewards.annotation import AnnotateConfig, run_annotation

    def run(config: AnnotateConfig) -> None:
        summary = run_annotation(config, track=tqdm_track)
        console.print(
            f"annotated {summary.num_annotated} of {summary.num_episodes} episodes "
            f"({summary.num_skipped} done before), {summary.num_failed} failed: {summary.output_dir}"
        )
        if summary.report is not None:
            console.print(f"report: {summary.report}")
        if summary.num_failed:
            report_error(f"{summary.num_failed} episode(s) failed; see {summary.output_dir / 'failures.json'}")
            raise typer.Exit(code=3)

    run_config_job(AnnotateConfig, run, args)


@app.command()
def collect(args: JobArgs = None) -> None:
    """Roll out scripted policies on a MuJoCo task and write an episode dataset with progress labels."""
    from vlm_rewards.robotics.collect import collect as run_collect
    from vlm_rewards.robotics.config import CollectConfig

    run_config_job(CollectConfig, lambda config: run_collect(config, tqdm_track), args)


@app.command("grounding-sets")
def grounding_sets(args: JobArgs = None) -> None:
    """Probe sets from Reach episodes: does an RM match the colour word to the pixels (presence), or read only one?"""
    from vlm_rewards.robotics.grounding import GroundingConfig, build_grounding_set

    run_config_job(GroundingConfig, lambda config: build_grounding_set(config, tqdm_track), args)


@app.command()
def rl(args: JobArgs = None) -> None:
    """Train PPO or SAC on a MuJoCo task with a sparse, dense, learned or goal-image reward."""
    from vlm_rewards.robotics.config import RLConfig
    from vlm_rewards.robotics.rl import run_rl

    run_config_job(RLConfig, lambda config: console.print(run_rl(config)), args)


@app.command("compare-rl")
def compare_rl(
    output: Annotated[Path, typer.Argument(help="The PNG to write.")],
    curves: Annotated[
        list[str], typer.Argument(help="label=glob of RL run directories, e.g. 'learned=runs/carry/rl/learned_seed*'.")
    ],
) -> None:
    """Success curves of RL runs from several pipelines in one plot, and their table (markdown) on stdout."""
    from vlm_rewards.robotics.report import compare_runs

    with clean_errors():
        typer.echo(compare_runs(dict(_labelled_runs(curve) for curve in curves), output))


def _labelled_runs(curve: str) -> tuple[str, list[Path]]:
    label, separator, pattern = curve.partition("=")
    if not separator or not label or not pattern:
        raise ValueError(f"curve {curve!r}: expected label=glob, e.g. 'dense=runs/carry/rl/dense_seed*'")
    return label, sorted(Path(match) for match in glob.glob(pattern))


@app.command()
def pipeline(args: JobArgs = None) -> None:
    """The main job: collect demonstrations, fine-tune a progress RM on them, RL with it and baselines, report."""
    from vlm_rewards.robotics.pipeline import PipelineConfig, run_pipeline

    run_config_job(PipelineConfig, lambda config: console.print(f"report: {run_pipeline(config, tqdm_track)}"), args)


@app.command()
def grpo(args: JobArgs = None) -> None:
    """GRPO fine-tuning of a flow-matching (SD3) or DDIM (UNet) generator with rewards; LoRA, resumable."""
    from vlm_rewards.generation.config import GRPOConfig
    from vlm_rewards.generation.train import run_grpo

    run_config_job(GRPOConfig, lambda config: run_grpo(config, tqdm_track), args)


@app.command()
def rwr(args: JobArgs = None) -> None:
    """Reward-weighted regression on a GRPO config's prompts and rewards: GRPO's baseline at equal sampled images."""
    from vlm_rewards.generation.config import RWRConfig
    from vlm_rewards.generation.rwr import run_rwr

    run_config_job(RWRConfig, lambda config: run_rwr(config, tqdm_track), args)


@app.command()
def nft(args: JobArgs = None) -> None:
    """DiffusionNFT on a GRPO config's prompts and rewards: flow matching on its own samples, no log-probs."""
    from vlm_rewards.generation.config import NFTConfig
    from vlm_rewards.generation.nft import run_nft

    run_config_job(NFTConfig, lambda config: run_nft(config, tqdm_track), args)


@app.command("generation-benchmark")
def generation_benchmark(args: JobArgs = None) -> None:
    """GRPO, DiffusionNFT and RWR over seeds on the six_pairs holdout, with the base, into one report; resumable."""
    from vlm_rewards.generation.benchmark import run_benchmark
    from vlm_rewards.generation.config import BenchmarkConfig

    run_config_job(BenchmarkConfig, lambda config: console.print(run_benchmark(config, tqdm_track)), args)


@app.command("pretrain-backbone")
def pretrain_backbone(args: JobArgs = None) -> None:
    """Pretrain the simulated world's small Qwen2.5-VL backbone on questions about ShapesWorld and Reach frames."""
    from vlm_rewards.robotics.backbone import run_pretrain_backbone
    from vlm_rewards.robotics.config import BackboneConfig

    def run(config: BackboneConfig) -> None:
        console.print(f"model: {run_pretrain_backbone(config, tqdm_track)}")

    run_config_job(BackboneConfig, run, args)


@app.command("pretrain-generator")
def pretrain_generator(args: JobArgs = None) -> None:
    """Train a tiny text-to-image flow model from scratch on ShapesWorld prompts (GRPO's base model)."""
    from vlm_rewards.generation.config import PretrainConfig
    from vlm_rewards.generation.pretrain import run_pretrain

    run_config_job(PretrainConfig, lambda config: run_pretrain(config, tqdm_track), args)


@app.command("export-generator")
def export_generator(
    run_dir: Annotated[Path, typer.Argument(help="The output_dir of a vlmr grpo or vlmr rwr run.")],
    format: Annotated[
        list[str], typer.Option(help="lora (peft + diffusers' LoRA layout) or merged (full weights); repeatable.")
    ] = ["lora"],  # noqa: B006 (typer reads the default)
    checkpoint: Annotated[str, typer.Option(help="latest, best, or a checkpoint folder of the run.")] = "latest",
    output: Annotated[Path | None, typer.Option(help="Where <format>/ goes; default RUN_DIR/export.")] = None,
) -> None:
    """Export a GRPO run's LoRA adapter for peft and diffusers' load_lora_weights, or its merged weights."""
    from vlm_rewards.generation.export import export_checkpoint

    with clean_errors():
        for folder in export_checkpoint(run_dir, format, checkpoint, output):
            console.print(f"exported: {folder}")


if __name__ == "__main__":
    app()
