import json

import numpy as np
import pytest
import torch
from stable_baselines3 import PPO
from typer.testing import CliRunner

from vlm_rewards.cli import app
from vlm_rewards.data.episodes import EpisodeDataset
from vlm_rewards.robotics.collect import Rollout, progress_labels
from vlm_rewards.robotics.config import RLConfig
from vlm_rewards.robotics.rl import RLRun

runner = CliRunner()
TINY_ENV = {"num_envs": 2, "width": 16, "height": 16, "max_episode_steps": 12}


def test_collect_cli_writes_a_readable_episode_dataset(tmp_path):
    out = tmp_path / "reach"
    overrides = [f"output={out}", "env.num_envs=2", "env.width=16", "env.height=16", "env.max_episode_steps=20",
                 "episodes={expert: 2, noisy: 1, wrong_object: 1, random: 1}", "progress_label=time"]  # fmt: skip
    result = runner.invoke(app, ["collect", "configs/robotics/collect_reach.yaml", *overrides])
    assert result.exit_code == 0, result.output
    dataset = EpisodeDataset(out)
    assert len(dataset) == 5 and dataset.meta["clips"] == ["frames", "view.front", "reference"]
    episodes = list(dataset)
    by_policy = {e.policy: e for e in episodes}
    assert set(by_policy) == {"expert", "noisy", "wrong_object", "random"}
    expert = by_policy["expert"]
    assert expert.success and expert.progress[0] == 0 and expert.progress[-1] == 1
    assert expert.frames.shape == (11, 16, 16, 3) and expert.views["front"].shape == expert.frames.shape  # stride 2
    assert not by_policy["wrong_object"].success and np.all(by_policy["wrong_object"].progress == 0)
    assert "reach the" in expert.instruction and expert.reference.shape == (1, 16, 16, 3)


@pytest.mark.parametrize("env_id, steps", [("vlmr/Reach-v0", 20), ("vlmr/Carry-v0", 40)])
def test_relabel_targets_writes_each_rollout_once_per_target(tmp_path, env_id, steps):
    """Reach: once per target disc; Carry: once per zone."""
    from vlm_rewards.robotics.collect import collect
    from vlm_rewards.robotics.config import CollectConfig

    env = {"id": env_id, "num_envs": 2, "width": 16, "height": 16, "max_episode_steps": steps, "table": "gradient"}
    config = CollectConfig(output=str(tmp_path / "relabel"), env=env, episodes={"expert": 2, "wrong_object": 1},
                           views=[], frame_stride=1, relabel_targets=True, goal_reference=False)  # fmt: skip
    episodes = list(collect(config))
    assert len(episodes) == 3 * 3  # 3 rollouts x (named target or zone + 2 distractors)
    for start in range(0, 9, 3):
        named, *others = episodes[start : start + 3]
        assert named.policy in ("expert", "wrong_object") and named.reference is None
        assert all(o.policy == f"{named.policy}_relabelled" for o in others)
        assert len({named.instruction, *(o.instruction for o in others)}) == 3  # one per colour
        for other in others:
            assert np.array_equal(other.frames, named.frames) and other.progress[0] == 0
            assert not np.array_equal(other.progress, named.progress)
        if named.policy == "wrong_object":  # it reached a distractor: that relabelled copy succeeds
            assert not named.success and sum(o.success for o in others) == 1
        else:
            assert named.success and named.progress[-1] == 1 and not any(o.success for o in others)
    with pytest.raises(ValueError, match="goal_reference"):
        collect(config.model_copy(update={"goal_reference": True}))


def test_distance_labels_are_the_frames_own_goal_distance(tmp_path):
    """progress_label=distance: 1 − |goal offset| / distance_scale (1 once reached), whatever the episode's start;
    relabelled copies measure toward their own target."""
    from vlm_rewards.robotics.collect import collect
    from vlm_rewards.robotics.config import CollectConfig

    env = {"id": "vlmr/Reach-v0", "num_envs": 2, "width": 16, "height": 16, "max_episode_steps": 20}
    config = CollectConfig(output=str(tmp_path / "distance"), env=env, episodes={"expert": 2, "wrong_object": 1},
                           views=[], frame_stride=1, relabel_targets=True, goal_reference=False,
                           progress_label="distance", distance_scale=1.5)  # fmt: skip
    episodes = list(collect(config))
    assert len(episodes) == 9
    for episode in episodes:
        own_distance = np.clip(1 - np.linalg.norm(episode.goal_offset, axis=-1) / 1.5, 0, 1)
        np.testing.assert_allclose(episode.progress, np.where(episode.frame_success, 1.0, own_distance), atol=1e-6)
    experts = [e for e in episodes if e.policy == "expert"]
    assert all(e.success and e.progress[-1] == 1 and 0 < e.progress[0] < 1 for e in experts)
    assert sum(e.success for e in episodes if e.policy == "wrong_object_relabelled") == 1
    with pytest.raises(ValueError, match="distance measures toward one goal"):
        collect(CollectConfig(**{**config.model_dump(), "env": {**env, "id": "vlmr/Carry-v0"}}))


