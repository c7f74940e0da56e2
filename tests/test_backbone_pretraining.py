"""`vlmr pretrain-backbone`: questions with right answers, a resumable run, and a folder that loads like a hub model."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from vlm_rewards.cli import app
from vlm_rewards.data.questions import SKILLS, ShapesQuestions, mixture, region_name
from vlm_rewards.models.backbones import load_backbone

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


def test_a_resumed_run_continues_from_its_checkpoint_with_one_log_line_per_step(run):
    result = CliRunner().invoke(app, ["pretrain-backbone", f"output_dir={run}", *TINY_RUN, "training.optim.steps=6"])
    assert result.exit_code == 2, result.output  # the schedule's length changed: refused
    assert "optim.steps: 4 -> 6" in result.output
    (run / "eval.jsonl").write_text((run / "eval.jsonl").read_text() + json.dumps({"step": 5}) + "\n")
    result = CliRunner().invoke(app, ["pretrain-backbone", f"output_dir={run}", *TINY_RUN])
    assert result.exit_code == 0, result.output
    steps = [json.loads(line)["step"] for line in (run / "eval.jsonl").read_text().splitlines()]
    assert steps == [2, 4]  # the record past the checkpoint is dropped, and a finished run trains no more
