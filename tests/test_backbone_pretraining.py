"""`vlmr pretrain-backbone`: questions with right answers, a resumable run, and a folder that loads like a hub model."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from vlm_rewards.cli import app
from vlm_rewards.data.questions import SKILLS, Question, ShapesQuestions, mixture, region_name
from vlm_rewards.models.backbones import load_backbone
from vlm_rewards.training.pretrain import SceneReadout

TINY_RUN = [
    "training.optim.steps=4", "training.optim.batch_size=2", "training.optim.warmup_steps=1", "training.eval_every=2",
    "training.save_every=2", "training.log_every=2", "training.model.hidden_size=64", "training.model.num_heads=2",
    "training.model.num_kv_heads=1", "training.model.num_layers=1", "training.model.vision_depth=1",
    "training.model.vision_hidden=32", "reach.num_episodes=3", "reach.eval_episodes=2", "reach.num_frames=4",
    "eval_questions=4",
]  # fmt: skip


def test_region_names_follow_the_picture():
    assert region_name(0.1, 0.1) == "top left"
    assert region_name(0.5, 0.1) == "top"
    assert region_name(0.5, 0.5) == "center"
    assert region_name(0.9, 0.5) == "right"
    assert region_name(0.1, 0.95) == "bottom left"


def test_shapes_questions_answer_what_the_scene_shows_and_never_show_a_held_out_pair():
    questions = ShapesQuestions(held_out=[("green", "triangle")])
    rng = np.random.default_rng(0)
    for _ in range(40):
        frames, objects, positions = questions.scene(rng)
        assert ("green", "triangle") not in {(obj.color, obj.shape) for obj in objects}
        assert frames.shape == (1, 56, 56, 3)
    drawn = [questions(rng) for _ in range(200)]
    assert {q.skill for q in drawn} == set(SKILLS)
    assert {q.answer for q in drawn if q.skill == "presence"} == {"yes", "no"}
    assert {q.answer for q in drawn if q.skill == "order"} == {"first", "second"}
    assert all(len(q.frames) == 2 for q in drawn if q.skill in ("closer", "order"))
    assert not any("green triangle" in q.question for q in drawn)


def test_a_location_answer_names_the_objects_region():
    questions = ShapesQuestions()
    rng = np.random.default_rng(1)
    question = questions.location(rng)
    colour, shape = question.question.removeprefix("Where is the ").removesuffix("?").split()
    rng = np.random.default_rng(1)
    frames, objects, positions = questions.scene(rng)
    index = [(obj.color, obj.shape) for obj in objects].index((colour, shape))
    assert question.answer == region_name(*positions[index])


def test_each_frame_carries_its_objects_and_a_held_out_pair_never_shows():
    questions = ShapesQuestions(held_out=[("green", "triangle")])
    assert "green triangle" not in questions.object_names
    rng = np.random.default_rng(2)
    for _ in range(100):
        question = questions(rng)
        assert len(question.objects) == len(question.frames)
        assert all(name in questions.object_names for objects in question.objects for name, _, _ in objects)
        if question.skill == "location":
            named = question.question.removeprefix("Where is the ").removesuffix("?")
            ((x, y),) = [(x, y) for name, x, y in question.objects[0] if name == named]
            assert region_name(x, y) == question.answer


def test_the_scene_readout_marks_the_token_whose_patch_holds_each_object():
    readout = SceneReadout(8, ["red circle", "blue square", "gripper"])
    frames = np.zeros((2, 56, 56, 3), np.uint8)
    objects = ((("red circle", 0.1, 0.9), ("gripper", 0.6, 0.2)), (("blue square", 0.9, 0.9),))
    grids = torch.tensor([[1, 4, 4], [1, 4, 4]])  # 2 x 2 merged tokens per frame, in reading order
    presence, offsets = readout.targets([Question(frames, "q", "a", "order", objects)], grids)
    assert presence.tolist() == [[0, 0, 0], [0, 0, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 1, 0]]
    # where in its token's patch each thing is, in patch widths from the patch's top-left corner
    assert offsets[1, 2].tolist() == pytest.approx([0.2, 0.4])
    assert offsets[2, 0].tolist() == pytest.approx([0.2, 0.8])
    assert offsets[7, 1].tolist() == pytest.approx([0.8, 0.8])
    with pytest.raises(ValueError, match="not one of the readout's names"):
        readout.targets([Question(frames[:1], "q", "a", "presence", ((("green square", 0.5, 0.5),),))], grids[:1])
    with pytest.raises(ValueError, match="the objects of each of its frames"):
        readout.targets([Question(frames, "q", "a", "order")], grids)


def test_the_offset_loss_counts_only_the_things_shown():
    readout = SceneReadout(8, ["red circle", "gripper"])
    tokens = torch.randn(4, 8)
    presence = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    offsets = torch.rand(4, 2, 2)
    predicted = readout.offset_head(readout.norm(tokens)).unflatten(-1, (2, 2)).detach()
    exact = offsets.clone()
    exact[0, 0], exact[2, 1] = predicted[0, 0], predicted[2, 1]  # right where shown, wrong everywhere else
    _, offset_loss = readout.losses(tokens, (presence, exact))
    assert offset_loss.item() == pytest.approx(0.0, abs=1e-10)
    exact[2, 1] += torch.tensor([0.3, 0.4])
    _, offset_loss = readout.losses(tokens, (presence, exact))
    assert offset_loss.item() == pytest.approx(0.25 / 2)  # one of two shown things off by 0.5 patch widths


def test_mixture_refuses_no_weight():
    with pytest.raises(ValueError, match="positive total weight"):
        mixture([(ShapesQuestions(), 0.0)])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    output = tmp_path_factory.mktemp("backbone") / "run"
    result = CliRunner().invoke(app, ["pretrain-backbone", f"output_dir={output}", *TINY_RUN])
    assert result.exit_code == 0, result.output
    return output


def test_the_exported_backbone_loads_like_a_hub_checkpoint_and_has_a_card(run):
    model, processor = load_backbone(run / "model", with_lm_head=True)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    card = (run / "model" / "README.md").read_text()
    assert "sha256" in card and "vlmr pretrain-backbone" in card
    evaluations = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evaluations] == [2, 4]
    assert {"accuracy", "accuracy_held_out_pair/presence"} <= set(evaluations[-1])
    assert (run / "curves.png").is_file()


def test_the_shipped_backbone_loads_like_a_hub_checkpoint_and_its_card_names_its_weights():
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

    from vlm_rewards.fingerprint import sha256_file
    from vlm_rewards.resources import shipped_backbone

    folder = shipped_backbone()
    assert AutoConfig.from_pretrained(folder).model_type == "qwen2_5_vl"
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder)
    assert 3e6 < sum(p.numel() for p in model.parameters()) < 8e6  # ≤ 15 MB in bfloat16
    card = (folder / "README.md").read_text()
    assert f"model.safetensors sha256 {sha256_file(folder / 'model.safetensors')}" in card
    assert "ship_to: data/models/simworld-backbone" in card  # the card holds the config that rebuilds it


def test_train_rm_starts_from_the_shipped_backbone_by_default(tmp_path):
    from vlm_rewards.resources import shipped_backbone
    from vlm_rewards.training.config import TrainRMConfig
    from vlm_rewards.training.train import _build_model

    config = TrainRMConfig(output_dir=tmp_path)
    assert config.model.backbone == "simworld"
    shipped = load_backbone(shipped_backbone())[0].state_dict()
    model = _build_model(config)
    name = "language_model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(model.backbone.state_dict()[name].float(), shipped[name].float())


def test_a_resumed_run_continues_from_its_checkpoint_with_one_log_line_per_step(run):
    result = CliRunner().invoke(app, ["pretrain-backbone", f"output_dir={run}", *TINY_RUN, "training.optim.steps=6"])
    assert result.exit_code == 2, result.output  # the schedule's length changed: refused
    assert "optim.steps: 4 -> 6" in result.output
    (run / "eval.jsonl").write_text((run / "eval.jsonl").read_text() + json.dumps({"step": 5}) + "\n")
    result = CliRunner().invoke(app, ["pretrain-backbone", f"output_dir={run}", *TINY_RUN])
    assert result.exit_code == 0, result.output
    steps = [json.loads(line)["step"] for line in (run / "eval.jsonl").read_text().splitlines()]
    assert steps == [2, 4]  # the record past the checkpoint is dropped, and a finished run trains no more


def test_a_stage_continues_the_stage_its_init_from_names_and_only_the_last_stage_ships(tmp_path):
    import yaml

    from vlm_rewards.config import apply_overrides
    from vlm_rewards.fingerprint import sha256_file

    first, shipped = tmp_path / "stage1", tmp_path / "shipped"
    stage1_config = tmp_path / "stage1.yaml"
    stage1 = apply_overrides({"output_dir": str(first), "ship_to": str(tmp_path / "never")}, TINY_RUN)
    stage1_config.write_text(yaml.safe_dump(stage1))
    second = tmp_path / "stage2"
    overrides = [f"output_dir={second}", f"init_from={stage1_config}", f"ship_to={shipped}", *TINY_RUN]
    result = CliRunner().invoke(app, ["pretrain-backbone", *overrides, "training.seed=1", "training.optim.steps=2"])
    assert result.exit_code == 0, result.output
    assert (first / "model" / "config.json").is_file() and not (tmp_path / "never").exists()
    assert not (second / "initial").exists()  # no random start: stage 1's export is the starting point
    recorded = json.loads((second / "pretrain_settings.json").read_text())["start_weights"]
    assert recorded == {"model.safetensors": sha256_file(first / "model" / "model.safetensors")}
    card = (shipped / "README.md").read_text()
    assert "Stage 1: 4 steps" in card and "Stage 2: 2 steps" in card and f"init_from: {stage1_config}" in card
    assert load_backbone(shipped)[0].config.text_config.hidden_size == 64

    result = CliRunner().invoke(app, ["pretrain-backbone", *overrides, f"init_from={tmp_path}"])
    assert result.exit_code == 2 and "neither a backbone config" in result.output


def test_a_stage_with_finer_patches_starts_from_its_start_model_resized(tmp_path):
    from vlm_rewards.models.backbones import build_tiny_backbone

    sizes = dict(hidden_size=64, num_heads=2, num_kv_heads=1, num_layers=1, vision_depth=1, vision_hidden=32)
    start = build_tiny_backbone("qwen2_5_vl", tmp_path / "start", **sizes)
    run = tmp_path / "run"
    overrides = [f"output_dir={run}", f"init_from={start}", *TINY_RUN, "training.model.patch_size=8"]
    result = CliRunner().invoke(app, ["pretrain-backbone", *overrides, "training.optim.steps=2"])
    assert result.exit_code == 0, result.output
    assert load_backbone(run / "initial_patch8")[0].config.vision_config.patch_size == 8
    model, processor = load_backbone(run / "model")
    assert model.config.vision_config.patch_size == 8 and processor.image_processor.patch_size == 8