def test_stage_labels_follow_the_stages():
    before = [{"progress": 0.0, "is_success": False, "stage": stage} for stage in (0, 0, 1, 1)]
    infos = before + [{"progress": 1.0, "is_success": True, "stage": 2}] * 2
    frames = {"top": [np.full((4, 4, 3), 10 * t, np.uint8) for t in range(6)]}
    labels = progress_labels(Rollout("expert", frames, infos, None), "stage", (0.2, 0.8), "top", 2.0)
    np.testing.assert_allclose(labels[[0, 2, 4, 5]], [0.0, 0.2, 1.0, 1.0], atol=1e-6)
    assert np.all(np.diff(labels) >= 0)
    failed = [dict(info, is_success=False) for info in infos]
    assert np.all(progress_labels(Rollout("random", frames, failed, None), "time", (1.0,), "top", 2.0) == 0)


@pytest.mark.slow
def test_tiny_ppo_run_with_a_goal_image_reward_writes_its_folder_and_resumes(tmp_path):
    config = RLConfig(
        run_dir=str(tmp_path / "run"), total_timesteps=128, env=TINY_ENV,
        reward={"source": "goal_image", "wrapper": {"normalize": True, "success_bonus": 1.0}},
        ppo={"n_steps": 32, "batch_size": 32, "n_epochs": 1}, eval={"every": 64, "episodes": 2}, checkpoint_every=64,
    )  # fmt: skip
    run = RLRun(config)
    summary = run.train()
    run.close()
    folder = tmp_path / "run"
    for name in ("config.yaml", "progress.csv", "eval.jsonl", "monitor.jsonl", "learning_curve.png",
                 "summary.json", "checkpoints/model.zip", "checkpoints/state.json"):  # fmt: skip
        assert (folder / name).is_file(), name
    assert list((folder / "videos").glob("eval_*.mp4")) and list(folder.glob("events.out.tfevents*"))
    assert summary["timesteps"] == 128
    monitor = [json.loads(line) for line in (folder / "monitor.jsonl").read_text().splitlines()]
    assert monitor[-1]["reward/calls_per_step"] == 1.0 and "reward/corr_progress_true" in monitor[-1]
    state = json.loads((folder / "checkpoints/state.json").read_text())
    assert state["num_timesteps"] == 128 and state["normalizer"]["count"] == 128 + 1  # the rewards and the prior

    resumed = RLRun(config.model_copy(update={"total_timesteps": 192}))
    assert resumed.model.num_timesteps == 128
    assert resumed.streams.normalizer.state_dict() == state["normalizer"]  # the normaliser round-trips
    assert resumed.train()["timesteps"] == 192
    resumed.close()
    assert [e["timesteps"] for e in resumed.eval_history] == [64, 128, 192]


@pytest.mark.slow
def test_tiny_sac_run_with_the_dense_reward(tmp_path):
    config = RLConfig(
        run_dir=str(tmp_path / "sac"), algo="sac", total_timesteps=96, env=TINY_ENV, reward={"source": "dense"},
        sac={"learning_starts": 32, "batch_size": 32, "buffer_size": 1000}, eval={"every": 96, "episodes": 1,
        "video": False}, checkpoint_every=96,
    )  # fmt: skip
    run = RLRun(config)
    assert run.train()["timesteps"] == 96
    run.close()
    assert (tmp_path / "sac/checkpoints/replay_buffer.pkl").is_file()


def test_a_learned_reward_that_needs_a_goal_image_gets_the_goal_render(tmp_path):
    config = RLConfig(
        run_dir=str(tmp_path / "goal_rm"), algo="sac", total_timesteps=24, env=TINY_ENV,
        reward={"source": "learned", "config": "configs/rewards/goal_pixel_progress.yaml"},
        sac={"learning_starts": 12, "batch_size": 8, "buffer_size": 100}, eval={"every": 24, "episodes": 1,
        "video": False}, checkpoint_every=12, keep_policy_snapshots=True,
    )  # fmt: skip
    assert not config.reward.wrapper.goal_image
    run = RLRun(config)
    assert run.train()["timesteps"] == 24
    run.close()
    snapshots = sorted(path.name for path in (tmp_path / "goal_rm/checkpoints").glob("model_*.zip"))
    assert snapshots == ["model_00000012.zip", "model_00000024.zip"]  # the policy at each checkpoint, kept
    monitor = [json.loads(line) for line in (tmp_path / "goal_rm/monitor.jsonl").read_text().splitlines()]
    assert monitor and np.isfinite(monitor[-1]["reward/learned_progress"])


