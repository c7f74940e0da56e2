"""`vlmr eval-rm` on an OpenGVL-style set: frames shown shuffled after the starting frame, predictions put back in
time order and scored with OpenGVL's VOC; bad records and episodes over the reward's frame budget left out."""

import json
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from tests.annotation_fixtures import ramp_frames
from vlm_rewards.evaluation.config import EvalRMConfig
from vlm_rewards.evaluation.evaluate import run_eval
from vlm_rewards.interface import RewardRequest, RewardResult
from vlm_rewards.registry import build_reward

FUNCTION = {"kind": "function", "dense": True, "value_range": [0.0, 1.0]}


def position_progress(request: RewardRequest) -> RewardResult:
    """Blind to the pixels: progress rises with the position in the clip."""
    progress = np.linspace(0.0, 1.0, request.num_frames)
    return RewardResult(reward=float(progress[-1]), progress=progress)


def write_set(root, num_episodes: int = 3, num_frames: int = 12, shown: int = 6) -> list[list[int]]:
    """OpenGVL's layout: episodes.jsonl and PNG frames; frames brighten with time. Returns each shown order."""
    rng = np.random.default_rng(0)
    lines, orders = [], []
    for episode in range(num_episodes):
        frames = ramp_frames(num_frames, seed=episode)
        folder = root / f"episode_{episode}"
        folder.mkdir(parents=True)
        for index, frame in enumerate(frames):
            Image.fromarray(frame).save(folder / f"{index:03d}.png")
        chosen = sorted(rng.choice(np.arange(1, num_frames), size=shown, replace=False).tolist())
        order = rng.permutation(chosen).tolist()
        orders.append(order)
        record = {
            "episode_index": episode,
            "instruction": "make it bright",
            "starting_frame": f"episode_{episode}/000.png",
            "shuffled_frames": [f"episode_{episode}/{index:03d}.png" for index in order],
            "shuffled_frames_indices": order,
            "original_frames_indices": chosen,
            "original_frames_task_completion_rates": [round(100 * i / (num_frames - 1)) for i in chosen],
        }
        lines.append(json.dumps({"eval_episode": record} if episode == 1 else record))  # both record shapes
    (root / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    return orders


def evaluate(tmp_path, function: str, max_frames: int | None = None) -> dict:
    config = EvalRMConfig(reward=FUNCTION | {"function": function}, opengvl=tmp_path / "set",
                          output_dir=tmp_path / "eval", evaluate_pairs=False)  # fmt: skip
    reward = build_reward(config.reward)
    reward.spec = replace(reward.spec, max_frames=max_frames)
    return run_eval(config, reward=reward)


def test_opengvl_voc_puts_shuffled_predictions_back_in_time_order(tmp_path):
    orders = write_set(tmp_path / "set")
    metrics = evaluate(tmp_path, "tests.annotation_fixtures:brightness_progress")
    assert metrics["opengvl_voc"] == pytest.approx(1.0) and metrics["opengvl_num_episodes"] == 3
    assert metrics["opengvl_progress_mae"] < 0.1 and metrics["opengvl_num_skipped"] == 0
    assert "num_episodes" not in metrics  # no episode dataset given: OpenGVL only, no synthetic data built
    lines = (tmp_path / "eval" / "opengvl_predictions.jsonl").read_text().splitlines()
    predictions = [json.loads(line) for line in lines]
    assert [p["shuffled_frames_indices"] for p in predictions] == orders
    first = predictions[0]
    brightest_shown = int(np.argmax(first["predicted_percentages"]))
    assert first["shuffled_frames_indices"][brightest_shown] == max(orders[0]) and first["voc"] == pytest.approx(1.0)

    # a reward that reads positions, not pixels: its VOC is the rank correlation of the shuffled order with time
    blind = evaluate(tmp_path, "tests.test_opengvl_eval:position_progress")
    from scipy.stats import spearmanr

    expected = np.mean([spearmanr(np.argsort(order), np.arange(len(order))).statistic for order in orders])
    assert blind["opengvl_voc"] == pytest.approx(expected) and blind["opengvl_voc"] < 0.9


def test_bad_records_and_episodes_over_the_frame_budget_are_left_out(tmp_path):
    write_set(tmp_path / "set", num_episodes=2, shown=4)
    with open(tmp_path / "set" / "episodes.jsonl", "a") as file:
        file.write("{not json\n")
        unknown_frame = {"instruction": "x", "shuffled_frames": [], "shuffled_frames_indices": [7],
                         "original_frames_indices": [1], "original_frames_task_completion_rates": [0]}  # fmt: skip
        file.write(json.dumps(unknown_frame) + "\n")
    metrics = evaluate(tmp_path, "tests.annotation_fixtures:brightness_progress")
    assert metrics["opengvl_num_episodes"] == 2 and metrics["opengvl_num_skipped"] == 2
    assert metrics["opengvl_voc"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no episode to score"):  # 1 + 4 frames shown, the reward takes 4
        evaluate(tmp_path, "tests.annotation_fixtures:brightness_progress", max_frames=4)
