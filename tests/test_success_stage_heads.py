"""Success and stage heads on the trained progress RM (issue #38 item 2): schema, training, results, RL, evaluation."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from tests.test_robotics_wrapper import SMALL, PixelProgress, frame_info, run_sb3
from vlm_rewards.data.episodes import EpisodeDataset, EpisodeRecord, write_episodes
from vlm_rewards.evaluation.evaluate import evaluate_progress
from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import BaseReward, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.models.backbones import build_tiny_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.heads import stage_loss, success_loss
from vlm_rewards.models.reward_network import CONFIG_FILE, RewardNetwork, export_version
from vlm_rewards.registry import build_reward
from vlm_rewards.robotics.collect import Rollout, to_record
from vlm_rewards.robotics.config import CollectConfig, RewardWrapperConfig
from vlm_rewards.robotics.reward_wrapper import RewardStreams
from vlm_rewards.training.batches import ProgressBatches
from vlm_rewards.training.config import Augment, TrainRMConfig
from vlm_rewards.training.train import _loss

NUM_FRAMES = 8
HEADS = {"success_head": True, "num_stages": 3, "max_frames": 8}


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory, one_torch_thread):
    return build_tiny_backbone("qwen2_5_vl", tmp_path_factory.mktemp("backbone"))


def episode(episode_id: int, instruction: str = "reach the red target", labels: bool = True) -> EpisodeRecord:
    """Frame t is filled with the value 10·t, so a clip's frames say which frames they are."""
    frames = np.repeat(np.arange(NUM_FRAMES, dtype=np.uint8)[:, None, None, None] * 10, 28, 1).repeat(28, 2)
    return EpisodeRecord(
        episode_id=episode_id,
        instruction=instruction,
        frames=np.repeat(frames, 3, 3),
        progress=np.linspace(0, 1, NUM_FRAMES),
        success=True,
        policy="expert",
        stage=np.arange(NUM_FRAMES) // 3 if labels else None,
        frame_success=np.arange(NUM_FRAMES) >= 5 if labels else None,
    )


def frame_indices(request: RewardRequest) -> np.ndarray:
    return request.frames[:, 0, 0, 0] // 10


def save_model(backbone_dir, path, **config) -> RewardNetwork:
    torch.manual_seed(0)
    model = RewardNetwork.from_backbone(backbone_dir, RewardNetworkConfig(**config))
    model.save_pretrained(path)
    return model


# ----------------------------------------------------------------------------- the episode schema


def test_per_frame_labels_round_trip_and_older_datasets_still_read(tmp_path):
    dataset = write_episodes(tmp_path / "new", [episode(0), episode(1, labels=False)])
    assert dataset.meta["format_version"] == 3
    np.testing.assert_array_equal(dataset[0].stage, [0, 0, 0, 1, 1, 1, 2, 2])
    np.testing.assert_array_equal(dataset[0].frame_success, np.arange(NUM_FRAMES) >= 5)
    assert dataset[1].stage is None and dataset[1].frame_success is None
    table = pq.read_table(tmp_path / "new" / "episodes.parquet")
    assert table["frame_success"].null_count == NUM_FRAMES  # episode 1's, unknown

    old = tmp_path / "old"  # a format-1 dataset: no per-frame columns, meta version 1
    write_episodes(old, [episode(0)])
    pq.write_table(
        pq.read_table(old / "episodes.parquet").drop_columns(["stage", "frame_success"]), old / "episodes.parquet"
    )
    meta = json.loads((old / "meta.json").read_text())
    (old / "meta.json").write_text(json.dumps({**meta, "format_version": 1}))
    record = EpisodeDataset(old)[0]
    assert record.stage is None and record.frame_success is None

    with pytest.raises(ValueError, match="stage labels must be ≥ 0"):
        EpisodeRecord(**{**vars(episode(0)), "stage": np.full(NUM_FRAMES, -2)})
    with pytest.raises(ValueError, match="frame_success must be"):
        EpisodeRecord(**{**vars(episode(0)), "frame_success": np.zeros(3, bool)})


