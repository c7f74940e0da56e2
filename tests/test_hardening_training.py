"""Hardening of training, export, datasets and evaluation: each test failed before its fix."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from vlm_rewards.config import load_job_config
from vlm_rewards.data.build import SyntheticData, build_progress_dataset
from vlm_rewards.data.episodes import EpisodeDataset, PairDataset, write_episodes
from vlm_rewards.evaluation.config import EvalRMConfig
from vlm_rewards.evaluation.evaluate import frame_pair_accuracy, run_eval
from vlm_rewards.fingerprint import fingerprint_files
from vlm_rewards.interface import RewardRequest, RewardResult
from vlm_rewards.models.backbones import build_tiny_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.device import resolve_device
from vlm_rewards.models.heads import bradley_terry_loss
from vlm_rewards.models.reward_network import CONFIG_FILE, HEAD_FILE, RewardNetwork
from vlm_rewards.models.trained_reward import TrainedRewardModel
from vlm_rewards.subsample import subsample_indices
from vlm_rewards.training.batches import ProgressBatches, shifted
from vlm_rewards.training.config import Augment, Lora, TrainRMConfig
from vlm_rewards.training.train import (
    CHECKPOINT_CONFIG,
    _datasets,
    _resumable_checkpoint,
    apply_lora,
    build_scheduler,
    tiny_backbone_dir,
)


@pytest.fixture(scope="module")
def backbone_dir(tmp_path_factory):
    return build_tiny_backbone("qwen2_5_vl", tmp_path_factory.mktemp("backbone"), num_layers=1, vision_depth=1)


def small_episodes(folder, num_episodes=2, num_frames=4, **settings):
    return build_progress_dataset(folder, num_episodes=num_episodes, seed=0, num_frames=num_frames, size=28, **settings)


# ----------------------------------------------------------------------------- 1: cached artefacts


def test_synthetic_data_is_rebuilt_when_its_settings_change(tmp_path):
    first = SyntheticData(num_episodes=2, num_frames=3, frame_size=28).episodes(tmp_path)
    again = SyntheticData(num_episodes=2, num_frames=3, frame_size=28).episodes(tmp_path)
    changed = SyntheticData(num_episodes=3, num_frames=3, frame_size=28, seed=7).episodes(tmp_path)
    assert again.root == first.root  # same settings: reused
    assert changed.root != first.root and len(changed) == 3
    assert changed.meta["generator"]["seed"] == 7
    pairs = SyntheticData(num_pairs=2, frame_size=28).pairs(tmp_path)
    assert len(SyntheticData(num_pairs=3, frame_size=28).pairs(tmp_path)) == 3 and len(pairs) == 2


def test_tiny_backbone_folder_follows_its_settings(tmp_path):
    config = load_job_config(TrainRMConfig, overrides=[f"output_dir={tmp_path}"])
    wider = load_job_config(TrainRMConfig, overrides=[f"output_dir={tmp_path}", "model.tiny.hidden_size=64"])
    assert tiny_backbone_dir(config) != tiny_backbone_dir(wider)
    same = load_job_config(TrainRMConfig, overrides=[f"output_dir={tmp_path}"])
    assert tiny_backbone_dir(config) == tiny_backbone_dir(same)


# ----------------------------------------------------------------------------- 2: resume checks settings


def fake_checkpoint(config: TrainRMConfig, step: int = 3):
    path = config.output_dir / "checkpoints" / f"step_{step}"
    path.mkdir(parents=True)
    (path / CHECKPOINT_CONFIG).write_text(json.dumps(config.model_dump(mode="json")))
    (path / "complete").write_text(f"{step}\n")
    return path


def test_resume_refuses_changed_settings_and_names_them(tmp_path):
    base = [f"output_dir={tmp_path}"]
    path = fake_checkpoint(load_job_config(TrainRMConfig, overrides=base))
    assert _resumable_checkpoint(load_job_config(TrainRMConfig, overrides=base)) == (3, path)
    allowed = [*base, "eval_every=7", "log_every=3", "keep_checkpoints=5", "data.synthetic_eval.num_episodes=5"]
    assert _resumable_checkpoint(load_job_config(TrainRMConfig, overrides=allowed)) == (3, path)
    with pytest.raises(ValueError, match=r"optim\.lr: 0\.0005 -> 0\.01"):
        _resumable_checkpoint(load_job_config(TrainRMConfig, overrides=[*base, "optim.lr=0.01"]))
    with pytest.raises(ValueError, match=r"model\.reward\.head: 'regression' -> 'bins'"):
        _resumable_checkpoint(load_job_config(TrainRMConfig, overrides=[*base, "model.reward.head=bins"]))


def test_starting_over_removes_the_earlier_runs_checkpoints(tmp_path):
    """resume=false must not leave a longer earlier run's later checkpoints to be resumed from next time."""
    from accelerate import Accelerator

    from vlm_rewards.training.train import _checkpoints, _clear_checkpoints

    fake_checkpoint(load_job_config(TrainRMConfig, overrides=[f"output_dir={tmp_path}"]), step=900)
    _clear_checkpoints(Accelerator(cpu=True), tmp_path)
    assert _checkpoints(tmp_path) == []


