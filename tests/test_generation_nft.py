"""DiffusionNFT (`vlmr nft`): its loss and r mapping by hand, the sampling-policy update, and whole tiny runs."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from tests.test_config_structure import undocumented_fields
from vlm_rewards.cli import app
from vlm_rewards.config import load_job_config
from vlm_rewards.generation.config import NFT, NFTConfig
from vlm_rewards.generation.export import run_algorithm
from vlm_rewards.generation.nft import adaptive_x0_error, nft_loss, old_policy_decay, optimality_probability, run_nft

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CONFIGS_DIR = Path(__file__).parents[1] / "configs" / "nft"
CONFIGS = sorted(CONFIGS_DIR.glob("*.yaml"))
BRIGHTNESS = {"kind": "function", "function": "vlm_rewards.generation.rule_rewards:brightness", "value_range": [0, 1]}


def nft_config(tmp_path, **sections) -> NFTConfig:
    data = {
        "output_dir": str(tmp_path),
        "rewards": {"trained": [{"name": "brightness", "config": BRIGHTNESS}]},
        "sampling": {"num_steps": 4, "eval_num_steps": 4, "noise_level": 0.0},
        "train": {"prompts": ["a red circle", "a blue square"], "eval_prompts": ["a red circle", "a blue square"],
                  "eval_images_per_prompt": 4, "group_size": 4, "sample_batch_size": 8, "batches_per_epoch": 2,
                  "train_batch_size": 8, "epochs": 1, "lr": 1e-2},
        "eval_every": 1,
        "checkpoint_every": 1,
    }  # fmt: skip
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values} if isinstance(values, dict) else values
    return NFTConfig.model_validate(data)


def test_nft_loss_and_its_gradient_match_a_hand_computation():
    """One-element latents, so each ℓ is |x̂0 − x0|. β = 0.5.
    Sample 0 (x0 0, x_σ 1, σ 0.5, v 2, v_old 1, r 0.75): v+ = 1.5 -> x̂0 0.25; v− = 0.5 -> x̂0 0.75;
    (0.75·0.25 + 0.25·0.75) / 0.5 = 0.75. Sample 1 (x0 1, x_σ 0.5, σ 1, v −1, v_old 0, r 0): v− = 0.5 -> x̂0 0,
    error −1: (0 + 1·1) / 0.5 = 2. Loss (0.75 + 2) / 2 = 1.375.
    d/dv: sample 0, 1.5·(2·0.25·(−0.25)/0.25) + 0.5·(2·0.75·0.25/0.75) = −0.5; sample 1, 2·(2·(−1)·0.5/1) = −2;
    halved by the batch mean: −0.25 and −1."""

    def column(*values):
        return torch.tensor(values).reshape(-1, 1, 1, 1)

    velocity = column(2.0, -1.0).requires_grad_(True)
    old_velocity = column(1.0, 0.0).requires_grad_(True)
    loss = nft_loss(velocity, old_velocity, column(1.0, 0.5), column(0.0, 1.0), column(0.5, 1.0),
                    torch.tensor([0.75, 0.0]), beta=0.5)  # fmt: skip
    assert loss.item() == pytest.approx(1.375)
    loss.backward()
    assert velocity.grad.flatten().tolist() == pytest.approx([-0.25, -1.0])
    assert old_velocity.grad is None  # the old policy is a fixed target


def test_adaptive_weight_is_the_mean_absolute_error_of_the_whole_sample():
    prediction = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    # mean((1, 9)) / mean((1, 3)) = 2.5; an exact prediction is 0 (the weight's floor keeps it finite)
    assert adaptive_x0_error(prediction, torch.zeros(2, 2)).tolist() == [2.5, 0.0]


def test_optimality_probability_maps_clipped_advantages_to_0_1():
    advantages = np.array([-10.0, -5.0, -2.5, 0.0, 2.5, 5.0, 10.0])
    np.testing.assert_allclose(optimality_probability(advantages, 5.0), [0, 0, 0.25, 0.5, 0.75, 1, 1])
    assert optimality_probability(np.array([1.0]), 2.0).tolist() == [0.75]  # the clip sets the scale too


def test_sampling_policy_decay_waits_grows_and_saturates():
    settings = NFT(old_decay_rate=0.1, old_decay_max=0.25, old_decay_delay=2)
    decays = [old_policy_decay(settings, steps) for steps in (0, 1, 2, 3, 4, 10)]
    assert decays == pytest.approx([0, 0, 0, 0.1, 0.2, 0.25])


def test_an_nft_epoch_trains_the_lora_logs_and_resumes_exactly(tmp_path):
    nft = {"old_decay_rate": 0.2}  # a sampling policy well behind the trained one: resuming must restore it
    straight = run_nft(nft_config(tmp_path / "straight", train={"epochs": 2}, nft=nft))
    run_nft(nft_config(tmp_path / "resumed", nft=nft))
    resumed = run_nft(nft_config(tmp_path / "resumed", train={"epochs": 2}, nft=nft))

    assert [epoch for epoch, _ in resumed["train/nft_loss"]] == [1, 2]  # epoch 1 restored, not rerun
    for name in ("train/nft_loss", "train/old_deviation", "reward/brightness/mean", "eval/reward/brightness"):
        assert resumed[name] == straight[name], name
    # 16 images in minibatches of 8: one optimizer step per minibatch (its 3 noise levels accumulated)
    assert [decay for _, decay in straight["nft/old_decay"]] == pytest.approx([0.4, 0.5])
    assert straight["train/old_deviation"][1][1] > 0  # epoch 2 trains away from a sampling policy behind it
    rows = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [0, 1, 2] and "train/nft_loss" in rows[2]
    checkpoint = tmp_path / "straight" / "checkpoints" / "epoch_000002"
    lora_b = [value for name, value in load_file(checkpoint / "model.safetensors").items() if "lora_B" in name]
    assert lora_b and any(value.abs().sum() > 0 for value in lora_b)  # peft initialises lora_B to zero
    assert (checkpoint / "custom_checkpoint_0.pkl").is_file()  # the sampling policy
    assert run_algorithm(tmp_path / "straight") == "nft"


@pytest.mark.parametrize(
    ("model", "sampling"),
    [({"family": "flux"}, {"noise_level": 0.0}), ({"family": "flow"}, {"noise_level": 0.7, "window_size": 2})],
    ids=["flux-ode", "flow-sde-window"],
)
def test_nft_trains_flux_and_with_a_stochastic_sampler(tmp_path, model, sampling):
    history = run_nft(nft_config(tmp_path, model=model, sampling=sampling, eval_every=0, nft={"kl_beta": 0.1}))
    assert np.isfinite(history["train/nft_loss"][0][1]) and history["train/kl_reference"][0][1] > 0


def test_nft_raises_the_brightness_it_is_rewarded_for(tmp_path):
    train = {"epochs": 4, "group_size": 8, "sample_batch_size": 16, "train_batch_size": 16, "inner_epochs": 2}
    history = run_nft(nft_config(tmp_path, train=train, nft={"beta": 0.1}, eval_every=4, checkpoint_every=0))
    evaluated = dict(history["eval/reward/brightness"])
    assert evaluated[4] > evaluated[0] + 0.04, evaluated  # seed 0: 0.521 -> 0.592
    sampled = [value for _, value in history["reward/brightness/mean"]]
    assert sampled[-1] > sampled[0] + 0.02, sampled  # the sampling policy follows


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"model": {"family": "ddim"}}, "model.family 'ddim' is an ε-prediction UNet"),
        ({"sampling": {"guidance_scale": 4.5}}, "CFG-free"),
        ({"train": {"kl_beta": 0.01}}, "use nft.kl_beta"),
        ({"sampling": {"same_noise_in_group": True}}, "same_noise_in_group: false"),
        ({"nft": {"timesteps_per_sample": 5}}, "at most sampling.num_steps 4"),
        ({"nft": {"beta": 0}}, "greater than 0"),
    ],
)
def test_nft_refuses_what_it_cannot_train(tmp_path, sections, message):
    with pytest.raises(ValueError, match=message):
        nft_config(tmp_path, **sections)


@pytest.mark.parametrize("path", CONFIGS, ids=[path.stem for path in CONFIGS])
def test_shipped_nft_configs_validate(path):
    assert load_job_config(NFTConfig, path).sampling.guidance_scale == 1


def test_every_nft_setting_is_documented():
    assert undocumented_fields(NFTConfig) == []


def test_vlmr_nft_runs_the_tiny_config(tmp_path):
    quick = ["train.epochs=1", "train.batches_per_epoch=1", "sampling.num_steps=3", "eval_every=1"]
    result = CliRunner().invoke(app, ["nft", str(CONFIGS_DIR / "tiny_flow.yaml"), f"output_dir={tmp_path}", *quick])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in rows] == [0, 1] and "train/nft_loss" in rows[1]
    assert (tmp_path / "export" / "lora" / "adapter_model.safetensors").is_file()
    # a checkpoint exports later as a GRPO run's does (its config.json has the nft section GRPO's lacks)
    result = CliRunner().invoke(app, ["export-generator", str(tmp_path), "--output", str(tmp_path / "later")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "later" / "lora" / "adapter_model.safetensors").is_file()
