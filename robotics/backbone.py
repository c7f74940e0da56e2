"""`vlmr pretrain-backbone`: the pretrained backbone of the simulated world, this world's stand-in for Qwen-VL.

Renders the Reach pools (once; cached in the run folder), mixes ShapesWorld and Reach questions, pretrains
with `vlm_rewards.training.pretrain`, and writes beside the exported `model/` its curves (curves.png) and
a model card (README.md: sha256, command, seeds, wall time, parameters, held-out accuracy).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import numpy as np

from vlm_rewards.config import dump_config, load_job_config
from vlm_rewards.data.questions import Question, QuestionSource, ShapesQuestions, mixture
from vlm_rewards.fingerprint import sha256_file
from vlm_rewards.io import atomic_folder, atomic_path
from vlm_rewards.robotics.config import BackboneConfig, ReachSource
from vlm_rewards.robotics.questions import ReachPool, ReachQuestions, build_reach_pool
from vlm_rewards.tracking import Track

logger = logging.getLogger(__name__)
EVAL_SEED_OFFSET = 1_000_000  # evaluation questions and the evaluation pool use seeds no training draw uses
TOKENIZER_QUESTIONS = 4000  # questions whose texts join the tokenizer's corpus


def run_pretrain_backbone(config: BackboneConfig, track: Track | None = None) -> Path:
    from vlm_rewards.training.pretrain import pretrain_backbone

    config.output_dir.mkdir(parents=True, exist_ok=True)
    (config.output_dir / "config.yaml").write_text(dump_config(config))
    shapes = ShapesQuestions(config.shapes.frame_size, config.shapes.num_frames, config.shapes.held_out)
    reach, folder = config.reach, config.output_dir
    train_pool = reach_pool(reach, folder / "reach_pool.npz", reach.num_episodes, config.seed, track)
    eval_seed = config.seed + EVAL_SEED_OFFSET
    eval_pool = reach_pool(reach, folder / "reach_eval_pool.npz", reach.eval_episodes, eval_seed, track)
    reach_train, reach_eval = ReachQuestions(train_pool), ReachQuestions(eval_pool)
    source = mixture([(shapes, config.shapes.weight), (reach_train, config.reach.weight)])
    eval_questions = evaluation_questions(config, shapes, reach_eval)
    texts = tokenizer_texts(source, config.seed)
    names = [*shapes.object_names, *reach_train.object_names]
    start = starting_backbone(config.init_from, track)
    model = pretrain_backbone(config.training, config.output_dir, source, eval_questions, texts, names, track, start)
    write_model_card(config, model)
    if config.ship_to is not None:
        with atomic_folder(config.ship_to, replace=True) as temporary:
            shutil.copytree(model, temporary, dirs_exist_ok=True)
        logger.info("shipped the backbone to %s", config.ship_to)
    return model


def starting_backbone(init_from: Path | None, track: Track | None) -> Path | None:
    """The model an `init_from` names: a backbone folder as it is, or the export of a stage config run first
    (a finished run only re-exports; its `ship_to` is ignored so that only the last stage ships)."""
    stage = earlier_stage(init_from)
    if stage is not None:
        return run_pretrain_backbone(stage.model_copy(update={"ship_to": None}), track)
    if init_from is not None and not (init_from / "config.json").is_file():
        raise ValueError(f"init_from: {init_from} is neither a backbone config (.yaml) nor a model folder")
    return init_from


def earlier_stage(init_from: Path | None) -> BackboneConfig | None:
    """The stage config an `init_from` names; None when it names a model folder or nothing."""
    if init_from is None or init_from.suffix not in (".yaml", ".yml"):
        return None
    return load_job_config(BackboneConfig, init_from)


def stages(config: BackboneConfig) -> list[BackboneConfig]:
    """The chain of stage configs that built `config`'s backbone, first stage first."""
    chain = [config]
    while (stage := earlier_stage(chain[0].init_from)) is not None:
        chain.insert(0, stage)
    return chain


def reach_pool(settings: ReachSource, path: Path, num_episodes: int, seed: int, track: Track | None) -> ReachPool:
    if not path.is_file():
        logger.info("rendering %d Reach episodes into %s", num_episodes, path)
        pool = build_reach_pool(settings.env, num_episodes, settings.num_frames, settings.steps_per_frame, seed, track)
        pool.save(path)
    return ReachPool.load(path)


def evaluation_questions(config: BackboneConfig, shapes: ShapesQuestions, reach: ReachQuestions) -> list[Question]:
    """Fixed questions per source from held-out seeds, and questions about the held-out colour-shape pairs."""
    rng = np.random.default_rng(config.seed + EVAL_SEED_OFFSET)
    questions = [tagged(shapes(rng), "shapes") for _ in range(config.eval_questions)]
    questions += [tagged(reach(rng), "reach") for _ in range(config.eval_questions)]
    if config.shapes.held_out:
        unseen = ShapesQuestions(config.shapes.frame_size, config.shapes.num_frames)
        questions += [tagged(q, "held_out_pair") for q in held_out_pair_questions(unseen, config, rng)]
    return questions


