"""`vlm_rewards.robotics.potential_map`: a reward over a grid of effector positions, beside the true progress."""

import json

import numpy as np
from typer.testing import CliRunner

from vlm_rewards.interface import RewardResult
from vlm_rewards.registry import REWARDS_DIR, build_reward
from vlm_rewards.rewards.function import FunctionReward
from vlm_rewards.robotics.config import PipelineConfig
from vlm_rewards.robotics.envs import make_env
from vlm_rewards.robotics.potential_map import PotentialMap, app, potential_maps


def test_placing_the_effector_moves_only_the_effector_and_reports_the_new_progress():
    env = make_env(PipelineConfig().env)
    env.reset(seed=3)
    task = env.unwrapped
    targets = task.layout.positions.copy()
    at_goal = task.place_effector(task.goal_position)
    assert at_goal["is_success"] and at_goal["progress"] == 1.0
    away = task.place_effector(-task.goal_position)
    assert not away["is_success"] and away["progress"] < 1.0
    np.testing.assert_allclose(task.ee_position, -task.goal_position)
    np.testing.assert_array_equal(task.layout.positions, targets)
    env.close()


def test_a_frame_reading_reward_maps_like_the_true_progress_and_a_blind_one_does_not():
    config = PipelineConfig()
    scripted = build_reward(config.scripted_reward_config)  # effector to the named disc, from the pixels
    blind = FunctionReward(  # progress from the frame's overall brightness: blind to where things are
        lambda request: RewardResult(
            float(request.frames[-1].mean() / 255), request.frames.reshape(request.num_frames, -1).mean(1) / 255
        ),
        dense=True,
    )
    [mapped] = potential_maps(scripted, config.env, "top", seeds=[50_000], points=7)
    assert mapped.learned.shape == mapped.true.shape == (7, 7)
    assert mapped.instruction.startswith("reach the") and mapped.correlation > 0.6
    [flat] = potential_maps(blind, config.env, "top", seeds=[50_000], points=7)
    np.testing.assert_array_equal(flat.true, mapped.true)  # the same layout and points
    assert abs(flat.correlation) < mapped.correlation - 0.3
    assert mapped.slope_correlation > 0.6 and abs(flat.slope_correlation) < mapped.slope_correlation - 0.3


def test_a_plateau_per_quadrant_correlates_in_value_but_not_in_slope():
    x, y = np.meshgrid(np.linspace(-1, 1, 16), np.linspace(-1, 1, 16))
    true = np.clip(1 - np.hypot(x - 0.5, y - 0.5) / 2, 0, 1)
    quadrant_mean = np.zeros_like(true)
    for rows in (slice(0, 8), slice(8, 16)):
        for columns in (slice(0, 8), slice(8, 16)):
            quadrant_mean[rows, columns] = true[rows, columns].mean()
    plateaus = PotentialMap(0, "reach the red target", quadrant_mean, true)
    assert plateaus.correlation > 0.8
    assert plateaus.slope_correlation < 0.4
    smooth = PotentialMap(0, "reach the red target", 0.5 * true + 0.1, true)
    assert np.isclose(smooth.slope_correlation, 1.0)


def test_the_command_writes_the_figure_and_the_grids(tmp_path):
    reward = REWARDS_DIR / f"{PipelineConfig().scripted_reward_config}.yaml"
    result = CliRunner().invoke(app, [str(reward), "--output", str(tmp_path), "--layouts", "2", "--points", "4"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "potential_map.json").read_text())
    assert [layout["seed"] for layout in summary["layouts"]] == [50_000, 50_001]
    assert np.array(summary["layouts"][0]["learned"]).shape == (4, 4)
    assert -1 <= summary["layouts"][0]["slope_correlation"] <= 1
    assert (tmp_path / "potential_map.png").read_bytes().startswith(b"\x89PNG")
