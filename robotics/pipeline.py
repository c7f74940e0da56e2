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
5. `report.md` + `success_curves.png` + `reward_fidelity.png` (vlm_rewards.robotics.report): success rate
   vs env steps (mean ± std over seeds), the RM's on-policy agreement with the true reward as training
   goes, and a hacking check.

The settings are `vlm_rewards.robotics.config.PipelineConfig`; this module runs the stages.
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from vlm_rewards.robotics.config import Condition, PipelineConfig, RewardChoice, RLConfig
from vlm_rewards.robotics.report import write_report
from vlm_rewards.tracking import Track

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

    # ------------------------------------------------------------------ stages

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
        if self.config.reward_window is None:
            return reward
        return {"kind": "frame_window", "reward": reward, **self.config.reward_window.model_dump()}

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

    def rl_config(self, condition: Condition, seed: int, reward_yaml: Path) -> RLConfig:
        """The `vlmr rl` config of one condition and seed: the `rl` section with this run's folder, env,
        reward and seed, validated as a whole."""
        reward_configs = {"learned": str(reward_yaml), "scripted": self.config.scripted_reward_config}
        reward = RewardChoice(
            source="learned" if condition in reward_configs else condition,
            config=reward_configs.get(condition),
            wrapper=self.config.rl.reward.wrapper,
        )
        run_dir = str(self.root / "rl" / f"{condition}_seed{seed}")
        update = {"run_dir": run_dir, "env": self.config.env, "reward": reward, "seed": seed}
        return RLConfig(**{**dict(self.config.rl), **update})

    def run_rl(self, reward_yaml: Path) -> dict[str, list[Path]]:
        from vlm_rewards.robotics.rl import run_rl

        runs: dict[str, list[Path]] = {}
        for condition in self.config.conditions:
            for seed in self.config.seeds:
                rl_config = self.rl_config(condition, seed, reward_yaml)
                logger.info("RL: %s, seed %d -> %s", condition, seed, rl_config.run_dir)
                run_rl(rl_config)
                runs.setdefault(condition, []).append(Path(rl_config.run_dir))
        return runs

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
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.yaml").write_text(yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False))
        self.collect()
        stage_dir = self.train_reward_model()
        reward = self.learned_reward(stage_dir)
        # written for the person, and for the learned runs' configs, which name the reward by its file
        reward_yaml = stage_dir / "reward.yaml"
        reward_yaml.write_text(yaml.safe_dump(reward, sort_keys=False))
        rm_metrics = self.evaluate_reward_model(reward)
        runs = self.run_rl(reward_yaml)
        run_dirs = [d for ds in runs.values() for d in ds]
        voc_history = self.rollout_voc(reward, run_dirs) if self.config.rl.eval.video else {}
        return write_report(self.root, rm_metrics, runs, voc_history, self.config.hacking_rise)


def run_pipeline(config: PipelineConfig, track: Track | None = None) -> Path:
    return Pipeline(config, track).run()
