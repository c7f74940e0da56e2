"""Training hygiene of the GRPO trainer (issue #37 item 4): TensorBoard, per-step clip statistics, the eval guidance
scale, `global_std`, the default window, gradient checkpointing and a 2-process run."""

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from accelerate.launchers import debug_launcher
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import gather_object
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vlm_rewards.config import load_job_config
from vlm_rewards.generation import train as train_module
from vlm_rewards.generation.config import GRPOConfig, SamplerSettings
from vlm_rewards.generation.grpo import ClipTracker, combined_advantages, group_advantages
from vlm_rewards.generation.models import build_tiny_generator
from vlm_rewards.generation.sampling import sample_rollout
from vlm_rewards.generation.sde import step_distribution
from vlm_rewards.generation.train import (
    add_lora,
    build_generator,
    build_rewards,
    enable_gradient_checkpointing,
    evaluate,
    run_grpo,
    sample_epoch,
    step_loss,
    update_policy,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REDNESS = {"kind": "function", "function": "vlm_rewards.generation.rule_rewards:redness", "value_range": [-1, 1]}
CONFIGS = Path(__file__).parent.parent / "configs" / "grpo"


def tiny_config(tmp_path, **sections) -> GRPOConfig:
    data = {
        "output_dir": str(tmp_path),
        "rewards": {"trained": [{"name": "redness", "config": REDNESS}]},
        "sampling": {"num_steps": 4},
        "train": {"epochs": 1, "batches_per_epoch": 2, "sample_batch_size": 8, "group_size": 4, "train_batch_size": 8},
        "eval_every": 1,
        "checkpoint_every": 1,
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return GRPOConfig.model_validate(data)


def perturb_lora(denoiser: torch.nn.Module) -> None:
    """A policy away from the reference (peft starts lora_B at 0), so every LoRA weight gets a gradient."""
    with torch.no_grad():
        for name, parameter in denoiser.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- TensorBoard and clip statistics


def test_tensorboard_has_the_epoch_metrics_per_optimizer_step_clipping_and_image_grids(tmp_path):
    # inner_epochs 2: the second pass runs off-policy, so a tiny clip range engages
    train = {"epochs": 2, "inner_epochs": 2, "clip_range": 1e-6, "lr": 1e-2}
    run_grpo(tiny_config(tmp_path, train=train))
    history = run_grpo(tiny_config(tmp_path, train=train | {"epochs": 3}))  # resumed after epoch 2
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "images": 0}).Reload()
    scalars = lambda tag: [(event.step, event.value) for event in events.Scalars(tag)]

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [(row["epoch"], row["train/policy_loss"]) for row in rows if "train/policy_loss" in row]
    assert [epoch for epoch, _ in logged] == [1, 2, 3]
    in_tensorboard = scalars("train/policy_loss")  # what metrics.jsonl holds, in float32
    assert [step for step, _ in in_tensorboard] == [1, 2, 3]
    assert [value for _, value in in_tensorboard] == pytest.approx([value for _, value in logged], rel=1e-6)
    assert [step for step, _ in scalars("eval/reward/redness")] == [0, 1, 2, 3]

    # per optimizer step: 3 epochs x 2 passes x 2 minibatches of 8, numbered on across the resume
    per_update = scalars("optimizer_step/clip_frac")
    assert [step for step, _ in per_update] == list(range(1, 13))
    assert [step for step, _ in scalars("optimizer_step/approx_kl")] == list(range(1, 13))
    assert per_update[0][1] == 0 and max(value for _, value in per_update) > 0  # ratio 1 first, clipped later
    assert history["train/clip_frac_max"][-1][1] == pytest.approx(max(value for _, value in per_update[8:]))

    # per denoising step: the default window is every step but the last of 4
    assert {"train/clip_frac/step_00", "train/approx_kl/step_02"} <= set(history)
    assert not any(name.endswith("step_03") for name in history)

    samples, grids = events.Images("samples"), events.Images("eval")
    assert [image.step for image in samples] == [0, 1, 2]  # the rollouts of each epoch, by the policy that drew them
    assert [image.step for image in grids] == [0, 1, 2, 3]
    assert (samples[0].width, samples[0].height) == (4 * 64, 4 * 64)  # a row per group of 4, 8 px tiles x 8


