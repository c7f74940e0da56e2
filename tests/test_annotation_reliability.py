"""`vlmr annotate` against hostile use (issue #35): a changed source or input file is never reused, bad
input exits 2 with one message before anything is written, decode workers die with their parent, and a
resumed job removes the temporary files of a killed one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from tests.annotation_fixtures import make_video_folder, ramp_frames, write_reward_yaml, write_video
from tests.test_annotation import config, videos_source
from vlm_rewards.annotation import run_annotation
from vlm_rewards.cli import app

REPO = Path(__file__).resolve().parents[1]
VIDEOS_YAML = REPO / "configs" / "annotate" / "videos.yaml"


def write_clips(root: Path, end: float) -> Path:
    """Two clips whose brightness ramps up to `end` (the fixture reward's final progress is end / 255)."""
    for i in range(2):
        write_video(root / f"clip_{i}.mp4", ramp_frames(6, end=end, seed=i))
    return root


def rewards(output_dir: Path) -> dict[str, float]:
    episodes = pq.read_table(output_dir / "episodes.parquet").to_pandas()
    return dict(zip(episodes.episode, episodes.reward))


def shard_bytes(output_dir: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in (output_dir / "shards").glob("*.parquet")}


def annotate(*args: str):
    return CliRunner().invoke(app, ["annotate", *map(str, args)])


def assert_one_clean_error(result, needle: str) -> None:
    """Exit code 2 and a single `error:` line naming `needle`; no exception escaped the CLI."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.stderr.count("error:") == 1 and needle in result.stderr, result.stderr


# ----------------------------------------------------------------------------- changed inputs


def test_same_folder_name_other_source_is_refused_not_reused(tmp_path):
    """B/vids then C/vids (same file names, other content) into one output_dir: refused with the
    changed path named; with overwrite the outputs are C's, never B's."""
    old, new = write_clips(tmp_path / "B" / "vids", end=235), write_clips(tmp_path / "C" / "vids", end=60)
    write_reward_yaml(tmp_path / "r.yaml", "brightness_progress")
    out = tmp_path / "out"
    common = [f"reward={tmp_path / 'r.yaml'}", f"output_dir={out}", "source.instruction=brighten",
              "source.instructions=null", "report.enabled=false", "decode.backend=thread"]  # fmt: skip
    assert annotate(VIDEOS_YAML, f"source.path={old}", *common).exit_code == 0
    before = rewards(out)

    refused = annotate(VIDEOS_YAML, f"source.path={new}", *common)
    assert_one_clean_error(refused, "source.path")
    assert str(old.resolve()) in refused.stderr and str(new.resolve()) in refused.stderr
    assert rewards(out) == before

    replaced = annotate(VIDEOS_YAML, f"source.path={new}", *common, "overwrite=true")
    assert replaced.exit_code == 0, replaced.output
    fresh = annotate(VIDEOS_YAML, f"source.path={new}", *common, f"output_dir={tmp_path / 'fresh'}")
    assert fresh.exit_code == 0, fresh.output
    assert rewards(out) == rewards(tmp_path / "fresh")
    assert all(value < 0.3 for value in rewards(out).values()) and all(value > 0.9 for value in before.values())


def test_a_changed_input_file_redoes_that_episode_only(tmp_path):
    root = make_video_folder(tmp_path / "videos", lengths=(5, 6, 7, 5))
    cfg = config(tmp_path, videos_source(root))
    run_annotation(cfg)
    before_shards, before_rewards = shard_bytes(cfg.output_dir), rewards(cfg.output_dir)

    write_video(root / "clip_01.webm", ramp_frames(6, end=60, seed=1))  # same name, other content
    again = run_annotation(cfg)
    assert (again.num_skipped, again.num_annotated, again.num_failed) == (3, 4, 0)
    after_shards = shard_bytes(cfg.output_dir)
    assert sorted(after_shards) == sorted(before_shards)
    assert len([name for name in before_shards if after_shards[name] != before_shards[name]]) == 1
    fresh = run_annotation(cfg.model_copy(update={"output_dir": tmp_path / "fresh"}))
    assert rewards(cfg.output_dir) == rewards(fresh.output_dir)
    assert rewards(cfg.output_dir)["clip_01.webm"] < 0.3 < before_rewards["clip_01.webm"]

    (root / "clip_02.avi").write_bytes(b"not a video" * 100)  # its old shard must not stand in for it
    broken = run_annotation(cfg)
    assert broken.num_annotated == 3 and [f["episode"] for f in broken.failures] == ["clip_02.avi"]
    assert "clip_02.avi" not in rewards(cfg.output_dir)

    no_retry = cfg.model_copy(update={"retry_failed": False})
    assert run_annotation(no_retry).num_failed == 1  # unchanged: the failure stands
    write_video(root / "clip_02.avi", ramp_frames(7, seed=2))  # fixed: redone although failures are not retried
    fixed = run_annotation(no_retry)
    assert (fixed.num_annotated, fixed.num_failed, fixed.num_skipped) == (4, 0, 3)


# ----------------------------------------------------------------------------- bad input: exit 2, nothing written


def videos_job(tmp_path: Path) -> list[str]:
    root = tmp_path / "videos"
    write_video(root / "clip.mp4", ramp_frames(5))
    write_reward_yaml(tmp_path / "r.yaml", "brightness_progress")
    return [VIDEOS_YAML, f"source.path={root}", f"reward={tmp_path / 'r.yaml'}", f"output_dir={tmp_path / 'out'}",
            "report.enabled=false", "decode.backend=thread"]  # fmt: skip


def test_missing_default_sidecar_with_a_fixed_instruction_exits_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the shipped config's sidecar, data/videos/instructions.json, is not here
    result = annotate(*videos_job(tmp_path), "source.instruction=brighten")
    assert_one_clean_error(result, "data/videos/instructions.json")
    assert "source.instructions=null" in result.stderr and not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [3, ["brighten"], {"instruction": 3}])
def test_sidecar_value_of_the_wrong_type_exits_2_before_writing(tmp_path, value):
    sidecar = tmp_path / "instructions.json"
    sidecar.write_text(json.dumps({"clip.mp4": value}))
    result = annotate(*videos_job(tmp_path), f"source.instructions={sidecar}")
    assert_one_clean_error(result, f"{sidecar}: clip.mp4")
    assert not (tmp_path / "out").exists()


def test_output_dir_that_is_a_file_exits_2(tmp_path):
    (tmp_path / "taken").write_text("a file")
    result = annotate(*videos_job(tmp_path), "source.instruction=brighten", "source.instructions=null",
                      f"output_dir={tmp_path / 'taken'}")  # fmt: skip
    assert_one_clean_error(result, f"{tmp_path / 'taken'}: exists and is not a folder")


# ----------------------------------------------------------------------------- leftovers after a kill


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_resume_removes_temporary_files_of_a_killed_run(tmp_path):
    cfg = config(tmp_path, videos_source(make_video_folder(tmp_path / "videos", lengths=(5, 6))),
                 report={"enabled": True})  # fmt: skip
    run_annotation(cfg)
    curves = cfg.output_dir / "report" / "curves"
    stale = curves / f".clip_00.png.{dead_pid()}.0badf00d.tmp"  # a kill while the report was drawn
    stale.write_bytes(b"half a PNG")
    live = curves / f".clip_01.png.{os.getpid()}.0badf00d.tmp"  # a writer still at work keeps its file
    live.write_bytes(b"being written")
    run_annotation(cfg)
    assert not stale.exists() and live.exists()


def process_states() -> dict[int, tuple[int, str]]:
    """{pid: (parent pid, state)} of every process (Linux /proc)."""
    states = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        states[int(stat.parent.name)] = (int(fields[1]), fields[0])
    return states


def running(pids: set[int]) -> set[int]:
    """The `pids` that still run (a zombie waiting for its new parent to reap it has ended)."""
    return {pid for pid, (_, state) in process_states().items() if pid in pids and state != "Z"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_decode_workers_exit_when_the_job_is_killed(tmp_path):
    root = make_video_folder(tmp_path / "videos", lengths=(5, 6, 7, 5, 6, 7, 5, 6))
    write_reward_yaml(tmp_path / "slow.yaml", "slow_brightness")
    job = {"reward": str(tmp_path / "slow.yaml"), "output_dir": str(tmp_path / "out"), "batch_size": 1,
           "source": videos_source(root), "decode": {"workers": 2, "backend": "process", "prefetch": 1}}  # fmt: skip
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    command = [sys.executable, "-m", "vlm_rewards.cli", "annotate", str(tmp_path / "job.yaml")]
    env = os.environ | {"VLMR_TEST_REWARD_SLEEP": "1"}
    process = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any((tmp_path / "out" / "shards").glob("*.parquet")):
            time.sleep(0.05)
        children = {pid for pid, (parent, _) in process_states().items() if parent == process.pid}
        assert len(children) >= 2 and process.poll() is None  # the decode workers (and resource_tracker)
        process.kill()  # the job only: its children are orphaned
        process.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and running(children):
            time.sleep(0.1)
        assert running(children) == set()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever is left of the job's session
