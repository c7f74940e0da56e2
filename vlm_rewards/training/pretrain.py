"""Pretraining a small Qwen-VL backbone on questions about frames: the next-token loss on the answers.

The stand-in for a pretrained Qwen-VL in a simulated world. `pretrain_backbone` builds a random backbone
of the configured shape, with a tokenizer trained on the shipped corpus plus the question texts, and
trains every weight on a stream of `Question`s: the question, then the frames, is the user turn, and the
loss is the language model's cross-entropy on the answer and its `<|im_end|>` (the layout reward models
use too: text before frames), plus a scene readout: linear heads on each image token predict which named
things the token's patch of the frame holds and where in the patch each one is. A tower trained by the
answers alone stays blind for thousands of steps; the readout gives it a direct signal from the first
step. The heads are not exported.
Batches are drawn from an RNG seeded by (seed, step), so a resumed run sees the batches an uninterrupted
one would. The result is a checkpoint folder that loads like a hub
model: `load_backbone(folder)`, `from_pretrained(folder)`, or `model.backbone` of `vlmr train-rm`.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import get_cosine_schedule_with_warmup

from vlm_rewards.config import changed_settings
from vlm_rewards.data.questions import Question, QuestionSource
from vlm_rewards.fingerprint import sha256_file
from vlm_rewards.io import atomic_folder, atomic_path, make_readable, write_json
from vlm_rewards.models.backbones import MERGE_SIZE, build_tiny_backbone, load_backbone, resize_patches
from vlm_rewards.models.inputs import ClipInputBuilder
from vlm_rewards.models.tokenizer import IM_END, default_corpus, train_tokenizer
from vlm_rewards.tracking import Track, untracked
from vlm_rewards.training.config import BackboneTraining

logger = logging.getLogger(__name__)
CHECKPOINT_PATTERN = re.compile(r"^step_(\d+)\.pt$")
IGNORE = -100
SETTINGS_FILE = "pretrain_settings.json"
RESUME_MAY_CHANGE = ("eval_every", "save_every", "log_every", "keep_checkpoints")  # they change no weight


class SceneReadout(torch.nn.Module):
    """What each image token of the vision merger holds, read by linear heads on its normalised features:
    which named things its patch of the frame holds (a binary cross-entropy per name, summed over names,
    averaged over tokens; a thing belongs to the token whose patch holds its centre), and where in the patch
    each of them is (its offset from the patch's corner in patch widths, squared error summed over x and y,
    averaged over the things shown). Presence alone leaves positions finer than a token to chance; the offsets
    train them (`vlm_rewards.robotics.position_probe` measures how well the tokens hold them)."""

    def __init__(self, hidden_size: int, names: Sequence[str]):
        super().__init__()
        self.index = {name: i for i, name in enumerate(names)}
        self.norm = torch.nn.LayerNorm(hidden_size, elementwise_affine=False)
        self.head = torch.nn.Linear(hidden_size, len(names))
        self.offset_head = torch.nn.Linear(hidden_size, 2 * len(names))

    def targets(self, questions: Sequence[Question], image_grid_thw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Targets of every image token of `questions`, in the order they are fed: (tokens, names) multi-hot
        presence, and (tokens, names, 2) offsets in the patch (meaningful where present)."""
        frames = [objects for question in questions for objects in question.objects]
        if len(frames) != len(image_grid_thw):
            raise ValueError("every question needs the objects of each of its frames for the scene readout")
        presence, offsets = [], []
        for objects, (_, height, width) in zip(frames, (image_grid_thw // MERGE_SIZE).tolist()):
            shown = torch.zeros(height, width, len(self.index))
            offset = torch.zeros(height, width, len(self.index), 2)
            for name, x, y in objects:
                if name not in self.index:
                    raise ValueError(f"object {name!r} is not one of the readout's names {list(self.index)}")
                row, column = min(int(y * height), height - 1), min(int(x * width), width - 1)
                shown[row, column, self.index[name]] = 1
                offset[row, column, self.index[name]] = torch.tensor([x * width - column, y * height - row])
            presence.append(shown.flatten(0, 1))
            offsets.append(offset.flatten(0, 1))
        return torch.cat(presence), torch.cat(offsets)

    def losses(
        self, image_tokens: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(presence loss, offset loss) of the tokens against `targets`."""
        presence, offsets = targets
        features = self.norm(image_tokens)
        logits = self.head(features)
        presence_loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, presence, reduction="none")
        predicted = self.offset_head(features).unflatten(-1, (len(self.index), 2))
        squared = (predicted - offsets).square().sum(-1)
        offset_loss = (squared * presence).sum() / presence.sum().clamp(min=1)
        return presence_loss.sum(-1).mean(), offset_loss


class QuestionBatches:
    """Questions -> model inputs with answer labels: prompts left-padded to end together, answers after."""

    def __init__(self, processor, max_frames: int = 2):
        self.builder = ClipInputBuilder(processor, max_frames=max_frames, padding_side="left")
        self.tokenizer = processor.tokenizer

    def __call__(self, questions: Sequence[Question]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        prompts = self.builder.build([(q.question, q.frames) for q in questions], add_generation_prompt=True)
        inputs = dict(prompts.model_inputs)
        answers = [self.tokenizer(q.answer + IM_END, add_special_tokens=False).input_ids for q in questions]
        width = max(map(len, answers))
        answer_ids = torch.full((len(answers), width), self.tokenizer.pad_token_id, dtype=torch.long)
        answer_mask = torch.zeros_like(answer_ids)
        for row, ids in enumerate(answers):
            answer_ids[row, : len(ids)] = torch.tensor(ids)
            answer_mask[row, : len(ids)] = 1
        prompt_labels = torch.full_like(inputs["input_ids"], IGNORE)
        labels = torch.cat([prompt_labels, answer_ids.masked_fill(answer_mask == 0, IGNORE)], 1)
        inputs["input_ids"] = torch.cat([inputs["input_ids"], answer_ids], 1)
        inputs["attention_mask"] = torch.cat([inputs["attention_mask"], answer_mask], 1)
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(answer_ids)], 1)
        return inputs, labels


def answer_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B,) whether greedy decoding gives each whole answer: every answer token is the argmax after
    the tokens before it (teacher forcing equals greedy decoding while every earlier token is right)."""
    predicted = logits[:, :-1].argmax(-1)
    targets = labels[:, 1:]
    answered = targets != IGNORE
    return ((predicted == targets) | ~answered).all(-1)


def pretrain_backbone(
    config: BackboneTraining,
    output_dir: Path,
    source: QuestionSource,
    eval_questions: Sequence[Question],
    tokenizer_texts: Sequence[str],
    object_names: Sequence[str],
    track: Track | None = None,
    start: Path | None = None,
) -> Path:
    """Train (or resume) the backbone in `output_dir`; returns the exported model folder `output_dir/model`.

    `object_names` lists every name in the questions' `objects` (the scene readout's outputs). `start`: a
    backbone folder to continue (its weights and tokenizer); None: random weights of `config.model`."""
    output_dir.mkdir(parents=True, exist_ok=True)
    _check_settings(output_dir, config, start)
    if start:
        start = _at_patch_size(start, config.model.patch_size, output_dir)
    else:
        start = _initial_backbone(config, output_dir, tokenizer_texts)
    model, processor = load_backbone(start, with_lm_head=True, dtype=torch.float32)
    readout = SceneReadout(model.config.text_config.hidden_size, object_names)
    image_tokens: list[torch.Tensor] = []  # the vision tower's merged tokens of a training step, in frame order
    model.model.visual.register_forward_hook(
        lambda module, args, output: image_tokens.append(output.pooler_output) if module.training else None
    )
    batches = QuestionBatches(processor)
    parameters = [*model.parameters(), *readout.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=config.optim.lr, weight_decay=config.optim.weight_decay)
    scheduler = get_cosine_schedule_with_warmup(optimizer, config.optim.warmup_steps, config.optim.steps)
    done = _resume(output_dir, model, readout, optimizer, scheduler)
    log_path, eval_path = output_dir / "train_log.jsonl", output_dir / "eval.jsonl"
    for path in (log_path, eval_path):
        _truncate_log(path, done)
    model.train()
    started = time.perf_counter()
    remaining = range(done + 1, config.optim.steps + 1)
    for step in (track or untracked)(remaining, "pretrain backbone", total=len(remaining)):
        rng = np.random.default_rng([config.seed, step])
        questions = [source(rng) for _ in range(config.optim.batch_size)]
        inputs, labels = batches(questions)
        image_tokens.clear()
        answer_loss = model(**inputs, labels=labels).loss
        readout_loss, offset_loss = readout.losses(
            image_tokens[0], readout.targets(questions, inputs["image_grid_thw"])
        )
        loss = answer_loss + config.readout_weight * readout_loss + config.readout_offset_weight * offset_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, config.optim.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step % config.log_every == 0:
            seconds = (time.perf_counter() - started) / config.log_every
            started = time.perf_counter()
            record = {
                "loss": answer_loss.item(),
                "readout_loss": readout_loss.item(),
                "offset_loss": offset_loss.item(),
                "lr": scheduler.get_last_lr()[0],
            }
            _append(log_path, {"step": step, **record, "seconds": seconds})
        if step % config.eval_every == 0 or step == config.optim.steps:
            metrics = evaluate(model, batches, eval_questions, config.optim.batch_size)
            _append(eval_path, {"step": step, **metrics})
            logger.info("step %d: %s", step, ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
            model.train()
        if step % config.save_every == 0 or step == config.optim.steps:
            _save_checkpoint(output_dir, step, model, readout, optimizer, scheduler, config.keep_checkpoints)
    return export(model, start, output_dir / "model")


@torch.no_grad()
def evaluate(model, batches: QuestionBatches, questions: Sequence[Question], batch_size: int) -> dict[str, float]:
    """Greedy whole-answer accuracy per skill (and overall) on fixed questions."""
    model.eval()
    correct: dict[str, list[bool]] = defaultdict(list)
    for begin in range(0, len(questions), batch_size):
        chunk = questions[begin : begin + batch_size]
        inputs, labels = batches(chunk)
        hits = answer_accuracy(model(**inputs).logits, labels).tolist()
        for question, hit in zip(chunk, hits):
            correct[question.skill].append(hit)
    metrics = {f"accuracy_{skill}": float(np.mean(hits)) for skill, hits in sorted(correct.items())}
    metrics["accuracy"] = float(np.mean([hit for hits in correct.values() for hit in hits]))
    return metrics


def export(model, initial_folder: Path, folder: Path) -> Path:
    """The trained weights in bfloat16 beside the initial folder's processor and tokenizer files."""
    weights = {name: tensor.to(torch.bfloat16) for name, tensor in model.state_dict().items()}
    with atomic_folder(folder, replace=True) as temporary:
        for path in initial_folder.iterdir():
            if path.is_file() and not path.name.endswith(".safetensors") and path.name != "config.json":
                shutil.copy2(path, temporary / path.name)
        model.save_pretrained(temporary, state_dict=weights)
        make_readable(temporary)  # safetensors writes weights with mode 0600
    return folder


def _initial_backbone(config: BackboneTraining, output_dir: Path, tokenizer_texts: Sequence[str]) -> Path:
    """The random starting backbone (built once per run folder, so a resumed run has the same tokenizer)."""
    folder = output_dir / "initial"
    if not (folder / "config.json").is_file():
        tokenizer = train_tokenizer([*default_corpus(), *tokenizer_texts], vocab_size=config.vocab_size)
        with atomic_folder(folder) as temporary:
            build_tiny_backbone(out_dir=temporary, tokenizer=tokenizer, **config.model.model_dump())
    return folder


def _at_patch_size(start: Path, patch_size: int | None, output_dir: Path) -> Path:
    """`start`, or when `patch_size` is set and differs from its own, its copy with patches of that size (made
    once per run folder, `resize_patches`)."""
    own = json.loads((start / "config.json").read_text())["vision_config"]["patch_size"]
    if patch_size is None or patch_size == own:
        return start
    folder = output_dir / f"initial_patch{patch_size}"
    if not (folder / "config.json").is_file():
        with atomic_folder(folder) as temporary:
            resize_patches(start, temporary, patch_size)
    return folder


def _check_settings(output_dir: Path, config: BackboneTraining, start: Path | None) -> None:
    """A run folder trains one configuration: resuming it with settings that change training is refused."""
    path = output_dir / SETTINGS_FILE
    settings = config.model_dump(mode="json")
    if start is not None:
        settings["start_weights"] = {path.name: sha256_file(path) for path in sorted(start.glob("*.safetensors"))}
    if not path.is_file():
        write_json(path, settings)
        return
    changed = changed_settings(json.loads(path.read_text()), settings, RESUME_MAY_CHANGE)
    if changed:
        raise ValueError(
            f"{output_dir} holds a run with other settings ({'; '.join(changed)}); restore them to resume it, "
            "or choose another output_dir"
        )


def _checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    folder = output_dir / "checkpoints"
    found = [(int(m.group(1)), p) for p in folder.glob("step_*.pt") if (m := CHECKPOINT_PATTERN.match(p.name))]
    return sorted(found)


def _resume(output_dir: Path, model, readout: SceneReadout, optimizer, scheduler) -> int:
    checkpoints = _checkpoints(output_dir)
    if not checkpoints:
        return 0
    step, path = checkpoints[-1]
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    readout.load_state_dict(state["readout"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    logger.info("resuming from %s", path)
    return step


def _save_checkpoint(output_dir: Path, step: int, model, readout, optimizer, scheduler, keep: int) -> None:
    folder = output_dir / "checkpoints"
    folder.mkdir(exist_ok=True)
    state = {
        "model": model.state_dict(),
        "readout": readout.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }
    with atomic_path(folder / f"step_{step:07d}.pt") as temporary:
        torch.save(state, temporary)
    for _, old in _checkpoints(output_dir)[:-keep]:
        old.unlink()


def _append(path: Path, record: dict) -> None:
    with path.open("a") as file:
        file.write(json.dumps(record) + "\n")


def _truncate_log(path: Path, step: int) -> None:
    """Keep a log's records up to the resumed step: later ones came from a run that was discarded."""
    if path.is_file():
        kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        with atomic_path(path) as temporary:
            temporary.write_text("".join(line + "\n" for line in kept))