def test_collect_takes_the_labels_from_the_env_infos():
    infos = [{"instruction": "carry it", "progress": t / 4, "is_success": t >= 3, "stage": min(t, 2)} for t in range(5)]
    frames = [np.full((16, 16, 3), t, np.uint8) for t in range(5)]
    rollout = Rollout("expert", {"top": frames}, infos, reference=None)
    config = CollectConfig(frame_stride=2)
    record = to_record(rollout, 0, config, stage_budgets=(0.5, 0.5))
    np.testing.assert_array_equal(record.stage, [0, 2, 2])  # frames 0, 2, 4
    np.testing.assert_array_equal(record.frame_success, [False, False, True])


# ----------------------------------------------------------------------------- training


def test_batches_carry_the_labels_of_the_frames_they_show(tmp_path):
    dataset = write_episodes(tmp_path / "d", [episode(0), episode(1, "push the block"), episode(2, labels=False)])
    augment = Augment(mismatch=0.2, reverse=0.2, rewind=0.2, stall=0.2, subsample=0.1)
    batches = ProgressBatches(dataset, batch_size=16, augment=augment, seed=0, max_frames=8)
    seen_mismatch = seen_unlabelled = False
    for step in range(4):
        batch = batches.batch(step)
        for row, request in enumerate(batch.requests):
            shown = frame_indices(request)
            success, stage = batch.success[row, : len(shown)].numpy(), batch.stage[row, : len(shown)].numpy()
            assert np.all(batch.stage[row, len(shown) :].numpy() == -1)
            if request.text != dataset[request.key.episode].instruction:
                seen_mismatch = True
                assert np.all(success == 0) and np.all(stage == -1)
            elif request.key.episode == 2:
                seen_unlabelled = True
                assert np.all(success == -1) and np.all(stage == -1)
            else:
                np.testing.assert_array_equal(success, shown >= 5)
                np.testing.assert_array_equal(stage, shown // 3)
    assert seen_mismatch and seen_unlabelled


def test_head_losses_use_only_known_labels():
    logits, mask = torch.randn(1, 4), torch.tensor([[True, True, True, False]])
    labels = torch.tensor([[1.0, -1.0, 0.0, 1.0]])
    base = success_loss(logits, labels, mask)
    assert torch.isclose(base, success_loss(logits, torch.tensor([[1.0, -1.0, 0.0, 0.0]]), mask))  # padding
    assert not torch.isclose(base, success_loss(logits, torch.tensor([[1.0, 1.0, 0.0, 1.0]]), mask))  # now known
    stages, stage_logits = torch.tensor([[0, -1, 2, 1]]), torch.randn(1, 4, 3)
    expected = torch.nn.functional.cross_entropy(stage_logits[0, [0, 2]], torch.tensor([0, 2]))
    assert torch.isclose(stage_loss(stage_logits, stages, mask), expected)


def test_training_fits_the_heads_jointly(backbone_dir, tmp_path):
    dataset = write_episodes(tmp_path / "d", [episode(0), episode(1, "push the block")])
    config = TrainRMConfig.model_validate({"optim": {"success_loss_weight": 2.0, "stage_loss_weight": 2.0}})
    torch.manual_seed(0)
    model = RewardNetwork.from_backbone(backbone_dir, RewardNetworkConfig(**HEADS))
    batches = ProgressBatches(dataset, batch_size=4, augment=Augment(mismatch=0.0), seed=0, max_frames=8)
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-2)
    batch = batches.batch(0)
    inputs = model.encode(batch.requests)

    def head_losses():
        with torch.no_grad():
            outputs = model(inputs)
        return (
            success_loss(outputs.success, batch.success, inputs.frame_mask).item(),
            stage_loss(outputs.stage, batch.stage, inputs.frame_mask).item(),
        )

    before = head_losses()
    for _ in range(25):  # one batch over and over: the heads must fit it
        loss = _loss(model, model, batches, 0, 0, config)
        optimizer.zero_grad()
        loss.backward()
        assert model.head.success[-1].weight.grad.abs().sum() > 0 and model.head.stage[-1].weight.grad.abs().sum() > 0
        optimizer.step()
    after = head_losses()
    assert after[0] < 0.85 * before[0] and after[1] < 0.85 * before[1], (before, after)

    small = RewardNetwork.from_backbone(backbone_dir, RewardNetworkConfig(success_head=True, num_stages=2))
    with pytest.raises(ValueError, match="stage label 2 in the training data, but model.reward.num_stages is 2"):
        _loss(small, small, batches, 0, 0, config)