# ----------------------------------------------------------------------------- 3, 4, 8: export


def export(backbone_dir, path, seed=0, **config):
    torch.manual_seed(seed)
    model = RewardNetwork.from_backbone(backbone_dir, RewardNetworkConfig(**config))
    return model, model.save_pretrained(path, extra={"step": 1})


def test_export_is_atomic_and_replaces_safely(backbone_dir, tmp_path, monkeypatch):
    model, version = export(backbone_dir, tmp_path / "model")
    before = fingerprint_files(tmp_path / "model")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("crash between backbone and head")

    other, _ = export(backbone_dir, tmp_path / "scratch", seed=1)
    monkeypatch.setattr(other.processor, "save_pretrained", crash)
    with pytest.raises(KeyboardInterrupt):
        other.save_pretrained(tmp_path / "model")
    assert fingerprint_files(tmp_path / "model") == before  # untouched, no mix of two exports
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "scratch"]  # no temporary left
    assert RewardNetwork.from_pretrained(tmp_path / "model") is not None
    monkeypatch.undo()
    new_version = other.save_pretrained(tmp_path / "model")  # replaces the complete export
    assert new_version != version
    assert json.loads((tmp_path / "model" / CONFIG_FILE).read_text())["version"] == new_version


def test_version_covers_every_file_and_is_checked_on_load(backbone_dir, tmp_path):
    _, version = export(backbone_dir, tmp_path / "a")
    _, same_weights = export(backbone_dir, tmp_path / "b")
    _, other_head = export(backbone_dir, tmp_path / "c", seed=1)
    _, other_config = export(backbone_dir, tmp_path / "d", max_frames=8)
    assert version == same_weights  # the same outputs: the same version
    assert len({version, other_head, other_config}) == 3
    record = json.loads((tmp_path / "a" / CONFIG_FILE).read_text())
    assert {HEAD_FILE, "model.safetensors", "config.json"} <= set(record["files"])
    assert any("token" in name for name in record["files"])  # the tokenizer/processor files count too

    # edited weights: a clear error naming the file, from both loaders
    from safetensors.torch import load_file, save_file

    head = load_file(tmp_path / "b" / HEAD_FILE)
    save_file({k: v + 1 for k, v in head.items()}, str(tmp_path / "b" / HEAD_FILE))
    with pytest.raises(ValueError, match=r"reward_head\.safetensors \(changed\)"):
        RewardNetwork.from_pretrained(tmp_path / "b")
    with pytest.raises(ValueError, match=r"reward_head\.safetensors \(changed\)"):
        TrainedRewardModel.from_params(TrainedRewardModel.Params(model=str(tmp_path / "b"), device="cpu"))
    weights = tmp_path / "c" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated backbone
    with pytest.raises(ValueError, match=r"model\.safetensors \(changed\)"):
        RewardNetwork.from_pretrained(tmp_path / "c")
    reward = TrainedRewardModel.from_params(TrainedRewardModel.Params(model=str(tmp_path / "a"), device="cpu"))
    assert reward.spec.version == version