def test_clip_tracker_matches_a_hand_computation_per_step_index_and_per_optimizer_step():
    clip_range = 0.1
    tracker = ClipTracker(clip_range)
    # optimizer step 1: recorded steps k=0, 1 of a minibatch of 3 samples whose windows started at steps 0, 0, 2
    tracker.add(torch.tensor([0.0, 0.2, -0.05]), torch.tensor([0, 0, 2]))
    tracker.add(torch.tensor([-0.2, 0.0, 0.0]), torch.tensor([1, 1, 3]))
    first = tracker.optimizer_step()
    # optimizer step 2: one recorded step of 2 samples, both at step 0
    tracker.add(torch.tensor([0.3, 0.0]), torch.tensor([0, 0]))
    second = tracker.optimizer_step()

    # |exp(x) - 1| > 0.1 for x = 0.2, -0.2 and 0.3 only
    assert first == pytest.approx({"clip_frac": 2 / 6, "approx_kl": 0.5 * (0.04 + 0.0025 + 0.04) / 6})
    assert second == pytest.approx({"clip_frac": 1 / 2, "approx_kl": 0.5 * 0.09 / 2})
    expected = {
        "train/clip_frac/step_00": 2 / 4,  # 0.0, 0.2, 0.3, 0.0
        "train/approx_kl/step_00": 0.5 * (0.04 + 0.09) / 4,
        "train/clip_frac/step_01": 1 / 2,
        "train/approx_kl/step_01": 0.5 * 0.04 / 2,
        "train/clip_frac/step_02": 0.0,
        "train/approx_kl/step_02": 0.5 * 0.0025,
        "train/clip_frac/step_03": 0.0,
        "train/approx_kl/step_03": 0.0,
        "train/clip_frac_max": 1 / 2,
        "train/approx_kl_max": 0.5 * 0.09 / 2,
    }
    assert tracker.logs() == pytest.approx(expected)


# ----------------------------------------------------------------------------- evaluation guidance


@pytest.mark.parametrize(
    ("sampling", "expected_scale"), [({"guidance_scale": 2.0}, 2.0), ({"eval_guidance_scale": 3.0}, 3.0)]
)
def test_evaluation_samples_with_the_eval_guidance_scale(tmp_path, monkeypatch, sampling, expected_scale):
    config = tiny_config(tmp_path, sampling=sampling)
    calls = []
    real = train_module.sample_deterministic

    def spy(generator, prompts, num_steps, seed, guidance_scale=1.0, negative=None):
        calls.append((guidance_scale, negative is not None))
        return real(generator, prompts, num_steps, seed, guidance_scale, negative)

    monkeypatch.setattr(train_module, "sample_deterministic", spy)
    logs = evaluate(Accelerator(cpu=True), build_generator(config.model), build_rewards(config), config, 0)
    assert calls == [(expected_scale, True)] and np.isfinite(logs["eval/reward/redness"])


# ----------------------------------------------------------------------------- global_std


def test_group_and_global_std_advantages_match_a_hand_computation():
    groups = ["a", "a", "b", "b", "b", "b", "c", "c"]
    rewards = np.array([1.0, 3.0, 0.0, 0.0, 4.0, 4.0, 2.0, 2.0])  # group means 2, 2, 2; stds 1, 2, 0
    epsilon = 1e-4
    per_group = group_advantages(rewards, groups, epsilon)
    expected = [-1 / (1 + epsilon), 1 / (1 + epsilon), *[v / (2 + epsilon) for v in (-2, -2, 2, 2)], 0, 0]
    np.testing.assert_allclose(per_group.values, expected, rtol=1e-12)
    # the whole batch: mean 2, variance (1 + 1 + 4 * 4) / 8 = 2.25, std 1.5
    whole = combined_advantages({"r": rewards}, {"r": 1.0}, groups, epsilon=epsilon, global_std=True)
    expected = [v / (1.5 + epsilon) for v in (-1, 1, -2, -2, 2, 2)] + [0, 0]
    np.testing.assert_allclose(whole.values, expected, rtol=1e-12)
    for advantages in (per_group, whole):  # the flat group carries no signal either way
        assert advantages.keep.tolist() == [True] * 6 + [False] * 2 and advantages.zero_std_ratio == 0.25