# ----------------------------------------------------------------------------- results and sessions


def test_one_forward_gives_every_output_as_components(backbone_dir, tmp_path):
    model = save_model(backbone_dir, tmp_path / "rm", **HEADS)
    reward = build_reward({"kind": "trained_rm", "model": str(tmp_path / "rm")})
    assert reward.spec.components == ("success", "stage")
    requests = [RewardRequest(episode(0).frames[:n], "reach the red target") for n in (3, 6)]
    calls = []
    hook = reward.model.backbone.register_forward_hook(lambda *_: calls.append(1))
    results = reward.score(requests)
    hook.remove()
    assert len(calls) == 1
    for request, result in zip(requests, results):
        success, stages = result.info["success_per_frame"], result.info["stage_per_frame"]
        assert len(success) == len(stages) == request.num_frames
        assert result.components == {"success": success[-1], "stage": float(stages[-1])}
        assert all(0 < p < 1 for p in success) and set(stages) <= {0, 1, 2}
    batch = model.encode(requests)
    outputs = model.predict_all(batch)
    torch.testing.assert_close(outputs["progress"], model.predict(batch))
    np.testing.assert_allclose(results[1].info["success_per_frame"], outputs["success"][1, :6].tolist(), atol=1e-5)


def test_streaming_session_reports_the_components_of_each_stream(backbone_dir, tmp_path):
    save_model(backbone_dir, tmp_path / "rm", **HEADS)
    reward = build_reward({"kind": "trained_rm", "model": str(tmp_path / "rm")})
    frames = episode(0).frames
    texts = ["reach the red target", "push the block"]
    with reward.open_session(texts) as session:
        session.append([frames[:2], frames[:3]])
        session.append([frames[2:4], frames[3:4]])
        components = session.last_components
    for text, length, streamed in zip(texts, (4, 4), components):
        expected = reward.score([RewardRequest(frames[:length], text)])[0].components
        assert streamed["stage"] == expected["stage"]
        assert streamed["success"] == pytest.approx(expected["success"], abs=1e-4)


def test_checkpoints_without_the_heads_still_load(backbone_dir, tmp_path):
    """An export from before the heads existed: its recorded config lacks the new keys."""
    save_model(backbone_dir, tmp_path / "rm")
    record = json.loads((tmp_path / "rm" / CONFIG_FILE).read_text())
    for key in ("success_head", "num_stages"):
        del record["config"][key]
    record["version"] = export_version(record["config"], record["files"])
    (tmp_path / "rm" / CONFIG_FILE).write_text(json.dumps(record))
    reward = build_reward({"kind": "trained_rm", "model": str(tmp_path / "rm")})
    assert reward.spec.components == () and reward.spec.version == record["version"]
    assert reward.score([RewardRequest(episode(0).frames[:3], "reach")])[0].components == {}


# ----------------------------------------------------------------------------- RL wrapper


class SuccessAbove(PixelProgress):
    """PixelProgress with a `success` component: the last frame's mean pixel / 255."""

    def __init__(self):
        super().__init__()
        self.spec = RewardSpec("pixel_success", fingerprint("pixel_success"), (0.0, 1.0), dense=True, causal=True,
                               components=("success",))  # fmt: skip

    def _score(self, requests):
        return [RewardResult(r.reward, r.progress, components={"success": r.reward}) for r in super()._score(requests)]