class Killed(Exception):
    """Stands for a SIGKILL: the run stops mid-training, its folder as the kill left it."""


def kill_at(monkeypatch, step: int) -> None:
    from vlm_rewards.robotics.callbacks import EvalCheckpointCallback

    on_step = EvalCheckpointCallback._on_step

    def killing(self):
        if self.num_timesteps >= step:
            raise Killed
        return on_step(self)

    monkeypatch.setattr(EvalCheckpointCallback, "_on_step", killing)


def logged_steps(folder) -> dict[str, list[float]]:
    import csv

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with open(folder / "progress.csv") as handle:
        rows = list(csv.DictReader(handle))
    board = EventAccumulator(str(folder))
    board.Reload()
    return {
        "progress.csv": [float(row["time/total_timesteps"]) for row in rows],
        "eval.jsonl": [e["timesteps"] for e in map(json.loads, (folder / "eval.jsonl").read_text().splitlines())],
        "monitor.jsonl": [e["timesteps"] for e in map(json.loads, (folder / "monitor.jsonl").read_text().splitlines())],
        "tensorboard": [event.step for event in board.Scalars("reward/learned_progress")],
    }


@pytest.mark.slow
def test_a_resumed_rl_run_logs_each_step_once(tmp_path, monkeypatch):
    """Killed after its checkpoint at step 64, a run's logs hold steps up to 96 from a policy the rerun
    discards: the rerun cuts them back to 64 and appends, so they match an uninterrupted run's."""
    config = RLConfig(
        run_dir=str(tmp_path / "killed"), total_timesteps=160, env=TINY_ENV | {"max_episode_steps": 8},
        reward={"source": "goal_image"}, ppo={"n_steps": 16, "batch_size": 32, "n_epochs": 1},
        eval={"every": 32, "episodes": 1}, checkpoint_every=64,
    )  # fmt: skip
    killed = tmp_path / "killed"
    with monkeypatch.context() as patch:
        kill_at(patch, 100)
        run = RLRun(config)
        with pytest.raises(Killed):
            run.train()
        run.close()
    assert json.loads((killed / "checkpoints/state.json").read_text())["num_timesteps"] == 64
    assert logged_steps(killed)["eval.jsonl"] == [32, 64, 96] and (killed / "videos/eval_00000096.mp4").is_file()

    resumed = RLRun(config)
    assert [e["timesteps"] for e in resumed.eval_history] == [32, 64]
    assert not (killed / "videos/eval_00000096.mp4").exists()  # the discarded policy's
    resumed.train()
    resumed.close()
    straight = RLRun(config.model_copy(update={"run_dir": str(tmp_path / "straight")}))
    straight.train()
    straight.close()
    steps = [32, 64, 96, 128, 160]
    assert logged_steps(killed) == logged_steps(tmp_path / "straight") == dict.fromkeys(logged_steps(killed), steps)


def test_a_checkpoint_holds_the_policy_after_the_update_on_its_rollout(tmp_path):
    """Saved before that update, a resumed run would never make it: the checkpoint at step 64 must be the policy
    that a run of 64 steps ends with."""
    config = RLConfig(
        run_dir=str(tmp_path / "long"), total_timesteps=128, env=TINY_ENV, reward={"source": "dense"},
        ppo={"n_steps": 16, "batch_size": 32, "n_epochs": 1}, eval={"every": 128, "episodes": 1, "video": False},
        checkpoint_every=64, keep_policy_snapshots=True,
    )  # fmt: skip
    for run_config in (config, config.model_copy(update={"run_dir": str(tmp_path / "short"), "total_timesteps": 64})):
        run = RLRun(run_config)
        run.train()
        run.close()
    checkpoint = PPO.load(tmp_path / "long/checkpoints/model_00000064.zip", device="cpu")
    short = PPO.load(tmp_path / "short/checkpoints/model.zip", device="cpu")
    for saved, trained in zip(checkpoint.policy.parameters(), short.policy.parameters(), strict=True):
        assert torch.equal(saved, trained)


