"""Bad input through the CLI, exported file modes, and the CLI's logging and progress wrapper."""

import json
import logging
import os
import stat

import numpy as np
import pytest
from safetensors.torch import save_file
from typer.testing import CliRunner

from tests.test_media import make_bad_files
from vlm_rewards.cli import app, configure_logging, tqdm_track
from vlm_rewards.io import atomic_path, default_file_mode, make_readable

runner = CliRunner()


def test_score_skips_bad_clips_prints_the_good_ones_and_exits_2(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (3, 16, 16, 3), dtype=np.uint8)
    bad = make_bad_files(tmp_path, frames)
    np.savez(tmp_path / "float.npz", frames=frames.astype(np.float32))
    bad["float.npz"] = "expected dtype uint8"
    clips = ["good.npz", *bad, "good.png"]
    result = runner.invoke(app, ["score", "motion_penalty", *(str(tmp_path / c) for c in clips), "--text", "push"])
    assert result.exit_code == 2, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]  # every stdout line is valid JSON
    assert [line["clip"] for line in lines] == [str(tmp_path / c) for c in clips]
    for line in lines[1:-1]:
        name = os.path.basename(line["clip"])
        assert line["reward"] is None and line["error"].startswith(str(tmp_path / name))
        assert bad[name] in line["error"] and bad[name] in result.stderr
    assert lines[0]["error"] is None and lines[-1]["error"] is None and isinstance(lines[0]["reward"], float)
    assert f"{len(bad)} of {len(clips)} clips could not be scored" in result.stderr
    assert "Traceback" not in result.output and "Aborted" not in result.output


@pytest.mark.parametrize("name", ["truncated.npz", "zero.npz", "renamed.npz", "folder.npz", "zero.png", "junk.mp4"])
def test_score_with_one_bad_clip_exits_2_naming_it(tmp_path, name):
    make_bad_files(tmp_path, np.zeros((2, 8, 8, 3), np.uint8))
    result = runner.invoke(app, ["score", "motion_penalty", str(tmp_path / name), "--text", "push"])
    assert result.exit_code == 2 and str(tmp_path / name) in result.stderr
    assert json.loads(result.stdout)["error"].startswith(str(tmp_path / name))


def test_bad_reference_or_reward_config_ends_the_job(tmp_path):
    make_bad_files(tmp_path, np.zeros((2, 8, 8, 3), np.uint8))
    good = str(tmp_path / "good.npz")
    result = runner.invoke(
        app, ["score", "motion_penalty", good, "--text", "t", "--reference", str(tmp_path / "zero.png")]
    )
    assert result.exit_code == 2 and "zero.png: empty file" in result.stderr and result.stdout == ""
    (tmp_path / "reward.yaml").write_text("kind: motion_penalty\nkind: composite\n")
    result = runner.invoke(app, ["score", str(tmp_path / "reward.yaml"), good, "--text", "t"])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_score_prints_nan_as_null(tmp_path, monkeypatch):
    from vlm_rewards.interface import RewardResult
    from vlm_rewards.rewards.rules import MotionPenalty

    np.savez(tmp_path / "clip.npz", frames=np.zeros((2, 8, 8, 3), np.uint8))
    monkeypatch.setattr(MotionPenalty, "_score", lambda self, requests: [RewardResult(float("nan"), error="x")])
    result = runner.invoke(app, ["score", "motion_penalty", str(tmp_path / "clip.npz"), "--text", "t"])
    assert result.exit_code == 0 and "NaN" not in result.stdout
    assert json.loads(result.stdout)["reward"] is None and json.loads(result.stdout)["error"] == "x"


def test_exported_files_are_readable_per_umask(tmp_path):
    import torch

    old = os.umask(0o022)
    try:
        assert default_file_mode() == 0o644
        with atomic_path(tmp_path / "head.safetensors") as temporary:
            save_file({"w": torch.zeros(2)}, str(temporary))  # safetensors creates 0600 files
        assert stat.S_IMODE((tmp_path / "head.safetensors").stat().st_mode) == 0o644
        (tmp_path / "sub").mkdir()
        save_file({"w": torch.zeros(2)}, str(tmp_path / "sub" / "model.safetensors"))  # as save_pretrained does
        assert stat.S_IMODE((tmp_path / "sub" / "model.safetensors").stat().st_mode) == 0o600
        make_readable(tmp_path / "sub")
        assert stat.S_IMODE((tmp_path / "sub" / "model.safetensors").stat().st_mode) == 0o644
        os.umask(0o077)
        assert default_file_mode() == 0o600
    finally:
        os.umask(old)


def test_cli_logging_and_progress_wrapper(capsys):
    configure_logging(logging.INFO)
    configure_logging(logging.INFO)  # idempotent: one handler
    logger = logging.getLogger("vlm_rewards.some.module")
    logger.info("library message")
    assert capsys.readouterr().err.count("library message") == 1
    assert list(tqdm_track(range(3), "items")) == [0, 1, 2]
    result = runner.invoke(app, ["--log-level", "loud", "rewards"])
    assert result.exit_code == 2