def held_out_pair_questions(world: ShapesQuestions, config: BackboneConfig, rng: np.random.Generator) -> list[Question]:
    """Presence and location questions that name a held-out pair, in scenes that show it (half of presence: not)."""
    held_out = {tuple(pair) for pair in config.shapes.held_out}
    questions: list[Question] = []
    while len(questions) < config.eval_questions:
        question = world.presence(rng) if rng.random() < 0.5 else world.location(rng)
        if any(f"{colour} {shape}" in question.question for colour, shape in held_out):
            questions.append(question)
    return questions


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def training_hours(config: BackboneConfig) -> float:
    """Wall time of a run's training steps, from the seconds per step its train_log.jsonl records."""
    logs = read_jsonl(config.output_dir / "train_log.jsonl")
    return sum(record["seconds"] for record in logs) * config.training.log_every / 3600


def tagged(question: Question, source: str) -> Question:
    return dataclasses.replace(question, skill=f"{source}/{question.skill}")


def tokenizer_texts(source: QuestionSource, seed: int) -> list[str]:
    """Question and answer texts of the stream, for the tokenizer's merges (drawn from their own seed)."""
    rng = np.random.default_rng([seed, EVAL_SEED_OFFSET, 1])
    return [text for q in (source(rng) for _ in range(TOKENIZER_QUESTIONS)) for text in (q.question, q.answer)]


def write_model_card(config: BackboneConfig, model: Path) -> None:
    from vlm_rewards.evaluation.plots import plot_training_curves

    weights = sorted(model.glob("*.safetensors"))
    evaluations = read_jsonl(config.output_dir / "eval.jsonl")
    logs = read_jsonl(config.output_dir / "train_log.jsonl")
    chain = stages(config)
    hours = sum(training_hours(stage) for stage in chain)
    final = evaluations[-1]
    accuracies = {key.removeprefix("accuracy_"): value for key, value in final.items() if key != "step"}
    rows = "\n".join(f"| {skill} | {value:.3f} |" for skill, value in accuracies.items())
    built_by = "\n".join(
        f"""- Stage {number}: {stage.training.optim.steps} steps of {stage.training.optim.batch_size} questions \
(training seed {stage.training.seed}, pool and evaluation seed {stage.seed}), config:

```yaml
{dump_config(stage).strip()}
```
"""
        for number, stage in enumerate(chain, start=1)
    )
    card = f"""# vlm-rewards simulated-world backbone

A {config.training.model.family} model (random weights of this shape, then pretrained here on CPU): the
stand-in for a pretrained Qwen-VL in the simulated world. Load this folder like a hub checkpoint
(`vlm_rewards.models.backbones.load_backbone(folder)`, or `from_pretrained`), or name it as `model.backbone`
of `vlmr train-rm`.

Built by one command, `vlmr pretrain-backbone CONFIG`, which runs each stage in turn (a stage continues the
one before it with a fresh optimizer, schedule and question seed):

{built_by}
- Corpus: ShapesWorld questions without the pairs {config.shapes.held_out}, and {config.reach.num_episodes}
  rendered Reach episodes. Push and Carry (a block into a zone) are never shown.
- Wall time of the training steps, all stages: {hours:.2f} h on the machine of the run (each stage's
  train_log.jsonl)
- Weights: {", ".join(f"{path.name} sha256 {sha256_file(path)}" for path in weights)}

Whole-answer accuracy on held-out questions at the end (step {final["step"]} of the last stage; greedy
answers; eval.jsonl). Chance is about 0.5 for the two-answer skills presence, closer and order (a constant
answer scores its answer's share), about 0.11 for location (nine cells) and 0 for captions (a whole sentence):

| skill | accuracy |
| --- | --- |
{rows}

Scene readout loss (binary cross-entropy per image token, summed over the names; the head
is not exported): {logs[0]["readout_loss"]:.2f} at step {logs[0]["step"]}, {logs[-1]["readout_loss"]:.2f} at step
{logs[-1]["step"]} (train_log.jsonl).
"""
    with atomic_path(model / "README.md") as temporary:
        temporary.write_text(card)
    history = chained_evaluations(chain)
    curves = {key: [(e["step"], e[key]) for e in history if key in e] for key in final if key != "step"}
    plot_training_curves(config.output_dir / "curves.png", curves)


def chained_evaluations(chain: list[BackboneConfig]) -> list[dict]:
    """Every stage's eval.jsonl records in order, their steps counted from the first stage's start."""
    records, offset = [], 0
    for stage in chain:
        records += [{**e, "step": offset + e["step"]} for e in read_jsonl(stage.output_dir / "eval.jsonl")]
        offset += stage.training.optim.steps
    return records
