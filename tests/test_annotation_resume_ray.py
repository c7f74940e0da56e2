"""`vlmr annotate` end to end: SIGKILL mid-run then resume gives byte-identical outputs; the Ray engine
gives the same outputs as the local engine (a local Ray instance on CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.annotation_fixtures import make_lerobot_dataset, make_video_folder, write_goal, write_reward_yaml
from vlm_rewards.annotation import AnnotateConfig, run_annotation

REPO = Path(__file__).resolve().parents[1]
COMPARED = ("frames.parquet", "episodes.parquet", "failures.json", "manifest.json", "job.json")


def outputs(folder: Path) -> dict[str, bytes]:
    """Every output file but the report (PNG), by relative path."""
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "report" not in path.relative_to(folder).parts
    }


@pytest.mark.slow
def test_sigkill_then_resume_is_byte_identical(tmp_path, monkeypatch):
    root = make_video_folder(tmp_path / "videos", lengths=(5, 6, 7, 5, 6, 7, 5, 6, 7, 5), broken=True)
    write_reward_yaml(tmp_path / "slow.yaml", "slow_brightness")
    job = {"reward": str(tmp_path / "slow.yaml"), "output_dir": str(tmp_path / "killed"), "batch_size": 1,
           "source": {"kind": "videos", "path": str(root), "instructions": str(root / "instructions.json")},
           "decode": {"workers": 2, "backend": "process", "prefetch": 1}}  # fmt: skip
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    command = [sys.executable, "-m", "vlm_rewards.cli", "annotate", str(tmp_path / "job.yaml")]
    env = os.environ | {"VLMR_TEST_REWARD_SLEEP": "0.2"}
    process = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    shards = tmp_path / "killed" / "shards"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(shards.glob("*.parquet"))) < 3:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)  # the job and its decode workers, at once
    process.wait()
    done = len(list(shards.glob("*.parquet")))
    assert 3 <= done < 10 and not (tmp_path / "killed" / "manifest.json").exists()

    resumed = subprocess.run(command, cwd=REPO, env=env | {"VLMR_TEST_REWARD_SLEEP": "0"}, capture_output=True)
    assert resumed.returncode == 3, resumed.stderr.decode()[-2000:]  # the broken files failed

    monkeypatch.setenv("VLMR_TEST_REWARD_SLEEP", "0")
    monkeypatch.chdir(REPO)
    reference = AnnotateConfig.model_validate(
        job | {"output_dir": str(tmp_path / "uninterrupted"), "batch_size": 3, "decode": {"backend": "thread"}}
    )
    summary = run_annotation(reference)
    assert (summary.num_annotated, summary.num_failed) == (10, 4)
    killed, clean = outputs(tmp_path / "killed"), outputs(tmp_path / "uninterrupted")
    assert sorted(killed) == sorted(clean)
    assert [name for name in clean if killed[name] != clean[name]] == []


@pytest.mark.slow
def test_ray_engine_matches_local(tmp_path):
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    root = make_video_folder(tmp_path / "videos", lengths=(5, 6, 7), broken=True)
    dataset = make_lerobot_dataset(tmp_path / "lerobot", lengths=(5, 6, 4), episodes_per_file=2)
    goal = write_goal(tmp_path / "goal.png")
    jobs = {
        "videos": {"kind": "videos", "path": str(root), "instructions": str(root / "instructions.json"),
                   "reference": str(goal)},
        "lerobot": {"kind": "lerobot", "path": str(dataset), "reference": str(goal)},
    }  # fmt: skip
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for name, source in jobs.items():
            base = {"reward": "goal_pixel_progress", "source": source, "batch_size": 2, "report": {"enabled": False},
                    "decode": {"backend": "thread"}}  # fmt: skip
            local_config = base | {"output_dir": str(tmp_path / f"{name}_local")}
            local = run_annotation(AnnotateConfig.model_validate(local_config))
            remote = run_annotation(
                AnnotateConfig.model_validate(
                    base | {"output_dir": str(tmp_path / f"{name}_ray"), "engine": "ray", "ray": {"num_actors": 1}}
                )  # fmt: skip
            )
            assert (remote.num_annotated, remote.num_failed) == (local.num_annotated, local.num_failed)
            assert outputs(local.output_dir) == outputs(remote.output_dir), name
    finally:
        if started:
            ray.shutdown()