def test_bad_reward_model_files_are_clear_errors(backbone_dir, tmp_path):
    export(backbone_dir, tmp_path / "rm")
    record = json.loads((tmp_path / "rm" / CONFIG_FILE).read_text())
    (tmp_path / "rm" / HEAD_FILE).write_bytes((tmp_path / "rm" / HEAD_FILE).read_bytes()[:20])
    with pytest.raises(ValueError, match="reward_head.safetensors"):
        RewardNetwork.from_pretrained(tmp_path / "rm")
    for broken, message in [
        ({k: v for k, v in record.items() if k != "files"}, "no per-file hashes"),
        ({k: v for k, v in record.items() if k != "version"}, "no version"),
        ({**record, "config": {"task": "nope"}}, "not a valid reward-model config"),
        ([1, 2], "expected a JSON object"),
        ({**record, "version": "0123456789ab"}, "does not match its config"),
    ]:
        (tmp_path / "rm" / CONFIG_FILE).write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=message):
            RewardNetwork.from_pretrained(tmp_path / "rm")
    with pytest.raises(ValueError, match="no such reward-model folder"):
        RewardNetwork.from_pretrained(tmp_path / "missing")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="not a torch device"):
        resolve_device("gpu0")
    with pytest.raises(ValueError, match="CUDA is not available"):
        TrainedRewardModel.from_params(TrainedRewardModel.Params(model="anything", device="cuda"))


# ----------------------------------------------------------------------------- 5: training math


def test_bradley_terry_tie_loss_is_per_sample():
    chosen, rejected = torch.tensor([3.0, 0.0, -1.0]), torch.tensor([0.0, 0.0, 1.0])
    tie = torch.tensor([False, True, False])
    loss = bradley_terry_loss(chosen, rejected, tie=tie)
    difference = chosen - rejected
    expected = torch.stack(
        [
            -torch.nn.functional.logsigmoid(difference[0]),
            torch.nn.functional.binary_cross_entropy_with_logits(difference[1], torch.tensor(0.5)),
            -torch.nn.functional.logsigmoid(difference[2]),
        ]
    ).mean()
    torch.testing.assert_close(loss, expected)


def run_schedule(accumulation: int, steps: int = 8, warmup: int = 1) -> list[float]:
    """The train loop's optimizer/scheduler calls under accelerate; the lr after each micro-step."""
    from accelerate import Accelerator

    config = load_job_config(
        TrainRMConfig,
        overrides=[
            f"optim.steps={steps}",
            f"optim.gradient_accumulation={accumulation}",
            f"optim.warmup_steps={warmup}",
            f"save_every={accumulation}",
        ],
    )
    accelerator = Accelerator(gradient_accumulation_steps=accumulation)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.optim.lr)
    scheduler = build_scheduler(optimizer, config, accelerator.num_processes)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    lrs = []
    for _ in range(steps):
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(1, 2)).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])
    return lrs


@pytest.mark.parametrize("accumulation", [1, 2])
def test_lr_schedule_ends_at_zero_with_gradient_accumulation(accumulation):
    lrs = run_schedule(accumulation)
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert max(lrs) == pytest.approx(5e-4)  # the peak is reached after warmup
    assert lrs[-2] > 0  # and not before the last update


def test_lr_schedule_length_counts_processes():
    """AcceleratedScheduler steps the wrapped scheduler num_processes times per update (split_batches=False)."""
    config = load_job_config(
        TrainRMConfig, overrides=["optim.steps=8", "optim.gradient_accumulation=2", "optim.warmup_steps=1"]
    )
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, config, num_processes=3)
    lrs = []
    for _ in range(8 // 2):  # optimizer updates
        optimizer.step()
        for _ in range(3):
            scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12) and lrs[-2] > 0


