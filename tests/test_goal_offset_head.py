"""The goal-offset head: simulation state (where the named goal is from the effector) as an auxiliary target of the
progress RM, from the env's info through collection, the episode schema and batches to the training loss."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tests.test_success_stage_heads import NUM_FRAMES, episode, frame_indices
from vlm_rewards.data.episodes import EpisodeDataset, EpisodeRecord, write_episodes
from vlm_rewards.models.backbones import build_tiny_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.heads import goal_offset_loss
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.robotics.collect import Rollout, relabelled_records, to_record
from vlm_rewards.robotics.config import CollectConfig, EnvConfig
from vlm_rewards.robotics.envs import make_env
from vlm_rewards.robotics.experts import make_expert
from vlm_rewards.robotics.tasks import WORKSPACE
from vlm_rewards.training.batches import ProgressBatches
from vlm_rewards.training.config import Augment, TrainRMConfig
from vlm_rewards.training.train import _loss

OFFSETS = np.stack([np.linspace(-1, 0, NUM_FRAMES), np.linspace(0.5, 0, NUM_FRAMES)], axis=1)


def with_offsets(episode_id: int, instruction: str = "reach the red target") -> EpisodeRecord:
    return EpisodeRecord(**{**vars(episode(episode_id, instruction)), "goal_offset": OFFSETS + episode_id})


def test_reach_reports_the_named_targets_offset_as_its_observation_has_it():
    env = make_env(EnvConfig(id="vlmr/Reach-v0", width=32, height=32))
    observation, info = env.reset(seed=3)
    for _ in range(3):
        observation, _, _, _, info = env.step(env.action_space.sample())
    np.testing.assert_allclose(info["goal_offset"] * WORKSPACE, observation[-2:], atol=1e-6)
    target = env.unwrapped.layout.target
    np.testing.assert_array_equal(info["target_offsets"][target], info["goal_offset"])
    env.close()


def test_carry_points_at_the_block_until_it_is_held_then_at_each_zone():
    env = make_env(EnvConfig(id="vlmr/Carry-v0", width=32, height=32, num_distractors=2))
    carry, expert = env.unwrapped, make_expert(env)
    observation, info = env.reset(seed=3)
    block_from_effector = observation[-4:-2]
    np.testing.assert_allclose(info["goal_offset"] * WORKSPACE, block_from_effector, atol=1e-6)
    np.testing.assert_array_equal(info["target_offsets"], np.repeat(info["goal_offset"][None], carry.num_zones, axis=0))
    while not carry.held:
        observation, *_, info = env.step(expert.act(observation))
    zone_from_block = observation[-2:]  # the block rides on the effector: the zone's offset from either
    np.testing.assert_allclose(info["goal_offset"] * WORKSPACE, zone_from_block, atol=1e-6)
    zones_from_effector = (carry.layout.zone_positions - carry.ee_position) / WORKSPACE
    np.testing.assert_allclose(info["target_offsets"], zones_from_effector, atol=1e-6)
    env.close()


def test_collect_keeps_the_offsets_of_the_frames_it_keeps_and_relabels_them_per_target():
    targets = ["reach the red target", "reach the blue target"]
    infos = [
        {
            "instruction": targets[0],
            "progress": t / 4,
            "is_success": False,
            "goal_offset": np.array([t, -t], float),
            "target_offsets": np.array([[t, -t], [10 + t, 0]], float),
            "target_progress": np.array([t / 4, 0.0]),
            "target_instructions": "|".join(targets),
        }
        for t in range(5)
    ]
    rollout = Rollout("expert", {"top": [np.full((16, 16, 3), t, np.uint8) for t in range(5)]}, infos, reference=None)
    config = CollectConfig(frame_stride=2)
    record = to_record(rollout, 0, config, stage_budgets=(1.0,))
    np.testing.assert_array_equal(record.goal_offset, [[0, 0], [2, -2], [4, -4]])  # frames 0, 2, 4
    (relabelled,) = relabelled_records(rollout, 1, config)
    assert relabelled.instruction == targets[1]
    np.testing.assert_array_equal(relabelled.goal_offset, [[10, 0], [12, 0], [14, 0]])
    without = [{k: v for k, v in info.items() if "offset" not in k} for info in infos]
    assert to_record(Rollout("expert", rollout.frames, without, None), 0, config, (1.0,)).goal_offset is None


def test_offsets_round_trip_and_a_partly_known_episode_is_refused(tmp_path):
    dataset = write_episodes(tmp_path / "d", [with_offsets(0), episode(1)])
    assert dataset.meta["format_version"] == 3
    np.testing.assert_allclose(dataset[0].goal_offset, OFFSETS)
    assert dataset[1].goal_offset is None
    table = pq.read_table(tmp_path / "d" / "episodes.parquet")
    assert table["goal_offset_x"].null_count == NUM_FRAMES  # episode 1's, unknown
    column = table["goal_offset_x"].to_pylist()
    column[2] = None  # one frame of episode 0 unknown
    index = table.schema.get_field_index("goal_offset_x")
    pq.write_table(
        table.set_column(index, "goal_offset_x", pa.array(column, pa.float32())), tmp_path / "d" / "episodes.parquet"
    )
    with pytest.raises(ValueError, match="goal_offset is null on 1 of 8 frames"):
        EpisodeDataset(tmp_path / "d")
    with pytest.raises(ValueError, match="goal_offset must be"):
        EpisodeRecord(**{**vars(episode(0)), "goal_offset": np.full((NUM_FRAMES, 2), np.nan)})


def test_batches_carry_the_offsets_of_the_frames_they_show(tmp_path):
    dataset = write_episodes(tmp_path / "d", [with_offsets(0), with_offsets(1, "push the block"), episode(2)])
    augment = Augment(mismatch=0.2, reverse=0.2, rewind=0.2, stall=0.2, subsample=0.1)
    batches = ProgressBatches(dataset, batch_size=16, augment=augment, seed=0, max_frames=8)
    seen = set()
    for step in range(4):
        batch = batches.batch(step)
        for row, request in enumerate(batch.requests):
            shown = frame_indices(request)
            offsets = batch.goal_offset[row, : len(shown)].numpy()
            assert torch.isnan(batch.goal_offset[row, len(shown) :]).all()
            episode_id = request.key.episode
            if request.text != dataset[episode_id].instruction or episode_id == 2:  # another goal, or unknown
                seen.add("unknown")
                assert np.isnan(offsets).all()
            else:
                seen.add("known")
                np.testing.assert_allclose(offsets, OFFSETS[shown] + episode_id)
    assert seen == {"known", "unknown"}


def test_the_loss_counts_only_known_offsets():
    predicted, mask = torch.randn(1, 3, 2), torch.tensor([[True, True, False]])
    labels = torch.tensor([[[0.5, 0.5], [float("nan"), float("nan")], [1.0, 1.0]]])
    expected = (predicted[0, 0] - labels[0, 0]).square().sum()
    assert torch.isclose(goal_offset_loss(predicted, labels, mask), expected)


def test_training_fits_the_offset_head(tmp_path, one_torch_thread):
    backbone_dir = build_tiny_backbone("qwen2_5_vl", tmp_path / "backbone")
    dataset = write_episodes(tmp_path / "d", [with_offsets(0), with_offsets(1, "push the block")])
    config = TrainRMConfig.model_validate({"optim": {"goal_offset_loss_weight": 2.0}})
    torch.manual_seed(0)
    model = RewardNetwork.from_backbone(backbone_dir, RewardNetworkConfig(goal_offset_head=True, max_frames=8))
    batches = ProgressBatches(dataset, batch_size=4, augment=Augment(mismatch=0.0), seed=0, max_frames=8)
    batch = batches.batch(0)
    inputs = model.encode(batch.requests)

    def offset_loss() -> float:
        with torch.no_grad():
            return goal_offset_loss(model(inputs).goal_offset, batch.goal_offset, inputs.frame_mask).item()

    optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-2)
    before = offset_loss()
    for _ in range(25):  # one batch over and over: the head must fit it
        loss = _loss(model, model, batches, 0, 0, config)
        optimizer.zero_grad()
        loss.backward()
        assert model.head.goal_offset.weight.grad.abs().sum() > 0
        optimizer.step()
    assert offset_loss() < 0.5 * before
    with pytest.raises(ValueError, match="goal_offset_head need a progress model"):
        RewardNetworkConfig(task="preference", head="scalar", goal_offset_head=True)