def test_the_trainer_passes_global_std_to_the_advantages(tmp_path):
    advantages = {}
    for global_std in (False, True):
        config = tiny_config(tmp_path, train={"global_std": global_std})
        generator = build_generator(config.model)
        rollout, advantages[global_std], _ = sample_epoch(
            Accelerator(cpu=True), generator, generator.denoiser, build_rewards(config), config, epoch=0
        )
    rewards = asyncio.run(build_rewards(config).ascore(rollout.images, rollout.prompts)).trained["redness"]
    for global_std, computed in advantages.items():
        expected = group_advantages(rewards, rollout.prompts, global_std=global_std)
        np.testing.assert_allclose(computed.values, expected.values, rtol=1e-10)
    assert not np.allclose(advantages[False].values, advantages[True].values)


# ----------------------------------------------------------------------------- the default window


@pytest.mark.parametrize(("family", "noise_level", "last_std"), [("flow", 0.7, 7e-4), ("ddim", 1.0, 7.4e-3)])
def test_the_last_step_has_almost_no_noise(family, noise_level, last_std):
    generator = build_tiny_generator(family)
    generator.scheduler.set_timesteps(10)
    sample = torch.zeros(1, *generator.latent_shape)
    stds = [
        step_distribution(generator.scheduler, sample, timestep, sample, noise_level).std.max().item()
        for timestep in generator.scheduler.timesteps
    ]
    assert stds[-1] == pytest.approx(last_std, rel=0.05) and min(stds[:-1]) > 2 * last_std


def test_the_default_window_is_every_step_but_the_last():
    for method in ("sde", "cps"):
        settings = SamplerSettings(num_steps=10, method=method)
        assert settings.stochastic_steps(np.random.default_rng(0)) == range(9)
        assert settings.steps_per_trajectory == 9
    rollout = sample_rollout(build_tiny_generator("flow"), ["a red circle"] * 2, SamplerSettings(num_steps=4), seed=0)
    assert rollout.step_indices.tolist() == [[0, 1, 2]] * 2
    for bad in ({"num_steps": 1}, {"num_steps": 4, "window_starts": (0, 2)}):
        with pytest.raises(ValueError, match="window_size null"):
            SamplerSettings(**bad).stochastic_steps()


@pytest.mark.parametrize(
    "name",
    [
        "tiny_flow",
        "tiny_flux",
        "tiny_ddim",
        "shapes_proxy",
        "shapes_verifier",
        "shapes_verifier_pairs",
        "shapes_prompt_files",
    ],
)
def test_no_shipped_config_trains_the_last_step(name):
    sampling = load_job_config(GRPOConfig, CONFIGS / f"{name}.yaml", []).sampling
    windows = [sampling.stochastic_steps(np.random.default_rng(seed)) for seed in range(50)]  # every start, surely
    assert max(window[-1] for window in windows) < sampling.num_steps - 1


# ----------------------------------------------------------------------------- gradient checkpointing


@pytest.mark.parametrize("family", ["flow", "flux", "ddim"])
def test_gradient_checkpointing_gives_the_same_gradients(tmp_path, family):
    noise_level = 1.0 if family == "ddim" else 0.7
    config = tiny_config(tmp_path, model={"family": family}, sampling={"num_steps": 3, "noise_level": noise_level})
    generator = build_generator(config.model)
    generator.denoiser = add_lora(generator.denoiser, config.model).eval()
    perturb_lora(generator.denoiser)
    rollout = sample_rollout(generator, ["a red circle"] * 2 + ["a blue square"] * 2, config.sampling, seed=0)
    advantages = torch.linspace(-1, 1, 4)
    base = generator.denoiser.get_base_model()
    forwards = [0]
    for module in base.modules():
        module.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))

    def gradients() -> dict[str, torch.Tensor]:
        generator.denoiser.zero_grad()
        loss, _ = step_loss(Accelerator(cpu=True), generator, generator.denoiser, rollout, 0, advantages, config)
        loss.backward()
        return {n: p.grad.clone() for n, p in generator.denoiser.named_parameters() if p.requires_grad}

    plain, plain_forwards = gradients(), forwards[0]
    enable_gradient_checkpointing(base)
    forwards[0] = 0
    checkpointed = gradients()
    assert forwards[0] > plain_forwards  # the blocks ran again in the backward pass
    # all but the context query of SD3's last block (its context output is dropped) get a gradient
    assert plain.keys() == checkpointed.keys() and sum(plain[n].abs().sum() > 0 for n in plain) >= len(plain) - 2
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-5, atol=1e-8, msg=name)


