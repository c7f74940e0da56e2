"""The trainer end to end on tiny random models: ratio 1, windows, overlap, checkpoints, bad input."""

import asyncio
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file

from vlm_rewards.generation import sampling
from vlm_rewards.generation.config import GRPOConfig, SamplerSettings
from vlm_rewards.generation.diagnostics import epoch_gradient, gradient_agreement
from vlm_rewards.generation.grpo import Advantages
from vlm_rewards.generation.models import build_tiny_generator, check_generator, predict
from vlm_rewards.generation.rewards import RewardSet, collect_rollouts
from vlm_rewards.generation.sampling import Rollout, sample_rollout
from vlm_rewards.generation.shapes_eval import load_policy
from vlm_rewards.generation.train import (
    GradientAgreement,
    add_lora,
    build_generator,
    build_rewards,
    evaluate,
    lora_parameters,
    negative_embeddings,
    run_grpo,
    step_loss,
    update_policy,
)
from vlm_rewards.interface import BaseReward, RewardResult, RewardSpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")


REDNESS = {"kind": "function", "function": "vlm_rewards.generation.rule_rewards:redness", "value_range": [-1, 1]}


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


@pytest.mark.parametrize(
    ("model", "sampling"),
    [
        ({"family": "flow"}, {"num_steps": 4}),
        ({"family": "flow"}, {"num_steps": 4, "method": "cps", "guidance_scale": 3.0}),
        ({"family": "flux"}, {"num_steps": 4}),
        ({"family": "flux", "tiny": {"guidance_embeds": True}}, {"num_steps": 4, "guidance_scale": 3.0}),
        ({"family": "ddim"}, {"num_steps": 4, "noise_level": 1.0}),
    ],
    ids=["flow", "flow-cps-cfg", "flux", "flux-guidance-embeds-cfg", "ddim"],
)
def test_importance_ratio_is_one_on_the_first_update(tmp_path, model, sampling):
    config = tiny_config(tmp_path, model=model, sampling=sampling)
    generator = build_generator(config.model)
    generator.denoiser = add_lora(generator.denoiser, config.model).eval()
    prompts = ["a red circle"] * 4 + ["a blue square"] * 4
    negative = negative_embeddings(generator, len(prompts), config)
    accelerator = Accelerator(cpu=True)
    advantages = torch.linspace(-1, 1, len(prompts))
    rollout = sample_rollout(generator, prompts, config.sampling, seed=0, negative=negative)
    _, logs = step_loss(accelerator, generator, generator.denoiser, rollout, 0, advantages, config)
    assert logs["kl_reference"] == 0  # peft's LoRA starts as the identity: policy == reference

    with torch.no_grad():  # a policy away from the reference, as after some training
        for name, parameter in generator.denoiser.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    rollout = sample_rollout(generator, prompts, config.sampling, seed=0, negative=negative)
    for k in range(rollout.latents.shape[1]):
        _, logs = step_loss(accelerator, generator, generator.denoiser, rollout, k, advantages, config)
        assert logs["ratio_max_deviation"] < 1e-6 and logs["clip_frac_high"] == logs["clip_frac_low"] == 0
        assert logs["kl_reference"] > 0
        # another batch composition changes the kernels' summation order: round-off only
        subset = rollout.select([5, 2, 7])
        _, logs = step_loss(accelerator, generator, generator.denoiser, subset, k, advantages[:3], config)
        assert logs["ratio_max_deviation"] < 1e-4  # 1.3e-5 seen on one CPU; a wrong log-prob is off by far more


def test_gradient_agreement_is_the_mean_cosine_of_consecutive_gradients():
    layer = torch.nn.Linear(2, 1, bias=False)
    agreement = GradientAgreement()
    assert agreement.logs() == {}
    for gradient in ([1.0, 0.0], [2.0, 0.0], [0.0, 3.0]):  # cosines 1, then 0
        layer.weight.grad = torch.tensor([gradient])
        agreement.add(layer)
    assert agreement.logs() == {"train/gradient_cosine": pytest.approx(0.5)}


