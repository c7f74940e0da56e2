"""LeRobot v3 datasets: the writer's layout, reading them as progress episodes (labels, success, SARM progress,
episode ranges), eval-rm and a reduced train-rm run on one, and `vlmr collect` to LeRobot and back."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.annotation_fixtures import make_lerobot_dataset, ramp_frames
from vlm_rewards.annotation.lerobot_episodes import LeRobotEpisodes
from vlm_rewards.config import load_job_config
from vlm_rewards.data.config import LeRobotSource
from vlm_rewards.data.lerobot import SARM_PROGRESS, LeRobotEpisodeData, episode_rows, list_episodes, write_lerobot
from vlm_rewards.evaluation.config import EvalRMConfig
from vlm_rewards.evaluation.evaluate import run_eval

CAMERA = "observation.images.top"
BRIGHTNESS = {"kind": "function", "function": "tests.annotation_fixtures:brightness_progress", "dense": True,
              "value_range": [0.0, 1.0]}  # fmt: skip


def brightness_episodes(count: int, seed: int, length: int = 6, size: int = 32) -> list[LeRobotEpisodeData]:
    """Successes brighten (20 -> 235), failures darken (235 -> 20): only the pixels tell them apart."""
    rng = np.random.default_rng(seed)
    episodes = []
    for i in range(count):
        success = bool(i % 2 == 0)
        frames = ramp_frames(length, *((20, 235) if success else (235, 20)), size=size, seed=int(rng.integers(1000)))
        episodes.append(
            LeRobotEpisodeData(
                task=["make it bright", "light the scene"][i // 2 % 2],  # both tasks succeed and fail
                videos={CAMERA: frames},
                features={
                    "action": rng.normal(size=(length, 2)).astype(np.float32),
                    "next.success": np.arange(length) == (length - 1 if success else length),
                },
                success=success,
                policy="expert" if success else "reverse",
                progress=np.linspace(0, 1, length) ** 2,
            )
        )
    return episodes


def test_written_dataset_has_the_v3_layout_lerobot_loads(tmp_path):
    root = write_lerobot(
        tmp_path / "ds", brightness_episodes(5, seed=0), fps=10, robot_type="test", episodes_per_file=2
    )
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 5 and info["total_frames"] == 30
    assert info["total_tasks"] == 2 and info["splits"] == {"train": "0:5"} and info["chunks_size"] == 1000
    features = info["features"]
    for key in ("timestamp", "frame_index", "episode_index", "index", "task_index", "action", "next.success"):
        assert {"dtype", "shape", "names"} <= set(features[key]), key
    assert features["action"] == {"dtype": "float32", "shape": [2], "names": None}
    assert features["next.success"]["dtype"] == "bool" and features["index"]["shape"] == [1]
    assert features[CAMERA]["dtype"] == "video" and features[CAMERA]["shape"] == [32, 32, 3]
    assert features[CAMERA]["info"]["video.fps"] == 10
    # three data and video files of at most two episodes, one episodes table, located by index and timestamps
    assert sorted(p.name for p in (root / "data" / "chunk-000").iterdir()) == [f"file-00{i}.parquet" for i in range(3)]
    assert len(list((root / "videos" / CAMERA / "chunk-000").glob("file-*.mp4"))) == 3
    episodes = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    third = episodes[3]
    assert third["data/file_index"] == 1 and third[f"videos/{CAMERA}/file_index"] == 1
    assert (third["dataset_from_index"], third["dataset_to_index"]) == (18, 24)
    assert third[f"videos/{CAMERA}/from_timestamp"] == pytest.approx(0.6)
    assert third["tasks"] == ["light the scene"] and third["success"] is False and third["policy"] == "reverse"
    data = pq.read_table(root / "data" / "chunk-000" / "file-001.parquet")
    assert set(data.column_names) == {k for k, f in features.items() if f["dtype"] != "video"}
    assert data["index"].to_pylist() == list(range(12, 24)) and np.allclose(
        data["timestamp"].to_numpy()[:7], [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0]
    )
    assert pq.read_table(root / "meta" / "tasks.parquet").column_names == ["task_index", "task"]
    stats = json.loads((root / "meta" / "stats.json").read_text())
    assert stats["action"]["count"] == [30] and np.array(stats[CAMERA]["mean"]).shape == (3, 1, 1)
    assert pq.read_table(root / SARM_PROGRESS).num_rows == 30
    with pytest.raises(FileExistsError, match="empty folder"):
        write_lerobot(root, brightness_episodes(1, seed=0), fps=10)


def test_episodes_read_with_time_labels_failures_as_negatives_and_ranges(tmp_path):
    written = brightness_episodes(5, seed=0)
    root = write_lerobot(tmp_path / "ds", written, fps=10, episodes_per_file=2)
    dataset = LeRobotEpisodes(root, LeRobotSource())
    assert dataset.episode_ids == [0, 1, 2, 3, 4] and dataset.instructions == sorted({e.task for e in written})
    for record, source in zip(dataset, written):
        assert record.instruction == source.task and record.success == source.success
        assert np.abs(record.frames.astype(int) - source.videos[CAMERA]).mean() < 3  # H.264, lossy
        expected = np.linspace(0, 1, 6) if source.success else np.zeros(6)
        np.testing.assert_allclose(record.progress, expected, atol=1e-6)
    half_rate = LeRobotEpisodes(root, LeRobotSource(fps=5, max_side=16), episodes="1:3")
    assert half_rate.episode_ids == [1, 2]
    record = half_rate[2]  # frames 0, 2, 4 and the last one, 5
    assert record.frames.shape == (4, 16, 16, 3) and np.allclose(record.progress, [0, 0.4, 0.8, 1.0])
    assert LeRobotEpisodes(root, LeRobotSource(), episodes="train").episode_ids == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="start:stop"):
        LeRobotEpisodes(root, LeRobotSource(), episodes="first two")
    with pytest.raises(ValueError, match="not a video feature"):
        LeRobotEpisodes(root, LeRobotSource(camera="observation.images.wrist"))


def test_sarm_progress_labels_are_interpolated_and_unlisted_episodes_left_out(tmp_path):
    root = write_lerobot(tmp_path / "ds", brightness_episodes(3, seed=0), fps=10)
    table = pq.read_table(root / SARM_PROGRESS)
    strided = table.filter(
        np.isin(table["frame_index"].to_numpy(), [0, 2, 4, 5]) & (table["episode_index"].to_numpy() < 2)
    )
    pq.write_table(strided, tmp_path / "strided.parquet")
    dataset = LeRobotEpisodes(root, LeRobotSource(progress="sarm", sarm_progress=tmp_path / "strided.parquet"))
    assert dataset.episode_ids == [0, 1] and dataset.skipped == {2: "not in the SARM progress parquet"}
    listed = (np.array([0, 2, 4, 5]) / 5) ** 2
    expected = np.interp(np.arange(6), [0, 2, 4, 5], listed)  # frames 1 and 3 between their neighbours
    np.testing.assert_allclose(dataset[1].progress, expected, atol=1e-6)  # a failure keeps its annotation
    dense = LeRobotEpisodes(root, LeRobotSource(progress="sarm", sarm_head="dense"))  # the dataset's own file
    np.testing.assert_allclose(dense[2].progress, (np.arange(6) / 5) ** 2, atol=1e-6)
    with pytest.raises(ValueError, match="no such SARM progress"):
        LeRobotEpisodes(root, LeRobotSource(progress="sarm", sarm_progress=tmp_path / "missing.parquet"))


def test_datasets_written_elsewhere_read_the_same_way(tmp_path):
    """The annotation tests' LeRobot fixture (tasks from the pandas index, success from next.success, two cameras)."""
    root = make_lerobot_dataset(tmp_path / "fixture", lengths=(6, 8, 5), success=[True, False, True])
    dataset = LeRobotEpisodes(root, LeRobotSource(views={"wrist": "observation.images.wrist"}))
    records = list(dataset)
    assert [r.instruction for r in records] == ["pick the cube", "open the drawer", "pick the cube"]
    assert [r.success for r in records] == [True, False, True] and np.all(records[1].progress == 0)
    assert records[1].frames.shape == (8, 32, 32, 3) and records[1].views["wrist"].shape == (8, 32, 32, 3)
    assert np.abs(records[0].frames.astype(int) - ramp_frames(6, seed=0)).mean() < 3
    _, listed = list_episodes(root)
    assert episode_rows(listed[1], ["action"])["frame_index"].to_pylist() == list(range(8))