def test_gradient_checkpointing_refuses_a_model_without_it():
    with pytest.raises(ValueError, match="Linear does not support it"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


# ----------------------------------------------------------------------------- two processes


def two_process_config(output_dir: Path, global_std: bool, batch: int) -> GRPOConfig:
    return tiny_config(
        output_dir,
        sampling={"num_steps": 3},
        train={"sample_batch_size": batch, "train_batch_size": batch, "global_std": global_std, "kl_beta": 0.1},
    )


def update_on_shard(output_dir: Path, global_std: bool, rank: int, world: int) -> dict:
    """One GRPO update on rows rank::world of a fixed batch of 16 (every prompt group split over the processes):
    the shard's advantages, its mean policy loss and the updated LoRA weights."""
    config = two_process_config(output_dir, global_std, batch=16 // world)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=config.sampling.steps_per_trajectory)
    torch.manual_seed(0)  # LoRA's initial weights
    generator = build_generator(config.model)
    generator.denoiser = add_lora(generator.denoiser, config.model).eval()
    perturb_lora(generator.denoiser)
    before = {n: p.detach().clone() for n, p in generator.denoiser.named_parameters() if p.requires_grad}
    prompts = [
        prompt for prompt in ("a red circle", "a blue square", "a green triangle", "a yellow star") for _ in "1234"
    ]
    rollout = sample_rollout(generator, prompts, config.sampling, seed=0)
    rewards = np.random.default_rng(0).normal(size=16)
    rows = np.arange(rank, 16, world)
    shard = rollout.select(rows)
    gather = gather_object if world > 1 else None
    advantages = combined_advantages(
        {"r": rewards[rows]}, {"r": 1.0}, shard.prompts, gather=gather, global_std=global_std
    )
    optimizer = torch.optim.SGD([p for p in generator.denoiser.parameters() if p.requires_grad], lr=1.0)
    denoiser, optimizer = accelerator.prepare(generator.denoiser, optimizer)
    logs = update_policy(accelerator, generator, denoiser, optimizer, shard, advantages, config, epoch=0)
    weights = {
        n: p.detach().clone() for n, p in accelerator.unwrap_model(denoiser).named_parameters() if p.requires_grad
    }
    return {
        "rows": rows,
        "advantages": advantages.values,
        "loss": logs["train/policy_loss"],
        "kl": logs["train/kl_reference"],
        "before": before,
        "weights": weights,
    }


def two_process_worker(output_dir: Path, global_std: bool) -> None:
    AcceleratorState._reset_state(reset_partial_state=True)  # forked from a process that may hold a 1-process state
    torch.set_num_threads(1)
    state = PartialState(cpu=True)
    result = update_on_shard(output_dir, global_std, state.process_index, state.num_processes)
    torch.save(result, output_dir / f"rank_{state.process_index}.pt")


@pytest.mark.parametrize("global_std", [False, True])
def test_two_cpu_processes_give_the_advantages_loss_and_update_of_one(tmp_path, global_std):
    single = update_on_shard(tmp_path, global_std, rank=0, world=1)
    debug_launcher(two_process_worker, args=(tmp_path, global_std), num_processes=2)
    shards = [torch.load(tmp_path / f"rank_{rank}.pt", weights_only=False) for rank in (0, 1)]

    advantages = np.empty(16)
    for shard in shards:
        advantages[shard["rows"]] = shard["advantages"]
    np.testing.assert_allclose(advantages, single["advantages"], rtol=1e-12)  # group statistics over both
    # equal shards: the mean of the shards' mean losses is the batch's mean loss (at ratio 1, -mean(A): 0 over whole
    # groups, not over a shard's halves of them), and so is the KL to the reference
    assert min(abs(shard["loss"]) for shard in shards) > 1e-3
    assert np.mean([shard["loss"] for shard in shards]) == pytest.approx(single["loss"], abs=1e-6)
    assert np.mean([shard["kl"] for shard in shards]) == pytest.approx(single["kl"], rel=1e-5)
    moved = [not torch.equal(value, single["before"][name]) for name, value in single["weights"].items()]
    assert sum(moved) >= len(moved) - 2  # all but SD3's unused last context query: the comparison is not trivial
    for name, value in single["weights"].items():  # DDP's averaged gradient: the same SGD step
        for shard in shards:
            torch.testing.assert_close(shard["weights"][name], value, rtol=1e-5, atol=1e-7, msg=name)
