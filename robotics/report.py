"""The `vlmr pipeline` report, its plots and the RL success statistics (also `vlmr compare-rl`).

Read from the run folders `vlmr rl` writes: `config.yaml` (the seed and the budget), `eval.jsonl`
(success rate on the fixed evaluation seeds per evaluation) and `monitor.jsonl` (the reward-hacking
monitor of a learned reward).

The protocol's statistics, per condition over its test seeds: the interquartile mean (IQM, the mean of
the middle 50 % of runs: `scipy.stats.trim_mean(x, 0.25)`, as rliable's `aggregate_iqm`) of the final
success rate and of the steps to 80 % success, each with a 95 % percentile-bootstrap confidence interval
over runs (`scipy.stats.bootstrap`, which is what rliable's stratified bootstrap reduces to for one task).
A run that never reaches 80 % counts as censored at its budget (`total_timesteps`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.stats
import yaml

from vlm_rewards.evaluation.metrics import bootstrap_ci as bootstrap_interval

logger = logging.getLogger("vlm_rewards.robotics.report")


def read_jsonl(path: Path) -> list[dict]:
    """The records of a run's .jsonl log (eval.jsonl, monitor.jsonl); none if it does not exist yet."""
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


def success_rates(run_dirs: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """The eval steps all runs share, and each run's success rate at them (runs × steps)."""
    histories = [{e["timesteps"]: e["success_rate"] for e in read_jsonl(d / "eval.jsonl")} for d in run_dirs]
    steps = sorted(set.intersection(*(set(h) for h in histories)))
    return np.array(steps), np.array([[h[s] for s in steps] for h in histories])


def success_statistics(run_dirs: list[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eval steps and the mean and std of the success rate over runs (on the steps all runs share)."""
    steps, rates = success_rates(run_dirs)
    return steps, rates.mean(axis=0), rates.std(axis=0)


def steps_to_reach(steps: np.ndarray, rates: np.ndarray, level: float = 0.8) -> int | None:
    reached = np.nonzero(rates >= level)[0]
    return int(steps[reached[0]]) if len(reached) else None


# ---------------------------------------------------------------------- the protocol's statistics

LEVEL = 0.8  # the success rate whose first crossing is "steps to 80 %"
RESAMPLES = 10_000
FULL_TEST_SEEDS = 5  # issue #36's protocol: every condition on at least this many test seeds


def iqm(values: np.ndarray, axis: int = 0) -> np.ndarray | float:
    """Interquartile mean: the mean of the values left after cutting the lowest and the highest 25 %."""
    return scipy.stats.trim_mean(values, 0.25, axis=axis)


def bootstrap_ci(values: list[float], seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the IQM over runs (resampled with replacement, seeded)."""
    return bootstrap_interval(values, iqm, RESAMPLES, seed)


def run_outcome(run_dir: Path, level: float = LEVEL) -> dict:
    """One finished RL run: its seed, final success, and the first evaluation step at `level` success
    (censored at the budget when it never gets there)."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    evals = read_jsonl(run_dir / "eval.jsonl")
    budget = int(config["total_timesteps"])
    if not evals or evals[-1]["timesteps"] < budget:
        last = evals[-1]["timesteps"] if evals else "none"
        raise ValueError(f"{run_dir}: unfinished RL run (last evaluation at step {last}, budget {budget})")
    reached = [e["timesteps"] for e in evals if e["success_rate"] >= level]
    return {
        "run": run_dir.name,
        "seed": int(config["seed"]),
        "final_success": float(evals[-1]["success_rate"]),
        "steps_to_80": int(reached[0]) if reached else budget,
        "censored": not reached,
        "budget": budget,
    }


def protocol_statistics(run_dirs: list[Path]) -> dict:
    """IQM and bootstrap CI of final success and of steps to 80 % over one condition's runs."""
    outcomes = [run_outcome(d) for d in run_dirs]
    final = [o["final_success"] for o in outcomes]
    steps = [o["steps_to_80"] for o in outcomes]
    return {
        "seeds": [o["seed"] for o in outcomes],
        "final_success": {"iqm": float(iqm(np.array(final))), "ci": bootstrap_ci(final)},
        "steps_to_80": {"iqm": float(iqm(np.array(steps, dtype=float))), "ci": bootstrap_ci(steps)},
        "censored": sum(o["censored"] for o in outcomes),
        "runs": outcomes,
    }


def run_seed(run_dir: Path) -> int:
    """The seed an RL run was trained with, from its own config.yaml."""
    return int(yaml.safe_load((run_dir / "config.yaml").read_text())["seed"])


def check_test_seeds(test_runs: dict[str, list[Path]], other_runs: list[Path]) -> list[int]:
    """The test seeds, read from the runs' own configs: the same for every condition, each once, and none of
    them the seed of a run that tuned or steered anything (`other_runs`). Raises naming the runs otherwise."""
    seeds = {condition: sorted(run_seed(d) for d in dirs) for condition, dirs in test_runs.items()}
    reference = next(iter(seeds.values()), [])
    if any(s != reference for s in seeds.values()) or len(set(reference)) != len(reference):
        raise ValueError(f"every condition must run the same test seeds, each once; got {seeds}")
    leaked = [str(d) for d in other_runs if run_seed(d) in reference]
    if leaked:
        raise ValueError(f"{leaked} ran on test seeds {reference}; a test seed must not tune or steer anything")
    return reference


def select_candidate(runs: dict[str, list[Path]], rule: str) -> tuple[str, dict[str, float]]:
    """The best tuning candidate and every candidate's score: its mean over runs of the mean success over
    evaluations (rule mean_success) or of the last evaluation's (final_success). Ties: the first listed."""

    def score(run_dir: Path) -> float:
        rates = [e["success_rate"] for e in read_jsonl(run_dir / "eval.jsonl")]
        return float(np.mean(rates) if rule == "mean_success" else rates[-1])

    scores = {name: float(np.mean([score(d) for d in dirs])) for name, dirs in runs.items()}
    return max(scores, key=scores.get), scores


def hacking_check(run_dir: Path, rise: float) -> dict:
    """Learned progress up while the true success stays flat: the reward was exploited."""
    monitor = read_jsonl(run_dir / "monitor.jsonl")
    evals = read_jsonl(run_dir / "eval.jsonl")
    if len(monitor) < 4 or not evals:
        return {}
    progress = np.array([m["reward/learned_progress"] for m in monitor], dtype=float)
    quarter = max(len(progress) // 4, 1)
    progress_rise = float(np.nanmean(progress[-quarter:]) - np.nanmean(progress[:quarter]))
    correlations = np.array(
        [np.nan if m["reward/corr_progress_true"] is None else m["reward/corr_progress_true"] for m in monitor],
        dtype=float,
    )
    best_success = max(e["success_rate"] for e in evals)
    return {
        "learned_progress_rise": progress_rise,
        "corr_progress_true_first": float(np.nanmean(correlations[:quarter])),
        "corr_progress_true_last": float(np.nanmean(correlations[-quarter:])),
        "hacked": bool(progress_rise > rise and best_success < 0.2),
    }


def _voc_ends(histories: list[list[dict]]) -> tuple[float, float]:
    """Mean rollout VOC over the first and the last quarter of the evaluations, over runs."""
    if not histories:
        return float("nan"), float("nan")
    quarter = max(min(len(h) for h in histories) // 4, 1)
    first = [e["voc"] for h in histories for e in h[:quarter]]
    last = [e["voc"] for h in histories for e in h[-quarter:]]
    return float(np.mean(first)), float(np.mean(last))


def plot_success_curves(runs: dict[str, list[Path]], path: Path) -> None:
    """Mean ± std success rate over each label's runs, one curve a label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    for label, run_dirs in runs.items():
        steps, mean, std = success_statistics(run_dirs)
        axis.plot(steps, mean, marker="o", markersize=3, label=f"{label} ({len(run_dirs)} seeds)")
        axis.fill_between(steps, mean - std, mean + std, alpha=0.15)
    axis.set(xlabel="env steps", ylabel="success rate (eval seeds)", ylim=(-0.05, 1.05))
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def success_summary(run_dirs: list[Path]) -> dict:
    """What the report's RL table says of one condition's runs."""
    steps, rates = success_rates(run_dirs)
    mean = rates.mean(axis=0)
    return {
        "seeds": len(run_dirs),
        "final_mean": float(mean[-1]),
        "final_std": float(rates[:, -1].std()),
        "final_per_seed": rates[:, -1].tolist(),
        "best_mean": float(mean.max()),
        "steps_to_80": steps_to_reach(steps, mean),
    }


SUCCESS_TABLE_HEADER = [
    "| reward | seeds | final success (mean ± std) | per seed | best | steps to 80 % |",
    "| --- | --- | --- | --- | --- | --- |",
]


def success_table_row(label: str, entry: dict) -> str:
    per_seed = ", ".join(f"{rate:.2f}" for rate in entry["final_per_seed"])
    return (
        f"| {label} | {entry['seeds']} | {entry['final_mean']:.2f} ± {entry['final_std']:.2f} | {per_seed} | "
        f"{entry['best_mean']:.2f} | {_fmt(entry['steps_to_80'])} |"
    )


def compare_runs(curves: dict[str, list[Path]], output: Path) -> str:
    """Success curves of RL runs from any pipelines in one PNG, and their table as markdown."""
    for label, run_dirs in curves.items():
        missing = [str(d) for d in run_dirs if not (d / "eval.jsonl").is_file()]
        if not run_dirs or missing:
            raise ValueError(f"{label}: expected RL run directories with an eval.jsonl, got {missing or 'none'}")
    output.parent.mkdir(parents=True, exist_ok=True)
    plot_success_curves(curves, output)
    return "\n".join(
        [*SUCCESS_TABLE_HEADER, *(success_table_row(label, success_summary(d)) for label, d in curves.items())]
    )


def _plot(root: Path, runs: dict[str, list[Path]], voc_history: dict[str, list[dict]]) -> None:
    """The report's PNGs, each when there is something to draw: success curves, fidelity and rollout VOC."""
    if runs:
        plot_success_curves(runs, root / "success_curves.png")
    learned = [d for d in runs.get("learned", []) if (d / "monitor.jsonl").is_file()]
    if learned:
        _plot_reward_fidelity(learned, root / "reward_fidelity.png")
    if voc_history:
        _plot_rollout_voc(runs, voc_history, root / "rollout_voc.png")


def _plot_reward_fidelity(run_dirs: list[Path], path: Path) -> None:
    """Per learned-reward run, the monitor's correlation of learned progress and true reward over training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for run_dir in run_dirs:
        monitor = read_jsonl(run_dir / "monitor.jsonl")
        axis.plot(
            [m["timesteps"] for m in monitor],
            [np.nan if m["reward/corr_progress_true"] is None else m["reward/corr_progress_true"] for m in monitor],
            label=run_dir.name,
        )
    axis.set(
        xlabel="env steps",
        ylabel="corr(learned progress, true dense reward)",
        ylim=(-1.05, 1.05),
        title="RM fidelity on the policy's own rollouts",
    )
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _plot_rollout_voc(runs: dict[str, list[Path]], voc_history: dict[str, list[dict]], path: Path) -> None:
    """The RM's VOC on each run's evaluation videos over training, one colour a condition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for colour, (condition, run_dirs) in enumerate(runs.items()):
        for index, run_dir in enumerate(run_dirs):
            history = voc_history.get(run_dir.name, [])
            axis.plot(
                [e["timesteps"] for e in history],
                [e["voc"] for e in history],
                alpha=0.7,
                color=f"C{colour}",
                label=condition if index == 0 else None,
            )
    axis.set(xlabel="env steps", ylabel="RM VOC on the evaluation rollout", ylim=(-1.05, 1.05))
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _fmt(value) -> str:
    return (
        "–"
        if value is None or (isinstance(value, float) and not np.isfinite(value))
        else (f"{value:.3f}" if isinstance(value, float) else str(value))
    )


RM_METRICS = (
    "voc_expert",
    "voc_reversed",
    "voc_random",
    "step_correlation",
    "step_correlation_at_clip_frames",
    "pixel_sensitivity",
    "mismatch_accuracy",
    "instruction_sensitivity",
    "success_auc",
)
RM_READING_GUIDE = (
    "An RM that reads the frames has VOC expert near 1 and VOC reversed near −1, and its own instruction "
    "beats another's (mismatch_accuracy near 1; instruction_sensitivity near 0 means it ignores the "
    "instruction); VOC reversed close to VOC expert, or pixel_sensitivity near 0, means it scores by "
    "frame position, not by what it sees. step_correlation is how well the RM's frame-to-frame changes "
    "follow the true ones beyond what frame position predicts: what potential shaping pays each step. "
    "step_correlation_at_clip_frames (with progress_rm.data.clip_frames set) is the same on episodes "
    "subsampled to the training clip length: far above step_correlation, the RM holds only at that length, "
    "and RL streams it whole episodes."
)
HACKING_KEYS = ("learned_progress_rise", "corr_progress_true_first", "corr_progress_true_last", "hacked")


def _reward_model_section(rm_metrics: dict[str, dict]) -> list[str]:
    """The RM's held-out metrics, one column per episode length."""
    per_policy = sorted(k for k in next(iter(rm_metrics.values())) if k.startswith("reward_policy_"))
    keys = [key for key in (*RM_METRICS, *per_policy) if any(key in metrics for metrics in rm_metrics.values())]
    return [
        "## Reward model on held-out episodes",
        "",
        "| metric | " + " | ".join(f"{k} length" for k in rm_metrics) + " |",
        "| --- | " + " | ".join("---" for _ in rm_metrics) + " |",
        *(f"| {key} | " + " | ".join(_fmt(m.get(key)) for m in rm_metrics.values()) + " |" for key in keys),
        "",
        RM_READING_GUIDE,
    ]


def _hacking_section(checks: dict[str, dict]) -> list[str]:
    """The hacking check of each learned-reward run."""
    return [
        "## Reward hacking monitor (learned reward)",
        "",
        "![fidelity](reward_fidelity.png)",
        "",
        "| run | learned progress rise | corr first quarter | corr last quarter | hacked |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {run} | " + " | ".join(_fmt(check.get(key)) for key in HACKING_KEYS) + " |"
            for run, check in checks.items()
        ),
    ]


def _rollout_voc_section(runs: dict[str, list[Path]], voc_history: dict[str, list[dict]]) -> list[str]:
    """Per condition, the RM's VOC on the first and the last evaluation rollouts."""
    lines = [
        "## RM VOC on the policies' own evaluation rollouts",
        "",
        "![rollout VOC](rollout_voc.png)",
        "",
        "| reward | first evaluations | last evaluations |",
        "| --- | --- | --- |",
    ]
    for condition, run_dirs in runs.items():
        first, last = _voc_ends([voc_history[d.name] for d in run_dirs if voc_history.get(d.name)])
        lines.append(f"| {condition} | {_fmt(first)} | {_fmt(last)} |")
    return lines


@dataclass
class ProtocolRuns:
    """Every RL run of a pipeline, by its role in the protocol."""

    test: dict[str, list[Path]]
    """Per condition, its runs on the test seeds."""
    tuning: dict[str, list[Path]] = field(default_factory=dict)
    """Per tuning candidate, its runs on the tuning seeds."""
    rule: str = ""
    """How the candidate was chosen (`Tuning.rule`)."""
    rounds: list[list[Path]] = field(default_factory=list)
    """Per round, the RL runs whose policies were rolled out."""

    def others(self) -> list[Path]:
        return [d for dirs in self.tuning.values() for d in dirs] + [d for dirs in self.rounds for d in dirs]


def _ci(entry: dict, fmt: str) -> str:
    low, high = entry["ci"]
    return f"{entry['iqm']:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def _tuning_section(runs: ProtocolRuns, chosen: str, scores: dict[str, float]) -> list[str]:
    lines = [
        "## Tuning (tuning seeds only)",
        "",
        f"Rule: the highest mean over the tuning seeds of `{runs.rule}` (ties: the candidate listed first). "
        f"Chosen: **{chosen}**; every test run below uses its settings.",
        "",
        f"| candidate | seeds | final success per seed | {runs.rule} |",
        "| --- | --- | --- | --- |",
    ]
    for name, dirs in runs.tuning.items():
        finals = ", ".join(f"{run_outcome(d)['final_success']:.2f}" for d in dirs)
        seeds = ", ".join(str(run_seed(d)) for d in dirs)
        lines.append(f"| {name}{' (chosen)' if name == chosen else ''} | {seeds} | {finals} | {scores[name]:.3f} |")
    return lines


def _test_section(statistics: dict[str, dict], seeds: list[int]) -> list[str]:
    return [
        "## RL on the test seeds",
        "",
        f"Test seeds {seeds}: each condition ran on every one of them once, after tuning. IQM over runs with its "
        f"95 % bootstrap CI ({RESAMPLES:,} resamples). Steps to 80 %: the first evaluation at ≥ 80 % success; a run "
        "that never gets there counts at its budget (censored).",
        "",
        "![success](success_curves.png)",
        "",
        "| reward | runs | final success, IQM [95 % CI] | steps to 80 %, IQM [95 % CI] | censored |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {condition} | {len(entry['runs'])} | {_ci(entry['final_success'], '.2f')} | "
            f"{_ci(entry['steps_to_80'], ',.0f')} | {entry['censored']} of {len(entry['runs'])} |"
            for condition, entry in statistics.items()
        ),
        *_budget_note(seeds),
    ]


def _budget_note(seeds: list[int]) -> list[str]:
    """What a run with few test seeds can and cannot show."""
    if len(seeds) >= FULL_TEST_SEEDS:
        return []
    return [
        "",
        f"**What {len(seeds)} test seed{'s' if len(seeds) > 1 else ''} can show:** whether a reward leads SAC to "
        "success at all within this budget, and which conditions are far apart. Not which of two close conditions "
        f"is better: the intervals are wide, and a reviewer wants at least {FULL_TEST_SEEDS} test seeds with tuning "
        "on separate seeds. The full experiments are `vlmr pipeline configs/experiments/robotics/<task>.yaml` "
        "(docs/results/robotics.md).",
    ]


def _every_run_section(accounted: list[dict]) -> list[str]:
    return [
        "## Every RL run",
        "",
        "| role | run | seed | final success | steps to 80 % |",
        "| --- | --- | --- | --- | --- |",
        *(
            f"| {o['role']} | {o['run']} | {o['seed']} | {o['final_success']:.2f} | "
            f"{o['steps_to_80']:,}{' (censored)' if o['censored'] else ''} |"
            for o in accounted
        ),
    ]


def write_report(
    root: Path,
    rm_metrics: dict[str, dict],
    runs: ProtocolRuns,
    voc_history: dict[str, list[dict]],
    hacking_rise: float,
) -> Path:
    """report.md (+ PNGs, summary.json) a person opens after the pipeline."""
    seeds = check_test_seeds(runs.test, runs.others())
    _plot(root, runs.test, voc_history)
    statistics = {condition: protocol_statistics(dirs) for condition, dirs in runs.test.items()}
    accounted = [{"role": "test", **o} for entry in statistics.values() for o in entry["runs"]]
    accounted += [{"role": f"tuning: {name}", **run_outcome(d)} for name, dirs in runs.tuning.items() for d in dirs]
    accounted += [{"role": f"round {k}", **run_outcome(d)} for k, dirs in enumerate(runs.rounds, 1) for d in dirs]
    summary: dict = {"reward_model": rm_metrics, "test_seeds": seeds, "rl": statistics, "runs": accounted}
    if "learned" in runs.test:
        summary["rl"]["learned"]["hacking"] = {d.name: hacking_check(d, hacking_rise) for d in runs.test["learned"]}
    lines = ["# Pipeline report", "", f"Config: `{root / 'config.yaml'}`", "", *_reward_model_section(rm_metrics), ""]
    if runs.tuning:
        chosen, scores = select_candidate(runs.tuning, runs.rule)
        summary["tuning"] = {"rule": runs.rule, "scores": scores, "chosen": chosen}
        lines += [*_tuning_section(runs, chosen, scores), ""]
    if runs.test:
        lines += [*_test_section(statistics, seeds), "", *_every_run_section(accounted)]
    if "learned" in runs.test:
        lines += ["", *_hacking_section(summary["rl"]["learned"]["hacking"])]
    if voc_history:
        lines += ["", *_rollout_voc_section(runs.test, voc_history)]
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    report = root / "report.md"
    report.write_text("\n".join(lines) + "\n")
    logger.info("report: %s", report)
    return report