def test_a_device_this_machine_lacks_is_refused_when_the_rl_job_starts(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["rl", "configs/robotics/rl_reach_sparse.yaml", "device=cuda", f"run_dir={run_dir}"])
    assert result.exit_code == 2, result.output
    assert "device 'cuda': CUDA is not available on this machine" in result.stderr
    assert not run_dir.exists()


def test_collect_refuses_a_non_empty_output_folder_before_any_rollout(tmp_path, monkeypatch):
    def no_rollouts(*args, **kwargs):
        raise AssertionError("a rollout ran")

    monkeypatch.setattr("vlm_rewards.robotics.collect.run_rollouts", no_rollouts)
    out = tmp_path / "reach"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["collect", "configs/robotics/collect_reach.yaml", f"output={out}"])
    assert result.exit_code == 2, result.output
    assert f"collect: output '{out}': {out} exists and is not an empty folder" in result.stderr
    assert "Traceback" not in result.output and (out / "notes.txt").read_text() == "mine"


def test_rl_config_refuses_inconsistent_settings():
    with pytest.raises(ValueError, match="gamma"):
        RLConfig(reward={"source": "goal_image", "wrapper": {"gamma": 0.9}})
    with pytest.raises(ValueError, match="needs reward.config"):
        RLConfig(reward={"source": "learned"})


def test_collect_rolls_out_a_trained_sb3_policy(tmp_path):
    """A `checkpoints` policy acts in collection as it does stepped by hand, labelled with the env's progress."""
    from stable_baselines3 import SAC

    from vlm_rewards.robotics.collect import collect
    from vlm_rewards.robotics.config import CollectConfig, EnvConfig
    from vlm_rewards.robotics.envs import make_env

    env_config = EnvConfig(num_envs=1, width=16, height=16, max_episode_steps=10)
    env = make_env(env_config, terminate_on_success=False)
    SAC("MlpPolicy", env, seed=3, device="cpu").save(tmp_path / "policy.zip")
    policy = SAC.load(tmp_path / "policy.zip", device="cpu")
    obs, info = env.reset(seed=0)
    frames, progress = [info["frames"]["top"]], [info["progress"]]
    for _ in range(10):
        obs, _, _, _, info = env.step(policy.predict(obs, deterministic=True)[0])
        frames.append(info["frames"]["top"])
        progress.append(info["progress"])

    config = CollectConfig(
        output=str(tmp_path / "rollouts"), env=env_config, episodes={"trained": 1}, views=[], frame_stride=1,
        checkpoints={"trained": {"path": str(tmp_path / "policy.zip"), "deterministic": True}},
    )  # fmt: skip
    (episode,) = list(collect(config))
    assert episode.policy == "trained"
    np.testing.assert_array_equal(episode.frames, np.stack(frames))
    np.testing.assert_allclose(episode.progress, progress, atol=1e-6)

    sampling = config.model_dump() | {"checkpoints": {"trained": {"path": str(tmp_path / "policy.zip")}}}
    first, second = (list(collect(CollectConfig(**sampling | {"output": str(tmp_path / name)}))) for name in "ab")
    np.testing.assert_array_equal(first[0].frames, second[0].frames)  # sampled actions, seeded by the config
    assert not np.array_equal(first[0].frames, episode.frames)


def test_collect_refuses_unusable_checkpoint_policies(tmp_path):
    from stable_baselines3 import SAC

    from vlm_rewards.robotics.collect import collect
    from vlm_rewards.robotics.config import CollectConfig, EnvConfig
    from vlm_rewards.robotics.envs import make_env

    with pytest.raises(ValueError, match=r"episodes names policies \['trained'\]"):
        CollectConfig(episodes={"trained": 1})
    with pytest.raises(ValueError, match="name of a scripted policy"):
        CollectConfig(episodes={"expert": 1}, checkpoints={"expert": {"path": "policy.zip"}})
    missing = CollectConfig(output=str(tmp_path / "a"), episodes={"trained": 1},
                            checkpoints={"trained": {"path": str(tmp_path / "none.zip")}})  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"checkpoints.trained.path .*none.zip"):
        collect(missing)
    reach = make_env(EnvConfig(width=16, height=16))
    SAC("MlpPolicy", reach, device="cpu").save(tmp_path / "reach.zip")
    carry = CollectConfig(
        output=str(tmp_path / "b"),
        env={"id": "vlmr/Carry-v0", "width": 16, "height": 16},
        episodes={"trained": 1},
        checkpoints={"trained": {"path": str(tmp_path / "reach.zip")}},
    )
    with pytest.raises(ValueError, match="checkpoints.trained takes observations of shape"):
        collect(carry)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