def test_head_only_updates_hold_the_backbone_then_warm_it_up():
    config = load_job_config(
        TrainRMConfig, overrides=["optim.steps=8", "optim.warmup_steps=2", "optim.head_only_updates=3"]
    )
    backbone, head = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    groups = [{"params": backbone.parameters(), "name": "backbone"}, {"params": head.parameters(), "name": "head"}]
    optimizer = torch.optim.AdamW(groups, lr=1.0)
    scheduler = build_scheduler(optimizer, config, num_processes=1)
    lrs = []
    for _ in range(8):
        lrs.append(scheduler.get_last_lr())
        optimizer.step()
        scheduler.step()
    backbone_lrs, head_lrs = zip(*lrs)
    assert backbone_lrs[:4] == (0.0, 0.0, 0.0, 0.0) and backbone_lrs[4] == pytest.approx(0.5)  # its own warmup
    assert head_lrs[:3] == pytest.approx([0.0, 0.5, 1.0])
    assert max(backbone_lrs) == pytest.approx(1.0) and backbone_lrs[-1] > 0 and scheduler.get_last_lr()[0] == 0.0
    with pytest.raises(ValueError, match="head_only_updates"):
        load_job_config(TrainRMConfig, overrides=["optim.steps=8", "optim.head_only_updates=8"])


def test_lora_stays_out_of_the_vision_tower(backbone_dir):
    bare = Lora(enabled=True, r=2, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"])
    model = RewardNetwork.from_backbone(backbone_dir, RewardNetworkConfig())
    with pytest.raises(ValueError, match=r"vision tower \(visual\.blocks\.0\.mlp"):
        apply_lora(model, bare, freeze_vision=True)
    shipped = load_job_config(TrainRMConfig, "configs/train_rm/progress_lora_qwen2_5_vl_3b.yaml")
    assert shipped.model.freeze_vision
    model = RewardNetwork.from_backbone(backbone_dir, RewardNetworkConfig())
    apply_lora(model, shipped.model.lora.model_copy(update={"r": 2}), freeze_vision=True)
    adapted = {name for name, _ in model.backbone.named_modules() if name.endswith("lora_A")}
    assert adapted and not any("visual" in name for name in adapted)
    for suffix in ("q_proj", "gate_proj", "down_proj"):
        assert any(name.endswith(f"mlp.{suffix}.lora_A") or name.endswith(f"attn.{suffix}.lora_A") for name in adapted)


# ----------------------------------------------------------------------------- 6: NaN frames in eval


def judge_like(request: RewardRequest) -> RewardResult:
    """Progress = elapsed time, but frame 1 unscored, and episodes of the 'random' kind not at all."""
    progress = np.linspace(0, 1, request.num_frames)
    progress[1] = np.nan
    if request.key is not None and request.key.episode % 5 == 0:
        progress[:] = np.nan
    return RewardResult(reward=float(progress[-1]), progress=progress, error="could not parse some frames")


def test_eval_leaves_out_and_counts_unscored_frames(tmp_path):
    reward = {"kind": "function", "function": "tests.test_hardening_training:judge_like", "dense": True}
    synthetic = SyntheticData(num_episodes=12, num_pairs=4, num_frames=5, frame_size=28, seed=7)
    metrics = run_eval(EvalRMConfig(reward=reward, synthetic=synthetic, output_dir=tmp_path))
    unscored_episodes = sum(1 for episode in range(12) if episode % 5 == 0)
    assert metrics["num_unscored_episodes"] == unscored_episodes
    assert metrics["num_unscored_frames"] == unscored_episodes * 5 + (12 - unscored_episodes)
    assert np.isfinite(metrics["frame_pair_accuracy"])
    assert frame_pair_accuracy([np.array([np.nan, 0.5, 1.0])], [np.array([0.0, 0.5, 1.0])]) == 1.0


# ----------------------------------------------------------------------------- 8: bad files and settings


def test_missing_dataset_folders_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="nonexistent: no such dataset folder"):
        run_eval(EvalRMConfig(episodes=tmp_path / "nonexistent", output_dir=tmp_path / "out"))
    config = load_job_config(TrainRMConfig, overrides=[f"output_dir={tmp_path}", f"data.train={tmp_path / 'nope'}"])
    with pytest.raises(ValueError, match="nope: no such dataset folder"):
        _datasets(config)
    with pytest.raises(ValueError, match="no such dataset folder"):
        PairDataset(tmp_path / "nope")
    small_episodes(tmp_path / "ds")
    several = load_job_config(
        TrainRMConfig, overrides=[f"output_dir={tmp_path}", f"data.train=[{tmp_path / 'ds'}, {tmp_path / 'nope'}]"]
    )
    with pytest.raises(ValueError, match="nope: no such dataset folder"):
        _datasets(several)