def test_sde_window_records_only_its_steps_and_same_noise_groups_share_the_prefix():
    generator = build_tiny_generator("flow")
    settings = SamplerSettings(num_steps=6, window_size=2, window_starts=(3, 4), same_noise_in_group=True)
    prompts = ["a red circle"] * 3 + ["a blue square"] * 3
    rollout = sample_rollout(generator, prompts, settings, seed=0)
    generator.scheduler.set_timesteps(6)
    assert rollout.latents.shape[:2] == (6, 2)
    torch.testing.assert_close(rollout.timesteps[0], generator.scheduler.timesteps[3:5])
    first = rollout.latents[:, 0]  # the state entering the window: ODE so far, from shared noise
    assert torch.equal(first[0], first[1]) and torch.equal(first[0], first[2]) and not torch.equal(first[0], first[3])
    assert not torch.equal(rollout.next_latents[0, 0], rollout.next_latents[1, 0])  # branched by the SDE step


@pytest.mark.parametrize("guidance_scale", [1.0, 3.0])
def test_same_noise_groups_run_the_ode_prefix_once_per_group(monkeypatch, guidance_scale):
    generator = build_tiny_generator("flow")
    settings = SamplerSettings(
        num_steps=5, window_size=1, window_starts=(3, 4), same_noise_in_group=True, guidance_scale=guidance_scale
    )
    prompts = ["a red circle"] * 3 + ["a blue square"] * 3
    negative = generator.encode_prompts([""] * len(prompts)) if guidance_scale > 1 else None
    batch_sizes = []

    def row_by_row_predict(denoiser, family, latents, timestep, prompts, negative, guidance_scale):
        # one forward per row: batch composition changes the kernels' round-off, which is not under test
        batch_sizes.append(len(latents))
        rows = [slice(i, i + 1) for i in range(len(latents))]
        negatives = [None if negative is None else negative[row] for row in rows]
        return torch.cat(
            [
                predict(denoiser, family, latents[row], timestep, prompts[row], unconditional, guidance_scale)
                for row, unconditional in zip(rows, negatives, strict=True)
            ]
        )

    monkeypatch.setattr(sampling, "predict", row_by_row_predict)
    branched = sample_rollout(generator, prompts, settings, seed=0, negative=negative)
    assert batch_sizes == [2, 2, 2, 6, 6]  # 3 prefix steps on one row per group, then the whole batch

    # the per-sample computation: every row its own group
    monkeypatch.setattr(sampling, "prompt_groups", lambda prompts: (list(range(len(prompts))),) * 2)
    per_sample = sample_rollout(generator, prompts, settings, seed=0, negative=negative)
    assert batch_sizes[5:] == [6] * 5
    for name in Rollout.STEP_FIELDS:
        assert torch.equal(getattr(branched, name), getattr(per_sample, name)), name
    np.testing.assert_array_equal(branched.images, per_sample.images)


def test_a_training_step_with_a_rule_reward_changes_the_lora_weights_and_resumes(tmp_path):
    train = {"kl_beta": 0.04, "clip_range": 0.2, "lr": 1e-2, "ema_decay": 0.5}
    history = run_grpo(tiny_config(tmp_path, train=train))
    assert history["zero_std_ratio"] == [(1, 0.0)] and not math.isnan(history["train/policy_loss"][0][1])
    assert history["train/ratio_mean"][0][1] == pytest.approx(1.0, abs=0.05)
    assert "eval/reward/redness" in history and (tmp_path / "eval" / "epoch_0001.png").is_file()
    assert -1 <= history["train/gradient_cosine"][0][1] <= 1  # two minibatches of 8: one pair to compare
    weights = load_file(tmp_path / "checkpoints" / "epoch_000001" / "model.safetensors")
    lora_b = [value for name, value in weights.items() if "lora_B" in name]
    assert lora_b and any(value.abs().sum() > 0 for value in lora_b)  # peft initialises lora_B to zero

    resumed = run_grpo(tiny_config(tmp_path, train=train | {"epochs": 2}))
    assert [epoch for epoch, _ in resumed["zero_std_ratio"]] == [1, 2]  # epoch 1 restored, not rerun


