"""`vlmr annotate`: sources (video folder in several codecs, LeRobot v3, episode format), sampling and
subsampling, failures, resume and fingerprints, LeRobot outputs, the report, parallel decoding."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from tests.annotation_fixtures import (
    make_lerobot_dataset,
    make_video_folder,
    ramp_frames,
    sleepy_pid,
    write_goal,
    write_reward_yaml,
    write_video,
)
from vlm_rewards.annotation import AnnotateConfig, run_annotation
from vlm_rewards.annotation.runner import DecodePool, make_pool
from vlm_rewards.registry import build_reward

COMPARED = ("frames.parquet", "episodes.parquet", "failures.json", "manifest.json", "job.json")


def config(tmp_path: Path, source: dict, reward: str = "brightness_progress", **overrides) -> AnnotateConfig:
    reward_path = tmp_path / f"{reward}.yaml"
    if not reward_path.exists():
        write_reward_yaml(reward_path, reward)
    data = {"reward": str(reward_path), "source": source, "output_dir": str(tmp_path / "out"), "batch_size": 2,
            "report": {"enabled": False}, "decode": {"workers": 2, "backend": "thread"}}  # fmt: skip
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = data[key] | value
        else:
            data[key] = value
    return AnnotateConfig.model_validate(data)


def videos_source(root: Path) -> dict:
    return {"kind": "videos", "path": str(root), "instructions": str(root / "instructions.json")}


def read_bytes(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in COMPARED}


def test_video_folder_codecs_failures_and_keys(tmp_path):
    root = make_video_folder(tmp_path / "videos", broken=True, missing_instruction=True)
    summary = run_annotation(config(tmp_path, videos_source(root), decode={"backend": "process"}))
    assert (summary.num_annotated, summary.num_failed) == (4, 5)
    reasons = {f["episode"]: f["reason"] for f in summary.failures}
    assert "empty file" in reasons["empty.webm"]
    assert "unreadable" in reasons["corrupt.mp4"] and "unreadable" in reasons["truncated.mp4"]
    assert "not a file" in reasons["folder.mkv"]
    assert "no instruction" in reasons["zz_unlisted.mp4"]
    assert json.loads((tmp_path / "out" / "failures.json").read_text()) == summary.failures

    frames = pq.read_table(tmp_path / "out" / "frames.parquet").to_pandas()
    assert frames.columns.tolist() == ["source", "episode", "frame", "scored", "progress"]
    assert sorted(frames.episode.unique()) == ["clip_00.mp4", "clip_01.webm", "clip_02.avi", "clip_03.mkv"]
    for episode, length in zip(sorted(frames.episode.unique()), (6, 9, 7, 8)):
        rows = frames[frames.episode == episode]
        assert rows.frame.tolist() == list(range(length)) and rows.scored.all()
        assert np.all(np.diff(rows.progress) > 0)  # brightness ramps survive every codec
    episodes = pq.read_table(tmp_path / "out" / "episodes.parquet").to_pandas()
    assert episodes.instruction.tolist()[0] == "make it bright 0"
    assert (episodes.progress_final > 0.85).all() and episodes["flags"].tolist() == [""] * 4
    # decoding ran in worker processes, not in the main process
    assert summary.decode_workers_used and all(int(w.split(":")[0]) != os.getpid() for w in summary.decode_workers_used)


def test_cli_exit_code_when_items_fail(tmp_path):
    from typer.testing import CliRunner

    from vlm_rewards.cli import app

    root = make_video_folder(tmp_path / "videos", lengths=(5, 6, 7), broken=True)
    write_reward_yaml(tmp_path / "r.yaml", "brightness_progress")
    job = {"reward": str(tmp_path / "r.yaml"), "source": videos_source(root), "output_dir": str(tmp_path / "out"),
           "report": {"enabled": False}, "decode": {"backend": "thread"}}  # fmt: skip
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    result = CliRunner().invoke(app, ["annotate", str(tmp_path / "job.yaml")])
    assert result.exit_code == 3, result.output
    clean = CliRunner().invoke(app, ["annotate", str(tmp_path / "job.yaml"), f"output_dir={tmp_path / 'o2'}",
                                     "source.extensions=[.avi]"])  # fmt: skip
    assert clean.exit_code == 0, clean.output
    assert json.loads((tmp_path / "o2" / "failures.json").read_text()) == []


def test_reward_error_fails_only_that_episode(tmp_path):
    root = make_video_folder(tmp_path / "videos")
    summary = run_annotation(config(tmp_path, videos_source(root), reward="brightness_or_error", batch_size=4))
    assert summary.num_annotated == 3
    assert [(f["episode"], f["stage"]) for f in summary.failures] == [("clip_02.avi", "reward")]
    assert "model refused" in summary.failures[0]["reason"]


def test_refuses_rewards_that_are_not_batch_invariant_or_deterministic(tmp_path):
    root = make_video_folder(tmp_path / "videos", lengths=(4,))
    write_reward_yaml(tmp_path / "bad.yaml", "brightness_progress", batch_invariant=False, deterministic=False)
    cfg = config(tmp_path, videos_source(root))
    with pytest.raises(ValueError, match="batch_invariant=False.*deterministic=False"):
        run_annotation(cfg.model_copy(update={"reward": str(tmp_path / "bad.yaml")}))


def test_resume_does_only_missing_and_fingerprint_refusal(tmp_path):
    root = make_video_folder(tmp_path / "videos", lengths=(5, 6, 7, 5))
    cfg = config(tmp_path, videos_source(root))
    first = run_annotation(cfg)
    before = read_bytes(tmp_path / "out")
    shards = sorted((tmp_path / "out" / "shards").glob("*.parquet"))
    shards[1].unlink()
    again = run_annotation(cfg)
    assert (again.num_skipped, again.num_annotated) == (3, 4) and first.fingerprint == again.fingerprint
    assert read_bytes(tmp_path / "out") == before

    strided = config(tmp_path, videos_source(root), sampling={"mode": "stride", "stride": 2})
    with pytest.raises(ValueError, match="Refusing to mix"):
        run_annotation(strided)
    replaced = run_annotation(strided.model_copy(update={"overwrite": True}))
    assert replaced.num_skipped == 0 and replaced.fingerprint != first.fingerprint


def test_sampling_stride_fps_and_long_episode_subsampling(tmp_path):
    root = tmp_path / "videos"
    write_video(root / "long.mp4", ramp_frames(23))
    source = {"kind": "videos", "path": str(root), "instruction": "brighten"}
    stride = run_annotation(config(tmp_path, source, sampling={"mode": "stride", "stride": 5}))
    frames = pq.read_table(stride.output_dir / "frames.parquet").to_pandas()
    assert np.flatnonzero(frames.scored).tolist() == [0, 5, 10, 15, 20, 22]  # the last frame always
    assert len(frames) == 23 and np.all(np.diff(frames.progress) > 0)  # interpolated in between

    fps = run_annotation(config(tmp_path, source, sampling={"mode": "fps", "fps": 5}, output_dir=str(tmp_path / "o")))
    frames = pq.read_table(fps.output_dir / "frames.parquet").to_pandas()
    assert np.flatnonzero(frames.scored).tolist() == [*range(0, 23, 2)]

    budget = run_annotation(
        config(
            tmp_path, source, reward="frame_budget_probe", sampling={"max_frames": 4}, output_dir=str(tmp_path / "b")
        )  # fmt: skip
    )
    frames = pq.read_table(budget.output_dir / "frames.parquet").to_pandas()
    assert frames.scored.sum() == 4 and frames.scored.iloc[0] and frames.scored.iloc[-1] and len(frames) == 23
    meta = json.loads(pq.read_schema(next((budget.output_dir / "shards").glob("*.parquet"))).metadata[
        b"vlm_rewards.annotation"])  # fmt: skip
    assert meta["info"] == {"seen": 4}


def test_lerobot_v3_outputs(tmp_path):
    dataset = make_lerobot_dataset(
        tmp_path / "lerobot", shapes=["ramp", "collapse", "flat", "ramp", "ramp"], success=[1, 1, 1, 0, 1]
    )
    cfg = config(
        tmp_path,
        {"kind": "lerobot", "path": str(dataset), "views": {"wrist": "observation.images.wrist"}},
        lerobot={"column": "next.reward", "value": "progress_delta"},
        report={"enabled": True},
    )
    summary = run_annotation(cfg)
    assert (summary.num_annotated, summary.num_failed) == (5, 0)
    out = summary.output_dir
    episodes = pq.read_table(out / "episodes.parquet").to_pandas()
    assert episodes.instruction.tolist()[:2] == ["pick the cube", "open the drawer"]
    flags = dict(zip(episodes.episode, episodes["flags"]))
    assert "collapses_at_end" in flags["1"] and "never_rises" in flags["2"]
    assert "disagrees_with_success" in flags["3"] and flags["0"] == "" and flags["4"] == ""

    progress = pq.read_table(out / "lerobot_progress.parquet")
    assert progress.column_names == ["index", "episode_index", "frame_index", "progress_sparse", "progress_dense"]
    assert progress["index"].to_pylist() == list(range(6 + 8 + 5 + 7 + 6))

    copy = out / "lerobot_dataset"
    info = json.loads((copy / "meta" / "info.json").read_text())
    assert info["features"]["next.reward"] == {"dtype": "float32", "shape": [1], "names": None}
    assert "next.reward" in json.loads((copy / "meta" / "stats.json").read_text())
    data = pq.read_table(copy / "data" / "chunk-000" / "file-001.parquet").to_pandas()  # episodes 3 and 4
    original = pq.read_table(dataset / "data" / "chunk-000" / "file-001.parquet").to_pandas()
    assert data.drop(columns="next.reward").equals(original)
    dense = progress.to_pandas().set_index("index").progress_dense
    expected = np.append(np.diff(dense.loc[data["index"][data.episode_index == 3]]), 0)
    np.testing.assert_allclose(data["next.reward"][data.episode_index == 3], expected, atol=1e-6)
    video = Path("videos/observation.images.top/chunk-000/file-000.mp4")
    assert (copy / video).stat().st_ino == (dataset / video).stat().st_ino  # hard-linked
    assert (copy / "meta" / "tasks.parquet").read_bytes() == (dataset / "meta" / "tasks.parquet").read_bytes()

    report = (out / "report" / "index.html").read_text()
    assert "collapses_at_end" in report and (out / "report" / "final_progress.png").stat().st_size > 0
    assert len(list((out / "report" / "curves").glob("*.png"))) == 5


def test_lerobot_truncated_video_fails_its_episodes_only(tmp_path):
    dataset = make_lerobot_dataset(tmp_path / "lerobot", lengths=(5, 6, 5, 6), episodes_per_file=2, cameras=("cam",))
    video = dataset / "videos" / "cam" / "chunk-000" / "file-001.mp4"
    video.write_bytes(video.read_bytes()[:200])
    summary = run_annotation(config(tmp_path, {"kind": "lerobot", "path": str(dataset)}))
    assert summary.num_annotated == 2 and [f["episode"] for f in summary.failures] == ["2", "3"]
    data = pq.read_table(summary.output_dir / "lerobot_dataset" / "data" / "chunk-000" / "file-001.parquet")
    assert np.isnan(data["progress"].to_numpy()).all()


def test_episode_dataset_source(tmp_path):
    from vlm_rewards.data.episodes import EpisodeRecord, write_episodes

    records = [EpisodeRecord(i, f"task {i}", ramp_frames(5 + i), np.linspace(0, 1, 5 + i), True) for i in range(3)]
    write_episodes(tmp_path / "eps", records, name="eps")
    summary = run_annotation(config(tmp_path, {"kind": "episodes", "path": str(tmp_path / "eps")}))
    frames = pq.read_table(summary.output_dir / "frames.parquet").to_pandas()
    assert summary.num_annotated == 3 and frames.groupby("episode").size().tolist() == [5, 6, 7]
    assert frames.source.unique().tolist() == ["eps"]


def test_shipped_reward_with_reference(tmp_path):
    root = make_video_folder(tmp_path / "videos", lengths=(6, 7))
    source = videos_source(root) | {"reference": str(write_goal(tmp_path / "goal.png"))}
    summary = run_annotation(config(tmp_path, source).model_copy(update={"reward": "goal_pixel_progress"}))
    episodes = pq.read_table(summary.output_dir / "episodes.parquet").to_pandas()
    assert summary.num_annotated == 2 and (episodes.progress_final > 0.8).all() and (episodes.progress_first == 0).all()


def test_decode_pool_runs_in_parallel_workers():
    with DecodePool(functools.partial(make_pool, 2, "process"), functools.partial(sleepy_pid), 4, None) as pool:
        list(pool.map([0.0, 0.0]))  # start both workers
        start = time.perf_counter()
        pids = list(pool.map([0.4] * 4))
        elapsed = time.perf_counter() - start
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert elapsed < 4 * 0.4  # serial decoding would take 1.6 s


def test_decode_workers_start_before_the_reward_is_built(tmp_path):
    """The reward may be a function that builds it: it is called once the decode workers are started,
    so that their start-up overlaps loading the model."""
    cfg = config(tmp_path, videos_source(make_video_folder(tmp_path / "videos")), decode={"backend": "process"})
    children_before, workers_at_build = len(multiprocessing.active_children()), []

    def build():
        workers_at_build.append(len(multiprocessing.active_children()) - children_before)
        return build_reward(cfg.reward)

    summary = run_annotation(cfg, reward=build)
    assert workers_at_build == [2] and (summary.num_annotated, summary.num_failed) == (4, 0)
