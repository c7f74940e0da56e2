"""The ShapesWorld text-to-image benchmark: split, gold verifier, from-scratch base model, GRPO on it."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from vlm_rewards.config import load_job_config
from vlm_rewards.data.episodes import PairDataset
from vlm_rewards.data.synthetic import COLORS, GOALS, SHAPES
from vlm_rewards.generation import shapes_eval, shapes_t2i
from vlm_rewards.generation.config import GRPOConfig, ModelSettings, PretrainConfig
from vlm_rewards.generation.models import load_tiny_generator
from vlm_rewards.generation.pretrain import run_pretrain
from vlm_rewards.generation.sampling import sample_deterministic
from vlm_rewards.generation.shapes_eval import best_of_n, load_policy, pass_rates
from vlm_rewards.generation.shapes_t2i import ShapePrompt, Verdict, prompts, render, sample_verdicts, verify
from vlm_rewards.generation.train import build_generator, run_grpo
from vlm_rewards.interface import RewardRequest
from vlm_rewards.registry import build_reward
from vlm_rewards.testing import check_reward

CONFIGS_DIR = Path(__file__).parents[1] / "configs" / "grpo"
VERIFIER = {"kind": "function", "function": "vlm_rewards.generation.shapes_t2i:verifier_score", "value_range": [0, 1]}
REDNESS = {"kind": "function", "function": "vlm_rewards.generation.rule_rewards:redness", "value_range": [-1, 1]}
ACCURACY = {"kind": "function", "function": "vlm_rewards.generation.shapes_t2i:accuracy", "value_range": [0, 1]}
SOLID = {
    "kind": "function",
    "function": "vlm_rewards.generation.shapes_t2i:solid_verifier_score",
    "value_range": [0, 1],
}
GRADED = {
    "kind": "function",
    "function": "vlm_rewards.generation.shapes_t2i:graded_verifier_score",
    "value_range": [0, 1],
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_held_out_triples_leave_every_pair_of_attributes_in_training():
    train, held_out = prompts("train"), prompts("held_out")
    assert len(prompts()) == 90 and len(held_out) == 15 and set(train) | set(held_out) == set(prompts())
    seen = [ShapePrompt.parse(text) for text in train]
    for first, second in itertools.combinations(("color", "shape", "region"), 2):
        pairs = {(getattr(p, first), getattr(p, second)) for p in seen}
        assert len(pairs) == {"color": 6, "shape": 3, "region": 5}[first] * {"shape": 3, "region": 5}[second]


def test_held_out_pairs_are_colour_shape_pairs_never_seen_together():
    train, held_out = prompts("train", "pairs"), prompts("held_out", "pairs")
    assert len(held_out) == 15 and set(train) | set(held_out) == set(prompts())
    seen = [ShapePrompt.parse(text) for text in train]
    missing = {(p.color, p.shape) for p in map(ShapePrompt.parse, held_out)}
    assert missing == {("red", "circle"), ("blue", "square"), ("purple", "triangle")}
    assert not missing & {(p.color, p.shape) for p in seen}
    assert len({(p.color, p.region) for p in seen}) == 30 and len({(p.shape, p.region) for p in seen}) == 15
    with pytest.raises(ValueError, match="holdout 'pair': expected one of"):
        prompts("held_out", "pair")


@pytest.mark.parametrize(
    ("grpo_config", "base_config"),
    [
        ("shapes_verifier", "shapes_base"),
        ("shapes_proxy", "shapes_base"),
        ("shapes_verifier_pairs", "shapes_base_pairs"),
    ],
)
def test_shipped_grpo_configs_train_on_their_base_models_held_out_prompts(grpo_config, base_config):
    grpo = load_job_config(GRPOConfig, CONFIGS_DIR / f"{grpo_config}.yaml")
    base = load_job_config(PretrainConfig, CONFIGS_DIR / f"{base_config}.yaml")
    assert Path(grpo.model.trained_tiny) == base.output_dir / "model"
    assert grpo.train.prompts == grpo.train.eval_prompts == prompts("held_out", base.holdout)


@pytest.mark.parametrize("size", [32, 64])
def test_verifier_passes_every_ground_truth_render(size):
    rng = np.random.default_rng(0)
    for prompt in prompts():
        verdict = verify(render(prompt, rng, size), prompt)
        assert verdict.correct and verdict.score == pytest.approx(1.0), (prompt, verdict)


def test_fill_is_high_on_ground_truth_and_flags_striped_objects_the_checks_pass():
    rng = np.random.default_rng(0)
    truth = [verify(render(prompt, rng), prompt) for prompt in prompts()]
    assert min(v.fill for v in truth) >= shapes_t2i.SOLID_FILL and np.mean([v.fill for v in truth]) >= 0.95
    assert all(v.solid_score == v.score == pytest.approx(1.0) for v in truth)
    striped = []
    for prompt in prompts():  # every third row of the object blanked: the stripes GRPO drew into red circles
        image = render(prompt, rng)
        on_object = (image.max(axis=-1).astype(int) - image.min(axis=-1)) >= shapes_t2i.SATURATION
        image[on_object & (np.arange(image.shape[0]) % 3 == 0)[:, None]] = image[0, 0].copy()
        striped.append(verify(image, prompt))
    assert np.mean([v.correct for v in striped]) >= 0.75  # the checks' blind spot
    assert max(v.fill for v in striped) < 0.8 and np.mean([v.fill for v in striped]) < 0.7
    assert all(v.solid_score < v.score for v in striped if v.score > 0)  # the solid reward pays less for them


@pytest.mark.parametrize("attribute", ["color", "region", "shape"])
def test_verifier_fails_renders_of_the_wrong_colour_position_or_shape(attribute):
    rng = np.random.default_rng(1)
    options = {"color": COLORS, "region": GOALS, "shape": SHAPES}[attribute]
    for prompt in prompts()[::7]:
        asked = ShapePrompt.parse(prompt)
        for value in options:
            if value == getattr(asked, attribute):
                continue
            shown = ShapePrompt(**{**vars(asked), attribute: value})
            verdict = verify(render(shown.text, rng), prompt)
            assert not verdict.correct, (prompt, shown.text, verdict)
            # a wrong shape keeps half the soft score: the right colour in the right place is worth something
            assert verdict.score == (0.5 if attribute == "shape" else 0.0), (prompt, shown.text, verdict)
            if attribute == "shape":  # only the shape check fails (a wrong colour or region fails several)
                assert [name for name, passed in verdict.checks.items() if not passed] == ["shape"]


def test_the_graded_score_grows_with_the_shape_margin_where_the_soft_score_jumps():
    margins = np.linspace(-0.3, 0.3, 61)
    verdicts = [Verdict(area=1.0, distance=0.0, shape_margin=float(margin), clutter=0.0) for margin in margins]
    graded = np.array([verdict.graded_score for verdict in verdicts])
    assert np.all(np.diff(graded) >= 0) and graded[0] == 0.5 and graded[-1] == 1.0
    near_zero = np.abs(margins) <= shapes_t2i.SHAPE_GRADE - 1e-9
    assert np.all(np.diff(graded[near_zero]) > 0)  # every step of margin pays, not just crossing 0
    assert {verdict.score for verdict in verdicts} == {0.5, 1.0}
    placed = Verdict(area=0.25, distance=0.2, shape_margin=0.05, clutter=0.1)  # the other terms scale it as before
    assert placed.graded_score == pytest.approx(placed.score * 0.875)


def test_best_of_n_keeps_the_best_scoring_image_and_pass_rates_say_which_check_failed():
    right, wrong_shape = Verdict(1.0, 0.0, 0.2, 0.0), Verdict(1.0, 0.0, -0.2, 0.0)
    verdicts = [[wrong_shape, right, wrong_shape, wrong_shape], [right, right, right, wrong_shape]]
    assert best_of_n(verdicts, [1, 2, 4]) == {1: 0.5, 2: 0.75, 4: 1.0}
    rates = pass_rates(verdicts, ["a red circle in the center", "a blue square in the top left"])
    assert rates["all"] == {"presence": 1.0, "position": 1.0, "shape": 0.5, "clutter": 1.0, "correct": 0.5, "fill": 0.0}
    assert rates["red circle"]["shape"] == 0.25 and rates["blue square"]["correct"] == 0.75


def test_verifier_rewards_conform_to_the_interface_and_refuse_other_prompts():
    rng = np.random.default_rng(2)
    requests = [RewardRequest(render(p, rng)[None], p) for p in prompts()[:6]]
    for config in (VERIFIER, SOLID, GRADED, ACCURACY):
        reward = build_reward(config)
        check_reward(reward, requests)
        assert [result.reward for result in reward.score(requests)] == [1.0] * 6
    with pytest.raises(ValueError, match="expected 'a <colour> <shape> in the <region>'"):
        build_reward(VERIFIER).score([RewardRequest(requests[0].frames, "a red dog in the top left")])


def test_pretrained_base_saves_a_folder_that_grpo_trains(tmp_path):
    model = {"resolution": 16, "layers": 1, "heads": 2, "head_dim": 8, "text_dim": 16, "patch_size": 2}
    pretrain = PretrainConfig(
        output_dir=tmp_path / "base", model=model, steps=3, batch_size=4, warmup_steps=1, eval_num_steps=2,
        eval_images_per_prompt=1,
    )  # fmt: skip
    history = run_pretrain(pretrain)
    assert [step for step, _ in history["eval/held_out/accuracy"]] == [3]
    assert 0 <= history["eval/held_out/pass_shape"][0][1] <= 1  # which check fails is logged beside the accuracy
    folder = tmp_path / "base" / "model"
    loaded = load_tiny_generator(folder)
    assert loaded.latent_shape == (3, 16, 16) and not any(p.requires_grad for p in loaded.text_encoder.parameters())
    again = load_tiny_generator(folder)
    held_out = prompts("held_out")[:2]
    np.testing.assert_array_equal(
        sample_deterministic(loaded, held_out, 2, seed=0), sample_deterministic(again, held_out, 2, seed=0)
    )

    config = GRPOConfig.model_validate(
        {
            "output_dir": str(tmp_path / "grpo"),
            "model": {"family": "flow", "trained_tiny": str(folder)},
            "sampling": {"num_steps": 3, "eval_num_steps": 2, "window_size": 1},
            "rewards": {
                # 3 pretraining steps draw nothing the verifier passes: redness makes the groups differ
                "trained": [{"name": "verifier", "config": VERIFIER}, {"name": "redness", "config": REDNESS}],
                "gold": [{"name": "accuracy", "config": ACCURACY}],
            },
            "train": {"prompts": held_out, "eval_prompts": held_out, "eval_images_per_prompt": 2, "epochs": 1,
                      "group_size": 4, "sample_batch_size": 8, "batches_per_epoch": 1, "train_batch_size": 8},
            "eval_every": 1,
            "checkpoint_every": 1,
        }
    )  # fmt: skip
    run_grpo(config)
    metrics = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [0, 1]  # the base model is evaluated before training
    assert "eval/gold/accuracy" in metrics[0] and "gold/accuracy/mean" in metrics[1]

    # shapes_eval reloads the trained policy from the checkpoint and reproduces the run's own evaluation
    policy = load_policy(config, tmp_path / "grpo" / "checkpoints" / "epoch_000001")
    assert any(p.abs().sum() > 0 for n, p in policy.denoiser.named_parameters() if "lora_B" in n)
    verdicts = sample_verdicts(policy, held_out, images_per_prompt=2, num_steps=2, seed=config.seed)
    accuracies = best_of_n(verdicts, ns=[1, 2])
    assert set(accuracies) == {1, 2} and accuracies[1] == metrics[1]["eval/gold/accuracy"]
    rates = pass_rates(verdicts, held_out)
    pairs = {prompt.split(" in the ")[0].removeprefix("a ") for prompt in held_out}
    assert rates["all"]["correct"] == accuracies[1] and set(rates) == {"all", *pairs}

    with pytest.raises(ValueError, match="is a 'flow' model, not 'flux'"):
        flux = config.model.model_copy(update={"family": "flux"})
        run_grpo(config.model_copy(update={"model": flux, "output_dir": tmp_path / "flux"}))


def test_generated_pairs_prefer_the_image_the_verifier_scores_higher(tmp_path, monkeypatch):
    def correct_then_wrong_colour(generator, prompt_list, num_steps, seed):
        rng = np.random.default_rng(seed)
        images = []
        for index, prompt in enumerate(prompt_list):
            parsed = ShapePrompt.parse(prompt)
            other = next(color for color in COLORS if color != parsed.color)
            shown = prompt if index % 2 == 0 else prompt.replace(parsed.color, other, 1)
            images.append(render(shown, rng))
        return np.stack(images)

    monkeypatch.setattr(shapes_t2i, "sample_deterministic", correct_then_wrong_colour)
    config_path = tmp_path / "grpo.yaml"
    config_path.write_text(json.dumps({"rewards": {"trained": [{"name": "verifier", "config": VERIFIER}]}}))
    arguments = ["pairs", str(config_path), "--output", str(tmp_path / "pairs"), "--split", "held_out",
                 "--samples", "4", "--pairs-per-prompt", "3"]  # fmt: skip
    result = CliRunner().invoke(shapes_eval.app, arguments)
    assert result.exit_code == 0, result.output

    dataset = PairDataset(tmp_path / "pairs")
    # 4 images a prompt, 2 right and 2 wrong: 4 pairs with different scores, 3 kept
    assert len(dataset) == 3 * len(prompts("held_out"))
    for index in range(len(dataset)):
        pair = dataset[index]
        chosen, rejected = verify(pair.chosen[0], pair.prompt), verify(pair.rejected[0], pair.prompt)
        assert chosen.correct and not rejected.correct
        assert pair.margin == pytest.approx(chosen.score - rejected.score) and pair.margin > 0


def test_pretraining_saves_the_ema_of_its_weights_and_follows_the_cosine_schedule(tmp_path):
    def weights(generator):
        modules = (generator.denoiser, generator.text_encoder)
        return [p.detach().clone() for module in modules for p in module.parameters()]

    def pretrained(steps, **settings):
        config = PretrainConfig(
            output_dir=tmp_path / f"{steps}_{len(settings)}", steps=steps, batch_size=2, warmup_steps=1,
            eval_num_steps=1, eval_images_per_prompt=1, lr_schedule="cosine", model=model, **settings,
        )  # fmt: skip
        return run_pretrain(config), weights(load_tiny_generator(config.output_dir / "model"))

    model = {"resolution": 16, "layers": 1, "heads": 2, "head_dim": 8, "text_dim": 16, "patch_size": 2}
    initial = weights(build_generator(ModelSettings(family="flow", tiny=model)))
    _, after_one = pretrained(1)
    history, after_two = pretrained(2)
    assert [lr for _, lr in history["lr"]] == pytest.approx([0.5e-3, 0.0])  # cosine from 1e-3 to 0 over 2 steps
    ema_history, ema = pretrained(2, ema_decay=0.5)
    expected = [0.25 * w0 + 0.25 * w1 + 0.5 * w2 for w0, w1, w2 in zip(initial, after_one, after_two)]
    assert all(torch.allclose(e, x, atol=1e-6) for e, x in zip(ema, expected))
    assert not all(torch.allclose(e, w, atol=1e-6) for e, w in zip(ema, after_two))
    assert ema_history["loss"] == history["loss"]  # the average is only evaluated and saved, never trained