def test_eval_rm_reads_a_lerobot_dataset(tmp_path):
    root = write_lerobot(tmp_path / "ds", brightness_episodes(6, seed=0), fps=10)
    config = EvalRMConfig(reward=BRIGHTNESS, episodes=root, format="lerobot", lerobot={"eval_episodes": "0:4"},
                          output_dir=tmp_path / "eval", evaluate_pairs=False)  # fmt: skip
    metrics = run_eval(config)
    assert metrics["num_episodes"] == 4 and metrics["num_expert_episodes"] == 2
    assert metrics["voc_expert"] == pytest.approx(1.0) and metrics["success_auc"] == 1.0
    assert metrics["reward_policy_reverse"] < 0.2 < 0.8 < metrics["reward_policy_expert"]
    with pytest.raises(ValueError, match="format lerobot"):
        EvalRMConfig(format="lerobot")


@pytest.mark.slow
def test_train_rm_on_a_lerobot_dataset_learns_above_chance(tmp_path):
    """A reduced train-rm run on a LeRobot v3 dataset from a random tiny backbone. Successes brighten and failures
    darken over the same frame positions, so only a model that reads the frames ranks the held-out successes'
    final frames above the failures', and tells successes from the same frames reversed."""
    from vlm_rewards.training.config import TrainRMConfig
    from vlm_rewards.training.train import run_training

    train = write_lerobot(tmp_path / "train", brightness_episodes(24, seed=0), fps=10)
    held_out = write_lerobot(tmp_path / "eval", brightness_episodes(16, seed=1), fps=10)
    overrides = [f"output_dir={tmp_path / 'run'}", f"data.train={train}", f"data.eval={held_out}",
                 "data.lerobot.train_episodes=null", "data.lerobot.eval_episodes=null", "data.lerobot.fps=null",
                 "data.lerobot.max_side=null", "model.backbone=tiny", "model.tiny.num_layers=1",
                 "model.tiny.vision_depth=1", "model.reward.max_frames=8", "optim.steps=60", "optim.batch_size=4",
                 "optim.lr=1e-3", "optim.warmup_steps=5", "eval_every=1000", "save_every=1000",
                 "data.augment={mismatch: 0, reverse: 0, rewind: 0, stall: 0, subsample: 0}"]  # fmt: skip
    config = load_job_config(TrainRMConfig, "configs/train_rm/progress_lerobot.yaml", overrides)
    metrics = run_training(config)
    assert metrics["num_episodes"] == 16
    # 8 successes against 8 failures; the untrained tiny model's random features already give about 0.7
    assert metrics["success_auc"] > 0.95
    assert metrics["voc_expert"] - metrics["voc_reversed"] > 0.3  # 0 for a model reading frame positions only


