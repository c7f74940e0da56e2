"""Published robot reward models on Qwen-VL backbones.

- `topreward` (TOPReward, arXiv:2602.19313; ported from TOPReward/TOPReward topreward/clients/qwen.py,
  its `add_chat_template` prompt): after the frames the chat model reads "The above video shows a
  robot manipulation trajectory that completes the following task: {text} Decide whether the above
  statement is True or not. The answer is:", and the score is log P("True") at the start of the
  assistant's answer, a log-softmax over the whole vocabulary (not the yes/no renormalisation of
  `vlm_judge`). Progress is that log-probability at every prefix 0..t, min–max normalised within the
  clip as LeRobot's TOPReward integration does (`normalize_rewards`), so it is not causal. The reward
  is P("True") of the whole clip. Unlike the reference, this project's layout also shows the
  instruction once before the frames (see `vlm_rewards.models.inputs`).
- `robometer` (Robometer, aliang8/reward_fm rfm/models/rfm.py + rfm/models/heads.py, multi-image
  mode): a Qwen-VL with `progress_head` = LayerNorm–Linear–Sigmoid and `success_head` =
  LayerNorm–Linear on each frame's embedding, the mean of the hidden states strictly between its
  `<|vision_start|>` and `<|vision_end|>`. Progress per frame, success probability σ(logit) per frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pydantic
import torch
from safetensors import safe_open
from torch import nn
from transformers import PreTrainedModel, ProcessorMixin

from vlm_rewards.fingerprint import fingerprint, weights_fingerprint
from vlm_rewards.interface import BaseReward, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.models.backbones import load_backbone
from vlm_rewards.models.device import resolve_device, resolve_dtype
from vlm_rewards.models.hub import resolve_checkpoint
from vlm_rewards.models.inputs import ClipInputBuilder
from vlm_rewards.models.judge import ChatJudge, JudgeParams, QwenVLRuntime, clip_prefixes
from vlm_rewards.registry import register

TOPREWARD_PROMPT = (
    "The above video shows a robot manipulation trajectory that completes the following task: {text} "
    "Decide whether the above statement is True or not. The answer is:"
)


def min_max_normalize(values: np.ndarray) -> np.ndarray:
    """(values − min) / (max − min) within one clip; a single value or a flat curve is all ones
    (LeRobot's TOPReward `normalize_rewards`)."""
    low, high = values.min(), values.max()
    if values.size == 1 or high == low:
        return np.ones_like(values)
    return (values - low) / (high - low)


def single_token_id(tokenizer, word: str) -> int:
    """The id of `word` when the tokenizer encodes it as one token; a ValueError otherwise."""
    ids = tokenizer.encode(word, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"answer {word!r} is {len(ids)} tokens {ids} for this tokenizer; expected a single token")
    return ids[0]


@register("topreward")
class TOPReward(ChatJudge):
    """reward = P(answer | whole clip); progress = min–max normalised log P(answer | frames 0..t);
    info: log_p (of the whole clip) and log_p_prefixes (per prefix, before normalising)."""

    class Params(JudgeParams):
        name: str = "topreward"
        """The reward's name in results, logs and reports."""
        question: str = TOPREWARD_PROMPT
        """The statement after the frames; `{text}` is replaced by the request's instruction."""
        answer: str = "True"
        """The affirmative answer whose log-probability is read; must be one token of the model's vocabulary."""
        per_frame: bool = True
        """Score every prefix (dense progress, one forward pass per frame) instead of the whole clip once."""

    def __init__(self, model: PreTrainedModel, processor: ProcessorMixin, params: Params):
        super().__init__(
            model,
            processor,
            params,
            dense=params.per_frame,
            causal=False,  # min-max normalisation reads the whole clip
            decoding=("log_softmax", params.answer),
        )
        self.answer_id = single_token_id(self.tokenizer, params.answer)

    @torch.inference_mode()
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        clips = [p for r in requests for p in clip_prefixes(r)] if self.params.per_frame else requests
        size = self.params.batch_size
        log_p = torch.cat([self.log_p_answer(clips[i : i + size]) for i in range(0, len(clips), size)])
        log_p = log_p.double().cpu().numpy()
        results, end = [], 0
        for request in requests:
            start, end = end, end + (request.num_frames if self.params.per_frame else 1)
            curve = log_p[start:end]
            info = {"log_p": float(curve[-1]), "log_p_prefixes": curve.tolist()}
            progress = min_max_normalize(curve) if self.params.per_frame else None
            results.append(RewardResult(reward=float(np.exp(curve[-1])), progress=progress, info=info))
        return results

    def log_p_answer(self, requests: Sequence[RewardRequest]) -> torch.Tensor:
        """(B,) log P(answer) as the first token of the assistant's reply, for one batch of requests."""
        batch = self.encode(requests)
        logits = self.model(**batch.model_inputs, logits_to_keep=1).logits[:, -1]
        return logits.float().log_softmax(-1)[:, self.answer_id]


HEADS = ("progress_head", "success_head")


def head(hidden_size: int, sigmoid: bool) -> nn.Sequential:
    """A Robometer head: LayerNorm, Linear to one output, and for progress a Sigmoid."""
    layers = [nn.LayerNorm(hidden_size), nn.Linear(hidden_size, 1)]
    return nn.Sequential(*layers, nn.Sigmoid()) if sigmoid else nn.Sequential(*layers)


def load_head_weights(folder: str, names: Sequence[str]) -> dict[str, dict[str, torch.Tensor]]:
    """{head name: its state dict} read from the safetensors files of a checkpoint folder."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ValueError(f"robometer: {folder} has no *.safetensors; expected a saved Robometer checkpoint")
    heads: dict[str, dict[str, torch.Tensor]] = {name: {} for name in names}
    for file in files:
        with safe_open(file, framework="pt") as weights:
            for key in weights.keys():  # noqa: SIM118 - safe_open is not iterable
                name, _, rest = key.partition(".")
                if name in heads:
                    heads[name][rest] = weights.get_tensor(key)
    missing = [name for name, tensors in heads.items() if not tensors]
    if missing:
        raise ValueError(f"robometer: {folder} has no weights for {missing}; expected a Robometer (RFM) checkpoint")
    return heads


@register("robometer")
class Robometer(BaseReward):
    """progress[t] = the progress head at frame t (in [0, 1]); reward = progress of the last frame;
    components: success = P(success) at the last frame; info: success_per_frame.

    The request's reference frames and extra views are not shown (Robometer scores one camera)."""

    class Params(QwenVLRuntime):
        name: str = "robometer"
        """The reward's name in results, logs and reports."""
        model: str = pydantic.Field(min_length=1)
        """Hub id or folder of a Robometer checkpoint (Qwen-VL weights under `model.`, heads beside them)."""

    def __init__(self, model: PreTrainedModel, processor: ProcessorMixin, heads: nn.ModuleDict, params: Params):
        self.model, self.heads, self.params = model.eval(), heads.eval(), params
        self.builder = ClipInputBuilder(
            processor, min_pixels=params.min_pixels, max_pixels=params.max_pixels, max_frames=params.max_frames
        )
        tokenizer = processor.tokenizer
        self.vision_start, self.vision_end = tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>"])
        self.spec = RewardSpec(
            name=params.name,
            version=fingerprint(
                "robometer",
                params.model_dump(exclude={"device", "dtype", "batch_size", "name"}),
                weights_fingerprint(params.model, getattr(model.config, "_commit_hash", None)),
            ),
            value_range=(0.0, 1.0),
            dense=True,
            causal=True,  # frame t's tokens attend only to the instruction and frames <= t
            components=("success",),
            frame_size=(self.builder.vision.factor, 1 << 16),
            max_frames=params.max_frames,
        )

    @classmethod
    def from_params(cls, params: Params) -> Robometer:
        device = resolve_device(params.device)
        folder = resolve_checkpoint(params.model, "robometer: a Robometer checkpoint folder or hub id")
        # RFM keeps the base model under `model.`, as ...ForConditionalGeneration does; its LM head is unused.
        with_head, processor = load_backbone(folder, with_lm_head=True, dtype=resolve_dtype(params.dtype, device))
        model = with_head.model
        hidden = model.config.get_text_config().hidden_size
        heads = nn.ModuleDict({name: head(hidden, sigmoid=name == "progress_head") for name in HEADS})
        for name, state_dict in load_head_weights(folder, HEADS).items():
            try:
                heads[name].load_state_dict(state_dict, strict=True)
            except RuntimeError as error:
                raise ValueError(
                    f"robometer: {params.model} {name} is not LayerNorm-Linear({hidden}, 1): {error}"
                ) from None
        return cls(model.to(device), processor, heads.to(device, model.dtype), params)

    @torch.inference_mode()
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        size = self.params.batch_size
        outputs = [self.frame_outputs(requests[i : i + size]) for i in range(0, len(requests), size)]
        results = []
        for progress, success in (pair for batch in outputs for pair in batch):
            results.append(
                RewardResult(
                    reward=float(progress[-1]),
                    progress=progress,
                    components={"success": float(success[-1])},
                    info={"success_per_frame": success.tolist()},
                )
            )
        return results

    def frame_outputs(self, requests: Sequence[RewardRequest]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per request, (progress, success probability) per frame."""
        clips = [replace(request, reference=None, views={}) for request in requests]
        inputs = self.builder.build(clips, device=self.model.device).to(self.model.device).model_inputs
        hidden = self.model(**inputs).last_hidden_state
        outputs = []
        for row, ids in zip(hidden, inputs["input_ids"]):
            frames = self.frame_embeddings(row, ids)
            progress = self.heads["progress_head"](frames).squeeze(-1)
            success = torch.sigmoid(self.heads["success_head"](frames).squeeze(-1))
            outputs.append((progress.double().cpu().numpy(), success.double().cpu().numpy()))
        return outputs

    def frame_embeddings(self, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """(T, D): per image, the mean hidden state strictly between its vision start and end tokens."""
        starts = (input_ids == self.vision_start).nonzero().squeeze(-1).tolist()
        ends = (input_ids == self.vision_end).nonzero().squeeze(-1).tolist()
        return torch.stack([hidden[start + 1 : end].mean(0) for start, end in zip(starts, ends)])