def test_cosine_learning_rate_is_set_each_epoch_and_continues_after_a_resume(tmp_path):
    train = {"epochs": 2, "lr": 1e-2, "lr_schedule": "cosine"}
    run_grpo(tiny_config(tmp_path, train=train, eval_every=0))
    resumed = run_grpo(tiny_config(tmp_path, train=train | {"epochs": 4}, eval_every=0))
    # the schedule is over the configured epochs: 2 for the first run, 4 once resumed
    cosine = [
        1e-2 * 0.5 * (1 + math.cos(math.pi * epoch / epochs)) for epoch, epochs in ((0, 2), (1, 2), (2, 4), (3, 4))
    ]
    assert [lr for _, lr in resumed["train/lr"]] == pytest.approx(cosine)


@pytest.mark.parametrize("ema_decay", [None, 0.5])
def test_keep_best_by_saves_the_weights_of_the_best_evaluation(tmp_path, ema_decay):
    train = {"epochs": 3, "lr": 3e-2, "clip_range": 0.2, "ema_decay": ema_decay}
    config = tiny_config(tmp_path, train=train, keep_best_by="redness")
    history = run_grpo(config)
    evaluations = history["eval/reward/redness"]
    assert len({value for _, value in evaluations}) > 1  # the policy moved: the choice is not trivial
    best_epoch, best_value = max(evaluations, key=lambda item: (item[1], -item[0]))  # the first of equals
    saved = json.loads((tmp_path / "best" / "best.json").read_text())
    assert (saved["epoch"], saved["value"]) == (best_epoch, best_value)
    # both folders reload as the weights their evaluation used: a checkpoint's EMA, not its raw weights
    assert reevaluate(config, tmp_path / "best") == pytest.approx(best_value, abs=1e-5)
    last_epoch, last_value = evaluations[-1]
    last_checkpoint = tmp_path / "checkpoints" / f"epoch_{last_epoch:06d}"
    assert reevaluate(config, last_checkpoint) == pytest.approx(last_value, abs=1e-5)


def reevaluate(config: GRPOConfig, folder: Path) -> float:
    """The trained reward's evaluation mean of the policy `load_policy` builds from `folder`."""
    rerun = config.model_copy(update={"output_dir": folder.parent / "re"})
    return evaluate(Accelerator(), load_policy(config, folder), build_rewards(config), rerun, 0)["eval/reward/redness"]


