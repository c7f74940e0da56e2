"""`vlmr pipeline`: collect demonstrations -> train a progress RM from scratch -> RL with it -> report.

Stages, each in its own folder under `output_dir` and skipped when its output already exists (so a
re-run resumes; the RL runs resume from their checkpoints):

1. `data/train`, `data/eval_<k>x`: scripted episodes (`vlmr collect`); held-out ones at k times the
   training episode length, to check that the RM holds at the clip lengths the RL loop feeds it. Their
   reset seeds are disjoint from the training rollouts' and from RL's evaluation seeds (checked).
2. `rm_stage1/` (optional): a preference RM on ShapesWorld pairs, which grounds colour words in pixels;
   `rm/`: the progress RM trained on the collected episodes, starting from stage 1's backbone;
   `rm_cont<k>/` (optional, `progress_rm_continued`): further progress stages, each from the one before.
   With `reward_window`, every later stage reads the last model frame by frame (a `frame_window` reward).
3. `eval_rm_<k>x/`: `vlmr eval-rm` of the RM on the held-out episodes (VOC, instruction use, the reward
   each scripted policy earns, wrong-object behaviour included).
4. `rl/<condition>_seed<s>/`: `vlmr rl` per reward condition (sparse | dense | learned | goal_image |
   scripted) and seed, equal budgets. `scripted` is the learned condition's wrapper with a hand-written
   reward that reads the same frames (`scripted_reward`): what a perfect RM would give RL.
5. `report.md` + `success_curves.png` + `reward_fidelity.png`: success rate vs env steps (mean ± std over
   seeds), the RM's on-policy agreement with the true reward as training goes, and a hacking check.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal

import numpy as np
import pydantic
import yaml

from robotics.collect import Track
from robotics.config import CollectConfig, EnvConfig, RLConfig
from robotics.rl import read_jsonl, run_rl
from vlm_rewards.config import JobConfig, deep_merge, format_validation_error
from vlm_rewards.training.config import TrainRMConfig

logger = logging.getLogger("vlm_rewards.robotics.pipeline")
Condition = Literal["sparse", "dense", "learned", "goal_image", "scripted"]
# the shipped hand-written frame-reading rewards of the `scripted` condition, per (task, env.highlights):
# their palettes hold the colours as the camera renders them, which the highlights change
SCRIPTED_REWARDS = {
    ("vlmr/Reach-v0", True): "reach_marker_progress",
    ("vlmr/Reach-v0", False): "reach_marker_progress_matte",
    ("vlmr/Push-v0", True): "push_marker_progress",
    ("vlmr/Carry-v0", False): "carry_marker_progress_matte",
}
# held-out episodes at k x the episode length reset with seeds from collect.seed + k * this: past any training
# rollout (rollout j resets with collect.seed + j), so no held-out episode starts where a training one did
HELD_OUT_SEED_STRIDE = 1_000_000


def _default_env() -> EnvConfig:
    # −1 a step until success: the urgency without which shaped policies stop short of the target
    return EnvConfig(id="vlmr/Reach-v0", max_episode_steps=30, sparse_step_cost=1.0)


def _default_collect() -> CollectConfig:
    return CollectConfig(
        episodes={"expert": 48, "noisy": 32, "wrong_object": 32, "random": 16}, views=[], frame_stride=1
    )


def _default_stage1() -> TrainRMConfig:
    data = {
        "synthetic_train": {
            "num_episodes": 600,
            "num_pairs": 1500,
            "num_frames": 8,
            "frame_size": 56,
            "num_objects": 3,
            "seed": 0,
        }
    }
    return TrainRMConfig(
        model={"reward": {"task": "preference", "head": "scalar"}}, data=data, optim={"steps": 600, "batch_size": 16}
    )


def _default_progress_rm() -> TrainRMConfig:
    return TrainRMConfig(
        model={"reward": {"task": "progress", "head": "regression", "max_frames": 128}},
        data={"augment": {"mismatch": 0.2, "reverse": 0.1, "rewind": 0.1, "stall": 0.05, "subsample": 0.3}},
        optim={"steps": 600, "batch_size": 12},
        eval_every=600,
        save_every=200,
    )


def _default_rl() -> RLConfig:
    return RLConfig(
        algo="sac",
        total_timesteps=4000,
        reward={"wrapper": {"scale": 10.0}},  # the shaping term against the step cost of 1
        eval={"every": 1000, "episodes": 10, "video": False},
    )


class RewardWindow(pydantic.BaseModel, extra="forbid"):
    """The RM read frame by frame (`frame_window` reward): frame t scored as the clip [frame 0] + the last
    `window` frames up to t, so the potential is a function of what the frames show, not of the path."""

    window: int = pydantic.Field(1, ge=1)
    keep_first: bool = True


class PipelineConfig(JobConfig):
    """Every knob of the stages; `env` is shared by collection and RL. Trainer and RL sections are the
    `vlmr train-rm` / `vlmr rl` configs (their output folders and data paths are set by the pipeline)."""

    output_dir: Path = Path("runs/pipeline")
    env: EnvConfig = pydantic.Field(default_factory=_default_env)
    collect: CollectConfig = pydantic.Field(default_factory=_default_collect)
    # held-out episodes per policy: scripted ones or a name of collect.checkpoints (an RL policy's own states)
    eval_episodes: dict[str, int] = {"expert": 8, "noisy": 4, "wrong_object": 4, "random": 4}
    eval_length_factors: list[int] = [1, 2]  # held-out episodes at k x the training episode length
    preference_stage: TrainRMConfig | None = pydantic.Field(default_factory=_default_stage1)  # None: skip
    progress_rm: TrainRMConfig = pydantic.Field(default_factory=_default_progress_rm)
    # further progress-RM stages, each a partial `vlmr train-rm` config merged into progress_rm and started from
    # the model of the stage before, e.g. {optim: {steps: 3000, lr: 3.0e-4}, data: {clip_frames: null}}: whole
    # episodes after 8-frame clips. The RL conditions use the last stage's model
    progress_rm_continued: list[dict] = []
    # episode folders of earlier rounds the RM trains on beside this run's own data/train (a round of new
    # rollouts that keeps what the earlier rounds collected); each is read as is, none is copied
    earlier_training_data: list[Path] = []
    reward_window: RewardWindow | None = None  # None: the RM streams whole episodes (its context grows with t)
    rl: RLConfig = pydantic.Field(default_factory=_default_rl)
    conditions: list[Condition] = ["sparse", "dense", "learned", "scripted"]
    scripted_reward: str | None = None  # reward YAML (path or shipped name) of `scripted`; None: SCRIPTED_REWARDS
    seeds: list[int] = [0]
    hacking_rise: float = 0.2  # flagged: learned progress rose by this much while success stayed below 0.2

    @pydantic.model_validator(mode="after")
    def _scripted_reward_for_the_task(self) -> PipelineConfig:
        scene = (self.env.id, self.env.highlights)
        if "scripted" in self.conditions and self.scripted_reward is None and scene not in SCRIPTED_REWARDS:
            raise ValueError(
                f"conditions has 'scripted' and no scripted_reward; there is no shipped one for env.id "
                f"{self.env.id!r} with env.highlights {self.env.highlights} (only for (id, highlights) "
                f"{sorted(SCRIPTED_REWARDS)}): set scripted_reward or drop 'scripted'"
            )
        return self

    @pydantic.model_validator(mode="after")
    def _held_out_policies_are_known(self) -> PipelineConfig:
        try:
            self.collect.model_validate({**self.collect.model_dump(), "episodes": self.eval_episodes})
        except pydantic.ValidationError as error:
            raise ValueError(f"eval_episodes: {format_validation_error(error)}") from None
        return self

    @pydantic.model_validator(mode="after")
    def _reset_seeds_are_disjoint(self) -> PipelineConfig:
        ranges = {"collect (training rollouts)": (self.collect.seed, sum(self.collect.episodes.values()))}
        for factor in self.eval_length_factors:
            ranges[f"eval_{factor}x (held out)"] = (self.held_out_seed(factor), sum(self.eval_episodes.values()))
        ranges["rl.eval"] = (self.rl.eval.seed_start, self.rl.eval.episodes)
        named = sorted(ranges.items(), key=lambda item: item[1][0])
        for (first, (start, count)), (second, (next_start, _)) in zip(named, named[1:]):
            if start + count > next_start:
                raise ValueError(
                    f"the reset seeds of {first} ({start}..{start + count - 1}) reach into those of {second} (from "
                    f"{next_start}): the same start states would be in both; move collect.seed or rl.eval.seed_start"
                )
        return self

    def held_out_seed(self, factor: int) -> int:
        return self.collect.seed + HELD_OUT_SEED_STRIDE * factor

    @pydantic.model_validator(mode="after")
    def _continued_stages_are_trainer_configs(self) -> PipelineConfig:
        self.continued_progress_stages()  # a bad key or value fails here, naming the stage
        return self

    def continued_progress_stages(self) -> list[TrainRMConfig]:
        base = self.progress_rm.model_dump(mode="json")
        stages = []
        for index, update in enumerate(self.progress_rm_continued, start=1):
            try:
                stages.append(TrainRMConfig.model_validate(deep_merge(base, update)))
            except pydantic.ValidationError as error:
                raise ValueError(f"progress_rm_continued[{index - 1}]: {format_validation_error(error)}") from None
        return stages

    @property
    def scripted_reward_config(self) -> str | None:
        return self.scripted_reward or SCRIPTED_REWARDS.get((self.env.id, self.env.highlights))


class Pipeline:
    def __init__(self, config: PipelineConfig, track: Track | None = None):
        self.config, self.track = config, track
        self.root = Path(config.output_dir)

    @property
    def episode_steps(self) -> int:
        import gymnasium as gym

        import robotics.envs  # noqa: F401 - registers the tasks

        return self.config.env.max_episode_steps or gym.spec(self.config.env.id).max_episode_steps

    # ------------------------------------------------------------------ stages

    def collect(self) -> None:
        from robotics.collect import collect

        base = self.config.collect.model_copy(update={"env": self.config.env})
        jobs = {"train": base}
        for factor in self.config.eval_length_factors:
            env = self.config.env.model_copy(update={"max_episode_steps": factor * self.episode_steps})
            jobs[f"eval_{factor}x"] = base.model_copy(
                update={
                    "env": env,
                    "episodes": self.config.eval_episodes,
                    "seed": self.config.held_out_seed(factor),
                    "relabel_targets": False,  # held out: the instructed target only
                }
            )
        for name, job in jobs.items():
            folder = self.root / "data" / name
            if not (folder / "meta.json").is_file():
                collect(job.model_copy(update={"output": str(folder)}), self.track)

    def train_reward_model(self) -> Path:
        from vlm_rewards.training.train import run_training

        config = self.config
        backbone = config.progress_rm.model.backbone
        if config.preference_stage is not None:
            stage1 = config.preference_stage.model_copy(update={"output_dir": self.root / "rm_stage1"})
            if not (stage1.output_dir / "model").is_dir():
                run_training(stage1, self.track)
            backbone = str(stage1.output_dir / "model")
        own = self.root / "data" / "train"
        train = [own, *config.earlier_training_data] if config.earlier_training_data else own
        episodes = {"train": train, "eval": self.root / "data" / "eval_1x"}
        stages = [config.progress_rm, *config.continued_progress_stages()]
        for index, stage in enumerate(stages):  # each progress stage starts from the model before it
            output_dir = self.root / ("rm" if index == 0 else f"rm_cont{index}")
            model = stage.model.model_copy(update={"backbone": backbone})
            data = stage.data.model_copy(update=episodes)
            progress = stage.model_copy(update={"output_dir": output_dir, "model": model, "data": data})
            if not (output_dir / "model").is_dir():
                run_training(progress, self.track)
            backbone = str(output_dir / "model")
        reward_yaml = output_dir / "reward.yaml"
        spec = {
            "kind": "trained_rm",
            "name": "pipeline_progress_rm",
            "model": str((output_dir / "model").resolve()),
            "device": config.rl.device,
            "batch_size": 16,
        }
        if config.reward_window is not None:
            spec = {"kind": "frame_window", "reward": spec, **config.reward_window.model_dump()}
        reward_yaml.write_text(yaml.safe_dump(spec, sort_keys=False))
        return reward_yaml

    def evaluate_reward_model(self, reward_yaml: Path) -> dict[str, dict]:
        from vlm_rewards.evaluation.evaluate import EvalRMConfig, run_eval
        from vlm_rewards.registry import build_reward

        reward = build_reward(str(reward_yaml))
        metrics = {}
        for factor in self.config.eval_length_factors:
            eval_config = EvalRMConfig(
                reward=str(reward_yaml),
                episodes=self.root / "data" / f"eval_{factor}x",
                output_dir=self.root / f"eval_rm_{factor}x",
                clip_frames=self.config.progress_rm.data.clip_frames,
            )
            metrics[f"{factor}x"] = run_eval(eval_config, self.track, reward=reward)
        return metrics

    def run_rl(self, reward_yaml: Path) -> dict[str, list[Path]]:
        runs: dict[str, list[Path]] = {}
        reward_configs = {"learned": str(reward_yaml), "scripted": self.config.scripted_reward_config}
        for condition in self.config.conditions:
            for seed in self.config.seeds:
                run_dir = self.root / "rl" / f"{condition}_seed{seed}"
                source = "learned" if condition in reward_configs else condition
                reward = self.config.rl.reward.model_copy(
                    update={"source": source, "config": reward_configs.get(condition)}
                )
                rl_config = self.config.rl.model_copy(
                    update={"run_dir": str(run_dir), "env": self.config.env, "reward": reward, "seed": seed}
                )
                logger.info("RL: %s, seed %d -> %s", condition, seed, run_dir)
                run_rl(RLConfig.model_validate(rl_config.model_dump()))
                runs.setdefault(condition, []).append(run_dir)
        return runs

    def rollout_voc(self, reward_yaml: Path, run_dirs: list[Path]) -> dict[str, list[dict]]:
        """The RM's VOC on the policy's own evaluation rollouts (`videos/eval_<steps>.mp4`, the first
        evaluation seed) as training goes: does the reward stay faithful off the demo distribution?"""
        from robotics.envs import make_env
        from vlm_rewards.evaluation.metrics import voc
        from vlm_rewards.interface import REFERENCE, RewardRequest
        from vlm_rewards.media import read_clip
        from vlm_rewards.registry import build_reward

        reward = build_reward(str(reward_yaml))
        env = make_env(self.config.env)
        env.reset(seed=self.config.rl.eval.seed_start)
        instruction = env.unwrapped.instruction
        goal = env.unwrapped.render_goal(self.config.env.camera)[None] if REFERENCE in reward.spec.requires else None
        env.close()
        history = {}
        for run_dir in run_dirs:
            videos = sorted((run_dir / "videos").glob("eval_*.mp4"))
            requests = [RewardRequest(read_clip(video), instruction, reference=goal) for video in videos]
            results = reward.score(requests) if requests else []
            history[run_dir.name] = [
                {
                    "timesteps": int(video.stem.split("_")[1]),
                    "voc": voc(result.progress),
                    "final_progress": result.reward,
                }
                for video, result in zip(videos, results)
            ]
        return history

    def run(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.yaml").write_text(yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False))
        self.collect()
        reward_yaml = self.train_reward_model()
        rm_metrics = self.evaluate_reward_model(reward_yaml)
        runs = self.run_rl(reward_yaml)
        voc_history = (
            self.rollout_voc(reward_yaml, [d for ds in runs.values() for d in ds]) if self.config.rl.eval.video else {}
        )
        return write_report(self.root, rm_metrics, runs, voc_history, self.config.hacking_rise)


# ---------------------------------------------------------------------- report


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_success_curves(runs, root / "success_curves.png")
    learned = [d for d in runs.get("learned", []) if (d / "monitor.jsonl").is_file()]
    if learned:
        figure, axis = plt.subplots(figsize=(6, 4))
        for run_dir in learned:
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
        figure.savefig(root / "reward_fidelity.png", dpi=100)
        plt.close(figure)

    if voc_history:
        figure, axis = plt.subplots(figsize=(6, 4))
        for condition, run_dirs in runs.items():
            for index, run_dir in enumerate(run_dirs):
                history = voc_history.get(run_dir.name, [])
                axis.plot(
                    [e["timesteps"] for e in history],
                    [e["voc"] for e in history],
                    alpha=0.7,
                    color=f"C{list(runs).index(condition)}",
                    label=condition if index == 0 else None,
                )
        axis.set(xlabel="env steps", ylabel="RM VOC on the evaluation rollout", ylim=(-1.05, 1.05))
        axis.legend(fontsize=7)
        figure.tight_layout()
        figure.savefig(root / "rollout_voc.png", dpi=100)
        plt.close(figure)


def _fmt(value) -> str:
    return (
        "–"
        if value is None or (isinstance(value, float) and not np.isfinite(value))
        else (f"{value:.3f}" if isinstance(value, float) else str(value))
    )


def write_report(
    root: Path,
    rm_metrics: dict[str, dict],
    runs: dict[str, list[Path]],
    voc_history: dict[str, list[dict]],
    hacking_rise: float,
) -> Path:
    """report.md (+ PNGs, summary.json) a person opens after the pipeline."""
    _plot(root, runs, voc_history)
    lines = [
        "# Pipeline report",
        "",
        f"Config: `{root / 'config.yaml'}`",
        "",
        "## Reward model on held-out episodes",
        "",
    ]
    keys = [
        "voc_expert",
        "voc_reversed",
        "voc_random",
        "step_correlation",
        "step_correlation_at_clip_frames",
        "pixel_sensitivity",
        "mismatch_accuracy",
        "instruction_sensitivity",
        "success_auc",
        *sorted(k for k in next(iter(rm_metrics.values())) if k.startswith("reward_policy_")),
    ]
    keys = [key for key in keys if any(key in metrics for metrics in rm_metrics.values())]
    lines += [
        "| metric | " + " | ".join(f"{k} length" for k in rm_metrics) + " |",
        "| --- | " + " | ".join("---" for _ in rm_metrics) + " |",
    ]
    lines += [f"| {key} | " + " | ".join(_fmt(m.get(key)) for m in rm_metrics.values()) + " |" for key in keys]
    lines += [
        "",
        "An RM that reads the frames has VOC expert near 1 and VOC reversed near −1, and its own instruction "
        "beats another's (mismatch_accuracy near 1; instruction_sensitivity near 0 means it ignores the "
        "instruction); VOC reversed close to VOC expert, or pixel_sensitivity near 0, means it scores by "
        "frame position, not by what it sees. step_correlation is how well the RM's frame-to-frame changes "
        "follow the true ones beyond what frame position predicts: what potential shaping pays each step. "
        "step_correlation_at_clip_frames (with progress_rm.data.clip_frames set) is the same on episodes "
        "subsampled to the training clip length: far above step_correlation, the RM holds only at that length, "
        "and RL streams it whole episodes.",
    ]
    lines += [
        "",
        "## RL: success rate on the fixed evaluation seeds",
        "",
        "![success](success_curves.png)",
        "",
        *SUCCESS_TABLE_HEADER,
    ]
    summary: dict = {"reward_model": rm_metrics, "rl": {}, "rollout_voc": voc_history}
    for condition, run_dirs in runs.items():
        entry = success_summary(run_dirs)
        lines.append(success_table_row(condition, entry))
        if condition == "learned":
            entry["hacking"] = {d.name: hacking_check(d, hacking_rise) for d in run_dirs}
        summary["rl"][condition] = entry
    if "learned" in summary["rl"]:
        lines += [
            "",
            "## Reward hacking monitor (learned reward)",
            "",
            "![fidelity](reward_fidelity.png)",
            "",
            "| run | learned progress rise | corr first quarter | corr last quarter | hacked |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, check in summary["rl"]["learned"]["hacking"].items():
            lines.append(
                f"| {name} | "
                + " | ".join(
                    _fmt(check.get(k))
                    for k in ("learned_progress_rise", "corr_progress_true_first", "corr_progress_true_last", "hacked")
                )
                + " |"
            )
    if voc_history:
        lines += [
            "",
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
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    report = root / "report.md"
    report.write_text("\n".join(lines) + "\n")
    logger.info("report: %s", report)
    return report


def run_pipeline(config: PipelineConfig, track: Track | None = None) -> Path:
    return Pipeline(config, track).run()