def test_several_training_folders_are_read_as_one_for_progress_only(tmp_path):
    first, second = small_episodes(tmp_path / "a"), small_episodes(tmp_path / "b")
    config = load_job_config(
        TrainRMConfig, overrides=[f"output_dir={tmp_path}", f"data.train=[{tmp_path / 'a'}, {tmp_path / 'b'}]"]
    )
    train, _ = _datasets(config)
    assert len(train) == len(first) + len(second) and train.name == "a+b"
    with pytest.raises(ValueError, match="only a progress RM reads several episode folders"):
        load_job_config(
            TrainRMConfig,
            overrides=[
                f"output_dir={tmp_path}",
                "model.reward={task: preference, head: scalar}",
                f"data.train=[{tmp_path / 'a'}, {tmp_path / 'b'}]",
            ],
        )
    with pytest.raises(ValueError, match="names no episode folder"):
        load_job_config(TrainRMConfig, overrides=[f"output_dir={tmp_path}", "data.train=[]"])


def test_corrupt_dataset_files_name_themselves(tmp_path):
    dataset = small_episodes(tmp_path / "ds")
    frames = tmp_path / "ds" / "frames" / "episode_000000.npz"
    frames.write_bytes(frames.read_bytes()[: len(frames.read_bytes()) // 2])
    with pytest.raises(ValueError, match=r"episode_000000\.npz: (unreadable|not a readable)"):
        dataset[0]
    meta = tmp_path / "ds" / "meta.json"
    content = json.loads(meta.read_text())
    meta.write_text("{truncated")
    with pytest.raises(ValueError, match=r"meta\.json: not valid JSON"):
        EpisodeDataset(tmp_path / "ds")
    meta.write_text(json.dumps({k: v for k, v in content.items() if k != "clips"}))
    with pytest.raises(ValueError, match=r"meta\.json: key 'clips' missing"):
        EpisodeDataset(tmp_path / "ds")


def test_a_crashed_dataset_write_blocks_nothing(tmp_path):
    good = list(small_episodes(tmp_path / "source", num_episodes=2))

    def crashing():
        yield good[0]
        raise KeyboardInterrupt("crash mid-write")

    with pytest.raises(KeyboardInterrupt):
        write_episodes(tmp_path / "ds", crashing())
    assert not (tmp_path / "ds").exists() and [p.name for p in tmp_path.iterdir()] == ["source"]
    # an orphan left by a killed writer (a dead pid) is removed by the next write
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f".ds.{int(dead.stdout)}.deadbeef.tmp"
    (orphan / "frames").mkdir(parents=True)
    assert len(write_episodes(tmp_path / "ds", good)) == 2
    assert not orphan.exists()
    with pytest.raises(FileExistsError):
        write_episodes(tmp_path / "ds", good)


INVALID_TRAIN = [
    ("keep_checkpoints=-1", "keep_checkpoints"),
    ("keep_checkpoints=0", "keep_checkpoints"),
    ("save_every=0", "save_every"),
    ("log_every=0", "log_every"),
    ("eval_every=0", "eval_every"),
    ("optim.gradient_accumulation=0", "gradient_accumulation"),
    ("optim.batch_size=0", "batch_size"),
    ("optim.steps=0", "steps"),
    ("optim.steps=-5", "steps"),
    ("optim.warmup_steps=-1", "warmup_steps"),
    ("optim.lr=0", "lr"),
    ("optim.lr=-0.1", "lr"),
    ("optim.steps=7 optim.gradient_accumulation=2", "multiple of gradient_accumulation"),
    ("data.augment.mismatch=1.5", "mismatch"),
    ("data.augment.reverse=-0.1", "reverse"),
    ("data.augment.mismatch=0.6 data.augment.reverse=0.6", "sum to 1.45"),
    ("output_dir=", "output_dir"),
    ("output_dir=.", "output_dir"),
    ("data.synthetic_train.num_episodes=0", "num_episodes"),
    ("data.synthetic_train.num_pairs=0", "num_pairs"),
    ("data.synthetic_eval.num_frames=0", "num_frames"),
    ("data.synthetic_eval.frame_size=0", "frame_size"),
    ("model.tiny.hidden_size=0", "hidden_size"),
    ("model.lora.r=0", "r"),
]
INVALID_EVAL = [("batch_size=0", "batch_size"), ("batch_size=-1", "batch_size"), ("output_dir=", "output_dir")]
INVALID_EVAL += [("synthetic.num_episodes=0", "num_episodes"), ("synthetic.frame_size=-2", "frame_size")]


@pytest.mark.parametrize(
    ("model", "overrides", "key"),
    [(TrainRMConfig, o, k) for o, k in INVALID_TRAIN] + [(EvalRMConfig, o, k) for o, k in INVALID_EVAL],
)
def test_invalid_numeric_settings_are_refused_at_load(model, overrides, key):
    with pytest.raises(ValueError, match=key):
        load_job_config(model, overrides=overrides.split(" "))


# ----------------------------------------------------------------------------- 10: long episodes


def test_long_episodes_are_subsampled_to_the_frame_budget(tmp_path):
    dataset = small_episodes(tmp_path / "long", num_episodes=3, num_frames=12)
    keep = subsample_indices(12, 5)
    assert keep[0] == 0 and keep[-1] == 11 and len(keep) == 5
    plain = ProgressBatches(dataset, 4, Augment(mismatch=0, reverse=0, rewind=0, stall=0), seed=0, max_frames=5)
    batch = plain.batch(0)
    for request, labels in zip(batch.requests, batch.labels):
        episode = dataset[request.key.episode]
        assert request.num_frames == 5
        np.testing.assert_array_equal(request.frames, episode.frames[keep])
        np.testing.assert_allclose(labels.numpy(), episode.progress[keep])
    augmented = ProgressBatches(dataset, 16, Augment(mismatch=0.2, reverse=0.2, rewind=0.3, stall=0.2), 0, 5)
    assert all(request.num_frames <= 5 for request in augmented.batch(1).requests)
    assert augmented.batch(1).labels.shape[1] <= 5


def test_clip_frames_caps_training_clips_and_keeps_the_first_frame(tmp_path):
    dataset = small_episodes(tmp_path / "long", num_episodes=3, num_frames=12)
    capped = ProgressBatches(dataset, 8, Augment(mismatch=0, reverse=0, rewind=0, stall=0), 0, clip_frames=4)
    orders = set()
    for step in range(3):
        batch = capped.batch(step)
        assert batch.labels.shape[1] == 4
        for request, labels in zip(batch.requests, batch.labels):
            episode = dataset[request.key.episode]
            np.testing.assert_array_equal(request.frames[0], episode.frames[0])  # the first frame stays
            np.testing.assert_allclose(labels[0].item(), episode.progress[0])
            np.testing.assert_allclose(labels[-1].item(), episode.progress[request.key.frame])
            assert all(np.isclose(episode.progress, label).any() for label in labels.numpy())
            orders.add(request.key.frame)
    assert len(orders) > 1  # random subsets, not one fixed spacing
    positions = capped._cap(np.arange(12), np.random.default_rng(0))
    assert positions[0] == 0 and len(positions) == 4 and (np.diff(positions) > 0).all()
    mixed = ProgressBatches(dataset, 16, Augment(mismatch=0.3, reverse=0.2, rewind=0.3, stall=0.2), 0, clip_frames=4)
    assert all(request.num_frames <= 4 for request in mixed.batch(1).requests)
    plain = ProgressBatches(dataset, 4, Augment(mismatch=0, reverse=0, rewind=0, stall=0), seed=0)
    assert all(request.num_frames == 12 for request in plain.batch(0).requests)
    shuffled = ProgressBatches(dataset, 4, Augment(mismatch=0, reverse=0, rewind=0, stall=0), 0, 5, 4, True)
    orders = [shuffled._cap(np.arange(12), np.random.default_rng(seed)) for seed in range(20)]
    assert all(order[0] == 0 and len(order) == 4 and len(set(order)) == 4 for order in orders)
    assert any((np.diff(order) < 0).any() for order in orders)  # not always in time order
    whole = ProgressBatches(dataset, 4, Augment(mismatch=0, reverse=0, rewind=0, stall=0), 0, clip_shuffle=True)
    order = whole._cap(np.arange(12), np.random.default_rng(1))
    assert order[0] == 0 and sorted(order) == list(range(12))  # no cap: every frame, shuffled after the first
    for request, labels in zip(shuffled.batch(0).requests, shuffled.batch(0).labels):
        episode = dataset[request.key.episode]
        np.testing.assert_allclose(labels[-1].item(), episode.progress[request.key.frame])


def test_shift_moves_every_frame_and_view_of_a_clip_by_one_offset(tmp_path):
    frames = np.zeros((3, 12, 12, 3), np.uint8)
    frames[:, 5, 6] = 255  # one lit pixel, the same in every frame
    request = RewardRequest(frames, "reach", views={"side": frames.copy()})
    assert shifted(request, 0, np.random.default_rng(0)) is request
    offsets = set()
    for seed in range(20):
        moved = shifted(request, 2, np.random.default_rng(seed))
        assert moved.frames.shape == frames.shape and moved.views["side"].shape == frames.shape
        lit = [tuple(np.argwhere(frame[..., 0])[0]) for frame in [*moved.frames, *moved.views["side"]]]
        assert len(set(lit)) == 1  # one offset for the clip
        offsets.add((lit[0][0] - 5, lit[0][1] - 6))
    assert offsets <= {(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)} and len(offsets) > 5
    dataset = small_episodes(tmp_path / "eps", num_episodes=3, num_frames=6)
    plain = Augment(mismatch=0, reverse=0, rewind=0, stall=0)
    unshifted = ProgressBatches(dataset, 4, plain, 0).batch(0)
    batch = ProgressBatches(dataset, 4, Augment(mismatch=0, reverse=0, rewind=0, stall=0, shift=3), 0).batch(0)
    torch.testing.assert_close(batch.labels, unshifted.labels)  # labels do not move with the scene
    assert any((a.frames != b.frames).any() for a, b in zip(batch.requests, unshifted.requests))


# ----------------------------------------------------------------------------- 11: no rich/tqdm in library code


def test_library_code_does_not_print_or_draw_progress_bars():
    import vlm_rewards

    root = os.path.dirname(vlm_rewards.__file__)
    library = ["training/train.py", "training/batches.py", "data/build.py", "data/episodes.py"]
    library += ["evaluation/evaluate.py", "evaluation/metrics.py"]
    for relative in library:
        with open(os.path.join(root, relative)) as file:
            source = file.read()
        assert "from tqdm" not in source and "import tqdm" not in source, relative
        assert "rich.console" not in source and "console.print" not in source, relative