@pytest.mark.parametrize(("family", "noise_level"), [("ddim", 1.0), ("flux", 0.7)])
def test_unet_and_flux_paths_train(tmp_path, family, noise_level):
    config = tiny_config(tmp_path, model={"family": family}, sampling={"num_steps": 3, "noise_level": noise_level})
    generator = build_generator(config.model)
    generator.denoiser = add_lora(generator.denoiser, config.model).eval()
    prompts = ["a red circle"] * 4 + ["a blue square"] * 4
    rollout = sample_rollout(generator, prompts, config.sampling, seed=0)
    before = {n: p.clone() for n, p in generator.denoiser.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW(lora_parameters(generator.denoiser), lr=1e-2)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=config.sampling.steps_per_trajectory)
    advantages = Advantages(np.linspace(-1, 1, 8), np.ones(8, dtype=bool), 0.0)
    logs = update_policy(accelerator, generator, generator.denoiser, optimizer, rollout, advantages, config, epoch=0)
    assert np.isfinite(logs["train/policy_loss"])
    changed = [n for n, p in generator.denoiser.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed and all("lora_B" in n or "lora_A" in n for n in changed)


class SlowReward(BaseReward):
    spec = RewardSpec("slow", "1")

    def __init__(self, delay: float = 0.0, value: float = 0.0, count_offset: int = 0):
        self.delay, self.value, self.count_offset = delay, value, count_offset

    def _score(self, requests):
        time.sleep(self.delay)
        return [RewardResult(self.value, error=None if math.isfinite(self.value) else "judge failed") for _ in requests]

    async def ascore(self, requests):
        results = await super().ascore(requests)
        return results[: len(results) - self.count_offset]


def test_reward_scoring_overlaps_the_next_sampling_batch():
    """Batch b is scored while batch b+1 samples: checked on event times, which a loaded machine cannot fail."""
    delay = 0.3
    scoring, sampling = [], []  # (start, end) of each batch's scoring and sampling

    class RecordingReward(SlowReward):
        def _score(self, requests):
            start = time.perf_counter()
            results = super()._score(requests)
            scoring.append((start, time.perf_counter()))
            return results

    rewards = RewardSet({"slow": RecordingReward(delay=delay)}, {"slow": 1.0})
    generator = build_tiny_generator("flow")

    def sample_batch(batch):
        start = time.perf_counter()
        time.sleep(delay)  # stands in for generation
        rollout = sample_rollout(generator, ["a red circle"] * 2, SamplerSettings(num_steps=2), seed=batch)
        sampling.append((start, time.perf_counter()))
        return rollout

    rollout, scores, timings = asyncio.run(collect_rollouts(sample_batch, 3, rewards))
    assert len(rollout) == 6 and scores.trained["slow"].shape == (6,)
    for b in range(2):  # the two intervals intersect
        assert scoring[b][0] < sampling[b + 1][1] and sampling[b + 1][0] < scoring[b][1], (scoring, sampling)
    assert timings["time/reward_wait_s"] < 2 * delay  # only the last batch's scoring is left to wait for


def test_bad_rewards_fail_with_errors_naming_the_reward():
    images = np.zeros((2, 8, 8, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"reward 'judge' gave nan for image 0 .*judge failed"):
        asyncio.run(RewardSet({"judge": SlowReward(value=float("nan"))}, {"judge": 1.0}).ascore(images, ["a", "b"]))
    with pytest.raises(ValueError, match="reward 'short' returned 1 results for 2 images"):
        asyncio.run(RewardSet({"short": SlowReward(count_offset=1)}, {"short": 1.0}).ascore(images, ["a", "b"]))
    with pytest.raises(ValueError, match="both trained and gold"):
        RewardSet.build({"r": (REDNESS, 1.0)}, {"r": REDNESS})


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"train": {"group_size": 3}}, "does not divide"),
        ({"train": {"prompts": ["a red circle", "  "]}}, "empty prompt"),
        ({"sampling": {"num_steps": 4, "window_size": 5}}, "window_size 5"),
        ({"sampling": {"num_steps": 4, "method": "cps", "window_size": 4}}, "window_size 4"),
        ({"rewards": {"trained": []}}, "at least one reward"),
        ({"keep_best_by": "accuracy"}, "keep_best_by 'accuracy'"),
        ({"keep_best_by": "redness", "eval_every": 0}, "needs eval_every > 0"),
    ],
)
def test_bad_configs_are_refused_before_any_compute(tmp_path, sections, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(tmp_path, **sections)


def test_unsupported_model_class_is_refused():
    generator = build_tiny_generator("flow")
    generator.denoiser = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="Linear is not supported for family 'flow'"):
        check_generator(generator)


def test_gradient_agreement_compares_independent_epochs_and_repeats_one_exactly(tmp_path):
    config = tiny_config(tmp_path)
    assert gradient_agreement(config, epochs=3)["images_per_gradient"] == 16
    accelerator = Accelerator()
    generator = build_generator(config.model)
    generator.denoiser = add_lora(generator.denoiser, config.model).eval()
    rewards = build_rewards(config)
    first, again, other = (
        epoch_gradient(accelerator, generator, generator.denoiser, rewards, config, epoch) for epoch in (0, 0, 1)
    )
    assert first.abs().sum() > 0 and torch.equal(first, again)  # an epoch's samples depend only on its seed
    assert not torch.equal(first, other)
