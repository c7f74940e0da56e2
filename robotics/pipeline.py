"""`vlmr pipeline`: collect demonstrations -> train a progress RM -> (rounds) -> tune -> test -> report.

Stages, each in its own folder under `output_dir` and skipped when its output already exists (so a
re-run resumes; an RL run that reached its budget is skipped, an unfinished one resumes from its
checkpoint):

1. `data/train`, `data/eval_<k>x`: scripted episodes (`vlmr collect`); held-out ones at k times the
   training episode length, to check that the RM holds at the clip lengths the RL loop feeds it. Their
   reset seeds are disjoint from the training rollouts' and from RL's evaluation seeds (checked).
2. `rm_stage1/` (optional): a preference RM on ShapesWorld pairs, which grounds colour words in pixels;
   `rm/`: the progress RM trained on the collected episodes, starting from stage 1's backbone (or the
   progress stage's own `model.backbone`); `rm_cont<k>/` (optional, `progress_rm_continued`): further
   progress stages, each from the one before. With `reward_window`, every later stage reads the last
   model frame by frame (a `frame_window` reward).
3. `round<k>/` (optional, `rounds`): `rl/learned_seed<s>/`, SAC or PPO with the RM so far, keeping the
   policy of every checkpoint; `data/train`, rollouts of every kept policy, labelled with the env's
   progress; `rm/`, the RM trained further on them beside all the data before.
4. `eval_rm_<k>x/`: `vlmr eval-rm` of the last RM on the held-out episodes.
5. `tuning/<candidate>_seed<s>/`: each `tuning.candidates` entry (a partial `rl` section) on the tuning
   seeds with `tuning.condition`; the best by `tuning.rule` is the `rl` section of every test run.
6. `rl/<condition>_seed<s>/`: `vlmr rl` per condition (sparse | dense | learned | oracle | goal_image |
   scripted) on every test seed, once, equal budgets. `scripted` is the learned condition's wrapper with
   a hand-written reward that reads the same frames; `oracle` the wrapper with the env's true progress
   as the potential (what a perfect progress RM would give RL). `rl_workers` > 1 trains that many runs at
   once, each in its own process.
7. `report.md`, `summary.json` + `success_curves.png`, `reward_fidelity.png` (vlm_rewards.robotics.report):
   IQM and bootstrap CIs per condition over the test seeds, the tuning table, every RL run accounted for,
   the RM's on-policy agreement with the true reward, and a hacking check.

The settings are `vlm_rewards.robotics.config.PipelineConfig`; this module runs the stages.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

from vlm_rewards.config import deep_merge
from vlm_rewards.robotics.config import CollectConfig, Condition, PipelineConfig, RewardChoice, RLConfig
from vlm_rewards.robotics.report import ProtocolRuns, select_candidate, write_report
from vlm_rewards.tracking import Track
from vlm_rewards.training.config import TrainRMConfig

logger = logging.getLogger("vlm_rewards.robotics.pipeline")


class Pipeline:
    def __init__(self, config: PipelineConfig, track: Track | None = None):
        self.config, self.track = config, track
        self.root = Path(config.output_dir)

    @property
    def episode_steps(self) -> int:
        import gymnasium as gym

        import vlm_rewards.robotics.envs  # noqa: F401 - registers the tasks

        return self.config.env.max_episode_steps or gym.spec(self.config.env.id).max_episode_steps

    # ------------------------------------------------------------------ data and reward model

    def collect(self) -> None:
        from vlm_rewards.robotics.collect import collect

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

    def training_data(self, rounds: int = 0) -> Path | list[Path]:
        """The progress stages' training episodes: this run's, `earlier_training_data`, and the first
        `rounds` rounds' rollouts."""
        folders = [self.root / f"round{k}" / "data" / "train" for k in range(1, rounds + 1)]
        own = self.root / "data" / "train"
        extra = [*self.config.earlier_training_data, *folders]
        return [own, *extra] if extra else own

    def train_stage(self, stage: TrainRMConfig, output_dir: Path, backbone: str, rounds: int = 0) -> Path:
        """Train one progress stage from `backbone` unless its model exists; its folder."""
        from vlm_rewards.training.train import run_training

        model = stage.model.model_copy(update={"backbone": backbone})
        episodes = {"train": self.training_data(rounds), "eval": self.root / "data" / "eval_1x"}
        data = stage.data.model_copy(update=episodes)
        if not (output_dir / "model").is_dir():
            run_training(stage.model_copy(update={"output_dir": output_dir, "model": model, "data": data}), self.track)
        return output_dir

    def train_reward_model(self) -> Path:
        """Train the RM stages, each skipped when its model exists; the last progress stage's folder."""
        from vlm_rewards.training.train import run_training

        config = self.config
        backbone = config.progress_rm.model.backbone
        if config.preference_stage is not None:
            stage1 = config.preference_stage.model_copy(update={"output_dir": self.root / "rm_stage1"})
            if not (stage1.output_dir / "model").is_dir():
                run_training(stage1, self.track)
            backbone = str(stage1.output_dir / "model")
        stages = [config.progress_rm, *config.continued_progress_stages()]
        for index, stage in enumerate(stages):  # each progress stage starts from the model before it
            output_dir = self.train_stage(stage, self.root / ("rm" if index == 0 else f"rm_cont{index}"), backbone)
            backbone = str(output_dir / "model")
        return output_dir

    def learned_reward(self, stage_dir: Path) -> dict:
        """The reward config of the model in `stage_dir`, read frame by frame with `reward_window`."""
        reward = {
            "kind": "trained_rm",
            "name": "pipeline_progress_rm",
            "model": str((stage_dir / "model").resolve()),
            "device": self.config.rl.device,
            "batch_size": 16,
        }
        if self.config.reward_shifts is not None:
            reward = {"kind": "shift_average", "reward": reward, **self.config.reward_shifts.model_dump()}
        if self.config.reward_window is None:
            return reward
        return {"kind": "frame_window", "reward": reward, **self.config.reward_window.model_dump()}

    def write_reward_yaml(self, stage_dir: Path) -> Path:
        """`stage_dir/reward.yaml`: for the person, and for the RL configs, which name the reward by its file."""
        path = stage_dir / "reward.yaml"
        path.write_text(yaml.safe_dump(self.learned_reward(stage_dir), sort_keys=False))
        return path

    def evaluate_reward_model(self, reward: dict) -> dict[str, dict]:
        from vlm_rewards.evaluation.config import EvalRMConfig
        from vlm_rewards.evaluation.evaluate import run_eval
        from vlm_rewards.registry import build_reward

        model = build_reward(reward)
        metrics = {}
        for factor in self.config.eval_length_factors:
            eval_config = EvalRMConfig(
                reward=reward,
                episodes=self.root / "data" / f"eval_{factor}x",
                output_dir=self.root / f"eval_rm_{factor}x",
                clip_frames=self.config.progress_rm.data.clip_frames,
            )
            metrics[f"{factor}x"] = run_eval(eval_config, self.track, reward=model)
        return metrics

    # ------------------------------------------------------------------ RL

    def rl_config(
        self,
        condition: Condition,
        seed: int,
        reward_yaml: Path,
        run_dir: Path | None = None,
        update: dict | None = None,
    ) -> RLConfig:
        """The `vlmr rl` config of one condition and seed: the `rl` section (with `update` merged in: a tuning
        candidate's, a round's) with this run's folder (default `rl/<condition>_seed<seed>`), env, reward and
        seed, validated as a whole."""
        rl = self.config.rl_section(update or {})
        reward_configs = {"learned": str(reward_yaml), "scripted": self.config.scripted_reward_config}
        reward = RewardChoice(
            source="learned" if condition in reward_configs else condition,
            config=reward_configs.get(condition),
            wrapper=rl.reward.wrapper,
        )
        run_dir = run_dir or self.root / "rl" / f"{condition}_seed{seed}"
        update = {"run_dir": str(run_dir), "env": self.config.env, "reward": reward, "seed": seed}
        return RLConfig(**{**dict(rl), **update})

    @staticmethod
    def train_rl(config: RLConfig) -> Path:
        """`vlmr rl` with `config`, skipped when the run already reached its budget; the run folder."""
        from vlm_rewards.robotics.rl import run_rl

        run_dir = Path(config.run_dir)
        summary = run_dir / "summary.json"
        if summary.is_file() and json.loads(summary.read_text())["timesteps"] >= config.total_timesteps:
            logger.info("RL: %s is finished; skipped", run_dir)
        else:
            logger.info("RL: %s, seed %d -> %s", config.reward.source, config.seed, run_dir)
            run_rl(config)
        return run_dir

    def train_runs(self, configs: list[RLConfig]) -> list[Path]:
        """`train_rl` of every config, `rl_workers` at a time (each in its own process); their run folders."""
        workers = min(self.config.rl_workers, len(configs))
        if workers <= 1:
            return [self.train_rl(config) for config in configs]
        threads = max(1, (os.cpu_count() or 1) // workers)
        spawn = multiprocessing.get_context("spawn")  # no forked copy of this process's torch and render state
        with ProcessPoolExecutor(workers, mp_context=spawn, initializer=_worker_setup, initargs=(threads,)) as pool:
            return list(pool.map(self.train_rl, configs))

    def off_test_update(self, update: dict) -> dict:
        """`update` for a run that is not a test run: evaluated on the tuning evaluation seeds."""
        return deep_merge(update, {"eval": {"seed_start": self.config.tuning.eval_seed_start}})

    def run_round(self, index: int, stage_dir: Path) -> tuple[Path, list[Path]]:
        """rounds[index]: RL with the RM in `stage_dir` keeping every checkpoint's policy, rollouts of them,
        and the RM trained further on those beside all the data before; the new RM's folder and the RL runs."""
        round_, folder = self.config.rounds[index], self.root / f"round{index + 1}"
        reward_yaml = self.write_reward_yaml(stage_dir)
        update = self.off_test_update(deep_merge(round_.rl, {"keep_policy_snapshots": True}))
        run_dirs = self.train_runs(
            [
                self.rl_config("learned", seed, reward_yaml, folder / "rl" / f"learned_seed{seed}", update)
                for seed in round_.seeds
            ]
        )
        self.collect_snapshots(index, run_dirs, folder / "data" / "train")
        stage = self.config.round_progress_stage(index)
        return self.train_stage(stage, folder / "rm", str(stage_dir / "model"), rounds=index + 1), run_dirs

    def collect_snapshots(self, index: int, run_dirs: list[Path], output: Path) -> None:
        """Rollouts of every policy snapshot of `run_dirs` (`checkpoints/model_<steps>.zip`), unless collected."""
        from vlm_rewards.robotics.collect import collect

        if (output / "meta.json").is_file():
            return
        algo = self.config.rl_section(self.config.rounds[index].rl).algo
        checkpoints = {}  # named seed<s>_<steps>
        for run in run_dirs:
            for path in sorted((run / "checkpoints").glob("model_*.zip")):
                name = f"{run.name.removeprefix('learned_')}_{int(path.stem.removeprefix('model_'))}"
                checkpoints[name] = {"path": str(path), "algo": algo}
        if not checkpoints:
            raise ValueError(f"rounds[{index}]: no policy snapshots (checkpoints/model_<steps>.zip) in {run_dirs}")
        episodes = {name: self.config.rounds[index].episodes for name in checkpoints}
        job = self.config.collect.model_dump() | {
            "env": self.config.env.model_dump(),
            "episodes": episodes,
            "checkpoints": checkpoints,
            "seed": self.config.round_seed(index),
            "output": str(output),
        }
        collect(CollectConfig.model_validate(job), self.track)

    def tune(self, reward_yaml: Path) -> dict[str, list[Path]]:
        """Every tuning candidate on every tuning seed with `tuning.condition`; the runs per candidate."""
        tuning = self.config.tuning
        configs = {
            name: [
                self.rl_config(
                    tuning.condition,
                    seed,
                    reward_yaml,
                    self.root / "tuning" / f"{name}_seed{seed}",
                    self.off_test_update(update),
                )
                for seed in self.config.tuning_seeds
            ]
            for name, update in tuning.candidates.items()
        }
        return self.train_grouped(configs)

    def train_grouped(self, configs: dict[str, list[RLConfig]]) -> dict[str, list[Path]]:
        """`train_runs` over every group's configs together; the run folders per group."""
        self.train_runs([config for group in configs.values() for config in group])
        return {name: [Path(config.run_dir) for config in group] for name, group in configs.items()}

    def run_tests(self, reward_yaml: Path, update: dict) -> dict[str, list[Path]]:
        """Every condition on every test seed, once, with the chosen candidate's `update`."""
        configs = {
            condition: [self.rl_config(condition, seed, reward_yaml, update=update) for seed in self.config.test_seeds]
            for condition in self.config.conditions
        }
        return self.train_grouped(configs)

    def rollout_voc(self, reward: str | Path | dict, run_dirs: list[Path]) -> dict[str, list[dict]]:
        """The RM's VOC on the policy's own evaluation rollouts (`videos/eval_<steps>.mp4`, the first
        evaluation seed) as training goes: does the reward stay faithful off the demo distribution?
        `reward` is a reward config: a YAML path, a shipped name or a mapping."""
        from vlm_rewards.evaluation.metrics import voc
        from vlm_rewards.interface import REFERENCE, RewardRequest
        from vlm_rewards.media import read_clip
        from vlm_rewards.registry import build_reward
        from vlm_rewards.robotics.envs import make_env

        model = build_reward(reward)
        env = make_env(self.config.env)
        env.reset(seed=self.config.rl.eval.seed_start)
        instruction = env.unwrapped.instruction
        goal = env.unwrapped.render_goal(self.config.env.camera)[None] if REFERENCE in model.spec.requires else None
        env.close()
        history = {}
        for run_dir in run_dirs:
            videos = sorted((run_dir / "videos").glob("eval_*.mp4"))
            requests = [RewardRequest(read_clip(video), instruction, reference=goal) for video in videos]
            results = model.score(requests) if requests else []
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
        config = self.config
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        self.collect()
        stage_dir = self.train_reward_model()
        round_runs = []
        for index in range(len(config.rounds)):
            stage_dir, run_dirs = self.run_round(index, stage_dir)
            round_runs.append(run_dirs)
        reward, reward_yaml = self.learned_reward(stage_dir), self.write_reward_yaml(stage_dir)
        rm_metrics = self.evaluate_reward_model(reward)
        tuning = self.tune(reward_yaml)
        chosen = select_candidate(tuning, config.tuning.rule)[0] if tuning else None
        test = self.run_tests(reward_yaml, config.tuning.candidates.get(chosen, {}))
        runs = ProtocolRuns(test=test, tuning=tuning, rule=config.tuning.rule, rounds=round_runs)
        test_dirs = [d for dirs in test.values() for d in dirs]
        voc_history = self.rollout_voc(reward, test_dirs) if config.rl.eval.video else {}
        return write_report(self.root, rm_metrics, runs, voc_history, config.hacking_rise)


def run_pipeline(config: PipelineConfig, track: Track | None = None) -> Path:
    return Pipeline(config, track).run()


def _worker_setup(threads: int) -> None:
    """An RL worker process: its share of the cores, and its runs' log lines on stderr."""
    import torch

    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(processName)s %(message)s")
