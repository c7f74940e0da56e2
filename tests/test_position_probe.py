import json

import numpy as np
import pytest

from vlm_rewards.robotics.position_probe import probe_r2


def _tokens(rng, count, weights):
    features = rng.normal(size=(count, weights.shape[0]))
    presence = (rng.random((count, 2)) < 0.5).astype(float)
    offsets = np.stack([features @ weights, rng.random((count, 2))], axis=1)  # name 0 linear, name 1 noise
    return features, presence, offsets


def test_the_probe_reads_linearly_encoded_offsets_and_not_noise():
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(6, 2))
    scores = probe_r2(*_tokens(rng, 400, weights), *_tokens(rng, 200, weights), ["gripper", "red target"])
    assert scores["gripper"] == pytest.approx(1.0, abs=1e-3)  # ridge shrinks the fit a little
    assert scores["red target"] < 0.1


def test_a_name_shown_too_rarely_is_left_out():
    rng = np.random.default_rng(1)
    weights = rng.normal(size=(6, 2))
    fit, test = _tokens(rng, 400, weights), _tokens(rng, 200, weights)
    test[1][:, 1] = 0  # name 1 never shown in the test frames
    assert list(probe_r2(*fit, *test, ["gripper", "red target"])) == ["gripper"]


def test_the_command_scores_the_shipped_backbone(tmp_path):
    from typer.testing import CliRunner

    from vlm_rewards.resources import shipped_backbone
    from vlm_rewards.robotics import position_probe

    backbone = shipped_backbone()
    options = ["--output", str(tmp_path), "--fit-episodes", "6", "--test-episodes", "4", "--frames", "40"]
    result = CliRunner().invoke(position_probe.app, [str(backbone), *options])
    assert result.exit_code == 0, result.output
    scores = json.loads((tmp_path / "position_probe.json").read_text())[str(backbone)]
    assert "gripper" in scores and scores["gripper"] <= 1