def test_collect_to_lerobot_round_trips(tmp_path):
    """`vlmr collect` with format lerobot, read back through LeRobotEpisodes: frames, actions, tasks and success
    match the rollouts (the same seeds roll out the same episodes again)."""
    from vlm_rewards.robotics.collect import collect, run_rollouts
    from vlm_rewards.robotics.config import CollectConfig

    config = CollectConfig(output=str(tmp_path / "reach"), format="lerobot", progress_label="time",
                           env={"num_envs": 2, "width": 16, "height": 16, "max_episode_steps": 12},
                           episodes={"expert": 2, "random": 1})  # fmt: skip
    root = collect(config)
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["robot_type"] == "vlmr/Reach-v0" and info["fps"] == config.fps
    assert {"observation.state", "action", "next.reward", "next.done", "next.success", CAMERA,
            "observation.images.front"} <= set(info["features"])  # fmt: skip
    dataset = LeRobotEpisodes(root, LeRobotSource(views={"front": "observation.images.front"}))
    rollouts = list(run_rollouts(config))
    assert len(dataset) == len(rollouts) == 3
    for episode_id, rollout in zip(dataset.episode_ids, rollouts):
        record, steps = dataset[episode_id], len(rollout.actions)
        assert record.instruction == rollout.infos[0]["instruction"] and record.policy == rollout.policy
        assert record.success == rollout.success and record.frames.shape == (steps, 16, 16, 3)
        assert np.abs(record.frames.astype(int) - np.stack(rollout.frames["top"][:steps])).mean() < 6
        assert record.views["front"].shape == record.frames.shape
        rows = episode_rows(dataset.episode(episode_id), ["action", "next.done", "next.success"])
        actions = rows["action"].combine_chunks().flatten().to_numpy().reshape(steps, -1)
        np.testing.assert_allclose(actions, np.stack(rollout.actions), rtol=1e-6)
        assert rows["next.done"].to_pylist() == [False] * (steps - 1) + [True]
        assert rows["next.success"].to_pylist()[-1] == rollout.success
    assert any(record.success for record in dataset) and not all(record.success for record in dataset)