def test_wrapper_bonus_follows_the_reward_s_predicted_success():
    config = RewardWrapperConfig(mode="replace", scale=0.0, success_bonus=5.0, success_threshold=0.5)
    streams = RewardStreams(SuccessAbove(), config, num_envs=2)
    streams.begin_episodes([0, 1], [frame_info(0), frame_info(0)])
    # env 0 reports success with a dark frame, env 1 none with a bright one: the reward's success decides
    infos = [frame_info(10, success=True), frame_info(200, success=False)]
    np.testing.assert_allclose(streams.add_step(infos, np.zeros(2), np.zeros(2, bool)), [0.0, 5.0])
    np.testing.assert_array_equal(streams.predicted_success, [False, True])


def test_a_reward_without_success_is_refused_naming_it():
    with pytest.raises(ValueError, match="reward 'pixel' has none"):
        RewardStreams(PixelProgress(), RewardWrapperConfig(success_threshold=0.5), num_envs=1)
    with pytest.raises(ValueError, match="terminate_on_success needs success_threshold"):
        RewardWrapperConfig(terminate_on_success=True)


def test_sb3_wrapper_ends_episodes_at_predicted_success():
    class AlwaysSucceeds(SuccessAbove):
        def _score(self, requests):
            return [RewardResult(r.reward, r.progress, components={"success": 1.0}) for r in super()._score(requests)]

    config = RewardWrapperConfig(mode="replace", success_threshold=0.9, terminate_on_success=True, goal_image=True)
    _, dones, _, streams = run_sb3(AlwaysSucceeds(), config, steps=3)
    assert dones.all()  # every step ends its episode, well before SMALL's 6-step limit
    _, dones, _, _ = run_sb3(AlwaysSucceeds(), config.model_copy(update={"terminate_on_success": False}), steps=3)
    assert not dones.any()
    assert SMALL.max_episode_steps > 3


# ----------------------------------------------------------------------------- evaluation


class Oracle(BaseReward):
    """Reads the frame index off the pixels: exact success (index ≥ 5) and stage (index // 3) per frame."""

    def __init__(self, wrong_stage: bool = False):
        self.wrong_stage = wrong_stage
        self.spec = RewardSpec("oracle", "v", (0.0, 1.0), dense=True, causal=True, components=("success", "stage"))

    def _score(self, requests):
        results = []
        for request in requests:
            shown = frame_indices(request).astype(int)
            success, stage = (shown >= 5).astype(float), (shown // 3 + self.wrong_stage) % 3
            info = {"success_per_frame": success.tolist(), "stage_per_frame": stage.tolist()}
            components = {"success": float(success[-1]), "stage": float(stage[-1])}
            results.append(RewardResult(float(shown[-1] / 7), shown / 7.0, components, info))
        return results


def test_evaluation_adds_success_auroc_and_stage_accuracy(tmp_path):
    still = episode(1)  # a failure: frame 0 throughout, never done, stage 0
    still = EpisodeRecord(**{**vars(still), "frames": still.frames[[0] * NUM_FRAMES], "success": False,
                             "progress": np.zeros(NUM_FRAMES), "stage": np.zeros(NUM_FRAMES, int),
                             "frame_success": np.zeros(NUM_FRAMES, bool)})  # fmt: skip
    dataset = write_episodes(tmp_path / "d", [episode(0), still, episode(2, labels=False)])
    metrics, _ = evaluate_progress(Oracle(), dataset, 4, np.random.default_rng(0))
    assert metrics["success_head_auroc_final"] == 1.0
    assert metrics["success_head_auroc_frame"] == 1.0
    assert metrics["stage_accuracy"] == 1.0
    wrong, _ = evaluate_progress(Oracle(wrong_stage=True), dataset, 4, np.random.default_rng(0))
    assert wrong["stage_accuracy"] == 0.0
    plain, _ = evaluate_progress(PixelProgress(), dataset, 4, np.random.default_rng(0))
    assert "success_head_auroc_final" not in plain and "stage_accuracy" not in plain
