"""The README's main job (`vlmr pipeline`) in a reduced size, and its report helpers."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from vlm_rewards.cli import app
from vlm_rewards.media import write_video
from vlm_rewards.robotics.envs import make_env
from vlm_rewards.robotics.pipeline import Pipeline, PipelineConfig
from vlm_rewards.robotics.report import ProtocolRuns, hacking_check, steps_to_reach, success_statistics, write_report

runner = CliRunner()
REDUCED = [
    "env.num_envs=2", "env.width=32", "env.height=32", "env.max_episode_steps=10",
    "collect.episodes={expert: 3, noisy: 1, wrong_object: 2, random: 1}",
    "eval_episodes={expert: 2, noisy: 1, wrong_object: 1, random: 1}",
    "preference_stage={model: {backbone: tiny, reward: {task: preference, head: scalar}}, optim: {steps: 2}, "
    "data: {synthetic_train: {num_episodes: 16, num_pairs: 16}, synthetic_eval: {num_episodes: 8, num_pairs: 8}}}",
    "progress_rm.optim.steps=3", "progress_rm.eval_every=3", "progress_rm.save_every=3",
    "progress_rm.data.clip_frames=4",
    "rl.total_timesteps=80", "rl.eval.every=40", "rl.eval.episodes=2", "rl.sac.learning_starts=20",
    "conditions=[sparse, learned, goal_image, scripted, oracle]", "env.sparse_step_cost=1",
    "progress_rm_continued=[{optim: {steps: 2}, data: {clip_frames: null}}]",
    "reward_window={window: 2}",
    "rounds=[{seeds: [100], rl: {total_timesteps: 40, checkpoint_every: 20}, episodes: 1, "
    "progress_rm: {optim: {steps: 2}}}]",
    "tuning={candidates: {x5: {reward: {wrapper: {scale: 5.0}}}}}", "tuning_seeds=[7]", "test_seeds=[0]",
    "rl_workers=2",  # the test runs go through the pool of worker processes
]  # fmt: skip


def test_pipeline_runs_every_stage_then_resumes_without_redoing_them(tmp_path):
    out = tmp_path / "pipeline"
    result = runner.invoke(app, ["pipeline", f"output_dir={out}", *REDUCED])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["rl"]) == {"sparse", "learned", "goal_image", "scripted", "oracle"}
    assert summary["tuning"]["chosen"] == "x5" and len(summary["runs"]) == 5 + 1 + 1  # test, tuning, round
    scripted = yaml.safe_load((out / "rl" / "scripted_seed0" / "config.yaml").read_text())
    assert (scripted["reward"]["source"], scripted["reward"]["config"]) == ("learned", "reach_marker_progress")
    assert scripted["env"]["sparse_step_cost"] == 1.0
    rm_1x, rm_2x = summary["reward_model"]["1x"], summary["reward_model"]["2x"]
    expected = {"voc_expert", "reward_policy_wrong_object", "mismatch_accuracy", "step_correlation_at_clip_frames"}
    assert expected <= set(rm_1x)
    assert rm_1x["version"] == rm_2x["version"]
    episodes = {name: json.loads((out / "data" / name / "meta.json").read_text())["num_episodes"]
                for name in ("train", "eval_1x", "eval_2x")}  # fmt: skip
    assert episodes == {"train": 7 * 3, "eval_1x": 5, "eval_2x": 5}  # each training rollout once per target
    learned_monitor = (out / "rl" / "learned_seed0" / "monitor.jsonl").read_text().splitlines()
    assert learned_monitor and "reward/corr_progress_true" in json.loads(learned_monitor[0])
    for name in ("report.md", "success_curves.png", "reward_fidelity.png", "rm/model/reward_model.json"):
        assert (out / name).is_file(), name
    # the continued stage trained on whole episodes from rm/'s model
    continued = json.loads(next((out / "rm_cont1" / "checkpoints").glob("step_*/train_config.json")).read_text())
    assert continued["model"]["backbone"] == str(out / "rm" / "model") and continued["data"]["clip_frames"] is None
    assert (continued["optim"]["steps"], continued["data"]["train"]) == (2, str(out / "data" / "train"))
    # the round: RL with rm_cont1's RM, rollouts of its snapshots at 20 and 40 steps, the RM trained on them
    round_rl = yaml.safe_load((out / "round1" / "rl" / "learned_seed100" / "config.yaml").read_text())
    assert round_rl["reward"]["config"] == str(out / "rm_cont1" / "reward.yaml")
    round_data = json.loads((out / "round1" / "data" / "train" / "meta.json").read_text())
    assert round_data["num_episodes"] == 2 * 3  # two snapshots, each rollout once per target
    round_rm = json.loads(next((out / "round1" / "rm" / "checkpoints").glob("step_*/train_config.json")).read_text())
    assert round_rm["model"]["backbone"] == str(out / "rm_cont1" / "model")
    assert round_rm["data"]["train"] == [str(out / "data" / "train"), str(out / "round1" / "data" / "train")]
    learned = yaml.safe_load((out / "rl" / "learned_seed0" / "config.yaml").read_text())
    assert learned["reward"]["config"] == str(out / "round1" / "rm" / "reward.yaml")  # RL uses the last RM
    assert learned["reward"]["wrapper"]["scale"] == 5.0  # the chosen candidate's
    oracle = yaml.safe_load((out / "rl" / "oracle_seed0" / "config.yaml").read_text())
    assert (oracle["reward"]["source"], oracle["reward"]["wrapper"]["scale"]) == ("oracle", 5.0)
    assert (out / "rl" / "oracle_seed0" / "monitor.jsonl").is_file()
    windowed = yaml.safe_load((out / "rm_cont1" / "reward.yaml").read_text())  # read frame by frame
    assert (windowed["kind"], windowed["window"], windowed["keep_first"]) == ("frame_window", 2, True)
    assert windowed["reward"]["model"] == str((out / "rm_cont1" / "model").resolve())
    report = (out / "report.md").read_text()
    assert "| learned | 1 |" in report and "| round 1 | learned_seed100 | 100 |" in report
    assert "| step_correlation_at_clip_frames |" in report

    kept = ("data/train/meta.json", "rm/model/reward_model.json", "rm_cont1/model/reward_model.json",
            "round1/rm/model/reward_model.json", "round1/data/train/meta.json", "rl/oracle_seed0/summary.json",
            "tuning/x5_seed7/summary.json")  # fmt: skip
    stamps = {out / path: (out / path).stat().st_mtime_ns for path in kept}
    result = runner.invoke(app, ["pipeline", f"output_dir={out}", *REDUCED])
    assert result.exit_code == 0, result.output
    assert {path: path.stat().st_mtime_ns for path in stamps} == stamps


def test_the_scripted_condition_takes_the_task_shipped_reward():
    assert PipelineConfig().scripted_reward_config == "reach_marker_progress"
    assert PipelineConfig(env={"highlights": False}).scripted_reward_config == "reach_marker_progress_matte"
    assert PipelineConfig(env={"id": "vlmr/Push-v0"}).scripted_reward_config == "push_marker_progress"
    with pytest.raises(ValueError, match="no shipped one for env.id 'vlmr/Push-v0' with env.highlights False"):
        PipelineConfig(env={"id": "vlmr/Push-v0", "highlights": False}, conditions=["sparse", "scripted"])
    carry = {"id": "vlmr/Carry-v0", "highlights": False}
    assert PipelineConfig(env=carry).scripted_reward_config == "carry_marker_progress_matte"
    assert PipelineConfig(scripted_reward="mine.yaml").scripted_reward_config == "mine.yaml"
    with pytest.raises(ValueError, match="no shipped one for env.id 'metaworld/reach-v3'"):
        PipelineConfig(env={"id": "metaworld/reach-v3"}, conditions=["sparse", "scripted"])
    PipelineConfig(env={"id": "metaworld/reach-v3"}, conditions=["sparse", "dense", "learned"])


def test_a_continued_progress_stage_is_checked_as_a_trainer_config():
    with pytest.raises(ValueError, match=r"progress_rm_continued\[1\]: .*optim.stpes"):
        PipelineConfig(progress_rm_continued=[{"optim": {"steps": 5}}, {"optim": {"stpes": 5}}])


def test_earlier_rounds_data_is_trained_on_beside_the_runs_own(tmp_path, monkeypatch):
    trained = []

    def fake_training(config, track=None):
        trained.append(config)
        (config.output_dir / "model").mkdir(parents=True)

    monkeypatch.setattr("vlm_rewards.training.train.run_training", fake_training)
    earlier = [tmp_path / "round1" / "data" / "train", tmp_path / "round2" / "data" / "train"]
    config = PipelineConfig(
        output_dir=tmp_path / "round3",
        preference_stage=None,
        earlier_training_data=earlier,
        progress_rm_continued=[{"optim": {"steps": 5}}],
    )
    Pipeline(config).train_reward_model()
    own = tmp_path / "round3" / "data" / "train"
    assert [stage.data.train for stage in trained] == [[own, *earlier], [own, *earlier]]
    assert trained[1].model.backbone == str(tmp_path / "round3" / "rm" / "model")

    trained.clear()
    Pipeline(PipelineConfig(output_dir=tmp_path / "alone", preference_stage=None)).train_reward_model()
    assert trained[0].data.train == tmp_path / "alone" / "data" / "train"  # one folder, read as before


def test_each_rl_run_config_is_built_and_validated_from_the_rl_section(tmp_path):
    pipeline = Pipeline(PipelineConfig(output_dir=tmp_path, test_seeds=[0, 3]))
    scripted = pipeline.rl_config("scripted", 3, tmp_path / "rm" / "reward.yaml")
    assert (scripted.reward.source, scripted.reward.config) == ("learned", "reach_marker_progress")
    assert (scripted.run_dir, scripted.seed) == (str(tmp_path / "rl" / "scripted_seed3"), 3)
    assert scripted.env == pipeline.config.env and scripted.reward.wrapper.scale == 10.0
    learned = pipeline.rl_config("learned", 0, tmp_path / "rm" / "reward.yaml")
    assert learned.reward.config == str(tmp_path / "rm" / "reward.yaml")
    assert pipeline.rl_config("dense", 0, tmp_path / "r.yaml").reward.source == "dense"
    # the section's own reward is sparse, so only a learned run's config meets the shaping-discount check
    mismatched = Pipeline(PipelineConfig(output_dir=tmp_path, rl={"reward": {"wrapper": {"gamma": 0.9}}}))
    with pytest.raises(ValueError, match=r"reward.wrapper.gamma=0.9 differs from ppo.gamma=0.99"):
        mismatched.rl_config("learned", 0, tmp_path / "r.yaml")


def test_the_learned_reward_names_the_last_stage_model_and_its_window(tmp_path):
    plain = Pipeline(PipelineConfig(reward_window=None)).learned_reward(tmp_path / "rm")
    assert (plain["kind"], plain["model"], plain["device"]) == ("trained_rm", str(tmp_path / "rm" / "model"), "cpu")
    windowed = Pipeline(PipelineConfig(reward_window={"window": 2})).learned_reward(tmp_path / "rm")
    assert windowed == {"kind": "frame_window", "reward": plain, "window": 2, "keep_first": True}
    shifted = Pipeline(PipelineConfig(reward_shifts={"max_shift": 6})).learned_reward(tmp_path / "rm")
    assert shifted["reward"] == {"kind": "shift_average", "reward": plain, "max_shift": 6, "points": 3}


def test_held_out_policies_are_scripted_or_collect_checkpoints():
    with pytest.raises(ValueError, match=r"eval_episodes: .*\['trained'\]"):
        PipelineConfig(eval_episodes={"expert": 2, "trained": 2})
    PipelineConfig(eval_episodes={"trained": 2}, collect={"checkpoints": {"trained": {"path": "model.zip"}}})


def test_held_out_and_rl_evaluation_seeds_never_reset_a_training_rollout_start():
    config = PipelineConfig(collect={"episodes": {"expert": 2400}}, eval_length_factors=[1, 2])
    starts = {config.held_out_seed(1), config.held_out_seed(2), config.rl.eval.seed_start}
    assert min(starts) >= config.collect.seed + 2400
    with pytest.raises(ValueError, match=r"collect \(training rollouts\) \(0..11999\) reach into those of rl.eval"):
        PipelineConfig(collect={"episodes": {"expert": 12000}})
    with pytest.raises(ValueError, match=r"rl.eval \(999990..1000009\) reach into those of eval_1x"):
        PipelineConfig(rl={"eval": {"seed_start": 999_990, "episodes": 20}})


def test_rollout_voc_gives_a_goal_conditioned_reward_the_goal_render(tmp_path):
    config = PipelineConfig(output_dir=str(tmp_path), env={"width": 32, "height": 32, "max_episode_steps": 8})
    env = make_env(config.env)
    env.reset(seed=config.rl.eval.seed_start)
    frames = [env.render()]
    for _ in range(5):
        env.step(env.action_space.sample())
        frames.append(env.render())
    env.close()
    run = tmp_path / "rl" / "learned_seed0"
    (run / "videos").mkdir(parents=True)
    write_video(run / "videos" / "eval_100.mp4", np.stack(frames))
    history = Pipeline(config).rollout_voc(Path("configs/rewards/goal_pixel_progress.yaml"), [run])
    (entry,) = history["learned_seed0"]
    assert entry["timesteps"] == 100 and 0.0 <= entry["final_progress"] <= 1.0


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_success_statistics_average_the_steps_all_seeds_share(tmp_path):
    runs = []
    for seed, rates in enumerate(([0.0, 0.5, 1.0], [0.0, 0.7, 0.9, 1.0])):
        run = tmp_path / f"run{seed}"
        run.mkdir()
        _write_jsonl(run / "eval.jsonl", [{"timesteps": 100 * (i + 1), "success_rate": r} for i, r in enumerate(rates)])
        runs.append(run)
    steps, mean, std = success_statistics(runs)
    np.testing.assert_array_equal(steps, [100, 200, 300])
    np.testing.assert_allclose(mean, [0.0, 0.6, 0.95])
    np.testing.assert_allclose(std, [0.0, 0.1, 0.05])
    assert steps_to_reach(steps, mean) == 300 and steps_to_reach(steps, mean, level=0.99) is None

    table = runner.invoke(app, ["compare-rl", str(tmp_path / "cmp.png"), f"mine={tmp_path}/run*", f"one={runs[0]}"])
    assert table.exit_code == 0, table.output
    assert "| mine | 2 | 0.95 ± 0.05 | 1.00, 0.90 | 0.95 | 300 |" in table.output
    assert "| one | 1 | 1.00 ± 0.00 | 1.00 | 1.00 | 300 |" in table.output
    assert (tmp_path / "cmp.png").stat().st_size > 0
    for curve, message in [(f"none={tmp_path}/nothing*", "none: expected RL run directories"), ("x", "label=glob")]:
        failed = runner.invoke(app, ["compare-rl", str(tmp_path / "bad.png"), curve])
        assert failed.exit_code == 2 and message in failed.output


def test_hacking_check_flags_learned_progress_up_with_success_flat(tmp_path):
    def monitor(progress):
        return [{"timesteps": i, "reward/learned_progress": p, "reward/corr_progress_true": 0.5} for i, p in
                enumerate(progress)]  # fmt: skip

    _write_jsonl(tmp_path / "monitor.jsonl", monitor(np.linspace(0.1, 0.9, 8)))
    _write_jsonl(tmp_path / "eval.jsonl", [{"timesteps": 8, "success_rate": 0.05}])
    assert hacking_check(tmp_path, rise=0.2)["hacked"]
    _write_jsonl(tmp_path / "eval.jsonl", [{"timesteps": 8, "success_rate": 0.9}])
    assert not hacking_check(tmp_path, rise=0.2)["hacked"]
    _write_jsonl(tmp_path / "monitor.jsonl", monitor(np.full(8, 0.4)))
    _write_jsonl(tmp_path / "eval.jsonl", [{"timesteps": 8, "success_rate": 0.0}])
    assert not hacking_check(tmp_path, rise=0.2)["hacked"]


def test_an_rm_only_report_has_the_rm_table_and_no_rl_plot(tmp_path):
    metrics = {"voc_expert": 0.8, "reward_policy_expert": 0.9}
    report = write_report(tmp_path, {"1x": metrics, "2x": metrics}, ProtocolRuns(test={}), {}, hacking_rise=0.2)
    assert "| voc_expert | 0.800 | 0.800 |" in report.read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["rl"] == {}
    assert not (tmp_path / "success_curves.png").exists()  # no RL conditions: nothing to draw
