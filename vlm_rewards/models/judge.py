"""Generative judges: any chat VLM checkpoint (Qwen-VL family) as a zero-shot reward, no training.

- `YesNoJudge` (kind `vlm_judge`): asks a yes/no question about the clip and reads P(yes) from the
  LM head's next-token distribution after the assistant prompt, as RewardDance does. The yes and no
  token sets hold the first token of each spelling ("yes", "Yes", " yes", ...); P(yes) is the softmax
  mass of the yes set within yes ∪ no. With `per_frame`, progress[t] = P(yes) given frames 0..t.
- `GVLProgressJudge` (kind `gvl_progress`): Generative Value Learning (GVL, arXiv:2411.04549). The
  clip's frames are shown shuffled, the first frame kept first as the anchor, labelled "Frame k:";
  the model answers a completion percentage per frame with greedy decoding, and the answer is parsed
  and mapped back to time order. Shuffling breaks the temporal order a model would otherwise copy into
  monotone answers. GVL's in-context example episodes are not supported.

Both show the request's reference frames as the "Goal:" image(s) and its extra views per time step
(see `vlm_rewards.models.inputs`). Neither has a native pairwise judgement: `prefer` is the default
σ(r_a − r_b) of the two rewards.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Literal

import numpy as np
import pydantic
import torch
from transformers import PreTrainedModel, ProcessorMixin

from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import BaseReward, OutputKind, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.models.backbones import load_backbone
from vlm_rewards.models.inputs import ClipBatch, ClipInputBuilder
from vlm_rewards.models.reward_model import resolve_device, resolve_dtype
from vlm_rewards.registry import register

YES_WORDS = ("yes", "Yes", " yes", " Yes", "YES", " YES")
NO_WORDS = ("no", "No", " no", " No", "NO", " NO")
DEFAULT_YES_NO_QUESTION = "Does this show the task '{text}' completed? Answer yes or no."
DEFAULT_GVL_QUESTION = (
    "The frames are shown in random order, except Frame 1, the initial scene at 0%. For each frame, estimate "
    "the task completion percentage (0-100%) for '{text}'. Answer one line per frame as 'Frame k: p%'."
)
# "Frame 3: 45%", "**Frame 3** - about 45.5 %", "frame 3 = 45", or a bare "3: 45%" at the start of a line.
PROGRESS_PATTERN = re.compile(
    r"(?:\bframe\s*(?P<frame>\d+)|^[ \t]*(?P<bare>\d+))[*\s]*[:=\-–—][^\d\n-]*?(?P<value>-?\d+(?:\.\d+)?)",
    re.IGNORECASE | re.MULTILINE,
)
# Params that change how fast a judge runs, not what it answers; left out of the version.
RUNTIME_PARAMS = {"device", "dtype", "batch_size", "name"}


class JudgeParams(pydantic.BaseModel, extra="forbid"):
    model: str = pydantic.Field(min_length=1)  # hub id or folder of a chat Qwen-VL checkpoint
    question: str  # asked after the frames; `{text}` is replaced by the request's instruction
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    batch_size: int = pydantic.Field(4, ge=1)
    min_pixels: int | None = pydantic.Field(None, ge=1)  # None: the processor's bounds
    max_pixels: int | None = pydantic.Field(None, ge=1)
    max_frames: int = pydantic.Field(32, ge=1)
    name: str

    @pydantic.field_validator("question")
    @classmethod
    def _formats(cls, question: str) -> str:
        try:
            question.format(text="")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(
                f"question {question!r} must be a format string whose only field is {{text}} "
                f"(write other braces as {{{{ and }}}}): {error!r}"
            ) from None
        return question


class ChatJudge(BaseReward):
    """Shared by the judges: the chat model, left-padded clip inputs with the question, and the spec."""

    def __init__(
        self,
        model: PreTrainedModel,
        processor: ProcessorMixin,
        params: JudgeParams,
        output: OutputKind,
        decoding: object,
    ):
        """`decoding`: whatever else decides the answers (token sets, parser), folded into the version."""
        self.model = model.eval()
        self.params = params
        self.builder = ClipInputBuilder(
            processor,
            min_pixels=params.min_pixels,
            max_pixels=params.max_pixels,
            max_frames=params.max_frames,
            padding_side="left",  # every row ends at its generation prompt
        )
        self.spec = RewardSpec(
            name=params.name,
            version=fingerprint(type(self).__name__, params.model_dump(exclude=RUNTIME_PARAMS), decoding),
            output=output,
            value_range=(0.0, 1.0),
            frame_size=(self.builder.vision.factor, 1 << 16),
            max_frames=params.max_frames,
        )

    @classmethod
    def from_params(cls, params: JudgeParams) -> ChatJudge:
        device = resolve_device(params.device)
        model, processor = load_backbone(params.model, with_lm_head=True, dtype=resolve_dtype(params.dtype, device))
        return cls(model.to(device), processor, params)

    @property
    def tokenizer(self):
        return self.builder.processor.tokenizer

    def encode(
        self, requests: Sequence[RewardRequest], frame_orders: Sequence[Sequence[int]] | None = None
    ) -> ClipBatch:
        questions = [self.params.question.format(text=request.text) for request in requests]
        batch = self.builder.build(requests, question=questions, add_generation_prompt=True, frame_orders=frame_orders)
        return batch.to(self.model.device)


def answer_token_ids(tokenizer, words: Sequence[str]) -> list[int]:
    """The distinct first tokens of `words` that carry at least one letter of the word.

    A first token that is only whitespace (" Yes" -> "Ġ", "Yes" in a small vocabulary) would count
    for yes and no alike, so it is left out.
    """
    ids = []
    for word in words:
        first = tokenizer.encode(word, add_special_tokens=False)[0]
        if tokenizer.decode([first]).strip():
            ids.append(first)
    if not ids:
        raise ValueError(f"the tokenizer has no first token with a letter of any of {list(words)}")
    return list(dict.fromkeys(ids))


def yes_no_readout(
    logits: torch.Tensor, yes_ids: Sequence[int], no_ids: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, V) next-token logits -> (p_yes, logit_yes, logit_no), each (N,).

    logit_yes/logit_no are the log-sum-exp of the yes/no token logits, so p_yes = σ(logit_yes − logit_no)
    is the softmax mass of the yes tokens among the yes and no tokens.
    """
    logits = logits.float()
    logit_yes = logits[:, list(yes_ids)].logsumexp(-1)
    logit_no = logits[:, list(no_ids)].logsumexp(-1)
    return torch.sigmoid(logit_yes - logit_no), logit_yes, logit_no


def clip_prefixes(request: RewardRequest) -> list[RewardRequest]:
    """The requests for frames 0..t, t = 0..T-1 (views cut alike, reference kept)."""
    return [
        RewardRequest(
            request.frames[: t + 1],
            request.text,
            request.reference,
            {name: view[: t + 1] for name, view in request.views.items()},
            request.key,
        )
        for t in range(request.num_frames)
    ]


@register("vlm_judge")
class YesNoJudge(ChatJudge):
    """reward = P(yes) to a yes/no question about the clip; aux: p_yes, logit_yes, logit_no.

    With `per_frame`, progress[t] = P(yes) given frames 0..t (one forward per prefix) and the aux
    values are those of the whole clip.
    """

    class Params(JudgeParams):
        name: str = "vlm_judge"
        question: str = DEFAULT_YES_NO_QUESTION
        per_frame: bool = False

    def __init__(self, model: PreTrainedModel, processor: ProcessorMixin, params: Params):
        super().__init__(
            model,
            processor,
            params,
            output="progress" if params.per_frame else "scalar",
            decoding=(YES_WORDS, NO_WORDS),
        )
        self.yes_ids = answer_token_ids(self.tokenizer, YES_WORDS)
        self.no_ids = answer_token_ids(self.tokenizer, NO_WORDS)

    @torch.inference_mode()
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        clips = (
            [prefix for request in requests for prefix in clip_prefixes(request)] if self.params.per_frame else requests
        )
        size = self.params.batch_size
        readouts = [self.readout(clips[start : start + size]) for start in range(0, len(clips), size)]
        p_yes, logit_yes, logit_no = (torch.cat(values).double().cpu().numpy() for values in zip(*readouts))

        results, end = [], 0
        for request in requests:
            start, end = end, end + (request.num_frames if self.params.per_frame else 1)
            last = end - 1
            aux = {"p_yes": float(p_yes[last]), "logit_yes": float(logit_yes[last]), "logit_no": float(logit_no[last])}
            progress = p_yes[start:end] if self.params.per_frame else None
            results.append(RewardResult(reward=float(p_yes[last]), progress=progress, aux=aux))
        return results

    def readout(self, requests: Sequence[RewardRequest]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(p_yes, logit_yes, logit_no) for one batch of requests."""
        batch = self.encode(requests)
        logits = self.model(**batch.model_inputs, logits_to_keep=1).logits[:, -1]
        return yes_no_readout(logits, self.yes_ids, self.no_ids)


def parse_progress_answer(answer: str, num_frames: int) -> np.ndarray:
    """Per shown frame k = 1..num_frames, the percentage the answer gives it, clipped to [0, 100] and
    divided by 100; NaN where none is given. The first value given for a frame wins and frame numbers
    outside 1..num_frames are ignored. A fraction like "0.45" is read as 0.45%, not 45%."""
    values = np.full(num_frames, np.nan)
    for match in PROGRESS_PATTERN.finditer(answer):
        index = int(match["frame"] or match["bare"]) - 1
        if 0 <= index < num_frames and math.isnan(values[index]):
            values[index] = min(max(float(match["value"]), 0.0), 100.0) / 100.0
    return values


def progress_result(answer: str, frame_order: Sequence[int]) -> RewardResult:
    """The result for a GVL answer about frames shown in `frame_order` (shown k-th = original frame_order[k]).

    reward: the last frame's progress, else the latest parsed frame's; NaN with aux["error"] if none parsed.
    """
    progress = np.empty(len(frame_order))
    progress[list(frame_order)] = parse_progress_answer(answer, len(frame_order))
    parsed = np.flatnonzero(~np.isnan(progress))
    aux = {
        "answer": answer,
        "frame_order": list(frame_order),
        "unparsed_frames": np.flatnonzero(np.isnan(progress)).tolist(),
    }
    if parsed.size == 0:
        aux["error"] = f"no 'Frame k: p%' line could be parsed from the answer {answer[:200]!r}"
        return RewardResult(reward=math.nan, progress=progress, aux=aux)
    return RewardResult(reward=float(progress[parsed[-1]]), progress=progress, aux=aux)


@register("gvl_progress")
class GVLProgressJudge(ChatJudge):
    """Zero-shot per-frame progress from a generated answer (see the module docstring).

    aux: answer (raw text), frame_order (original index of each shown frame), unparsed_frames (original
    indices with NaN progress). A clip's shuffle depends only on `seed` and its index in the batch.
    """

    class Params(JudgeParams):
        name: str = "gvl_progress"
        question: str = DEFAULT_GVL_QUESTION
        max_new_tokens: int = pydantic.Field(512, ge=1)  # about 8 tokens per "Frame k: p%" line
        seed: int = 0

    def __init__(self, model: PreTrainedModel, processor: ProcessorMixin, params: Params):
        super().__init__(model, processor, params, output="progress", decoding=PROGRESS_PATTERN.pattern)

    def frame_order(self, index: int, num_frames: int) -> list[int]:
        """The order the `index`-th request's frames are shown in: frame 0 first, the rest shuffled."""
        rng = np.random.default_rng([self.params.seed, index])
        return [0, *(rng.permutation(num_frames - 1) + 1).tolist()]

    @torch.inference_mode()
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        orders = [self.frame_order(index, request.num_frames) for index, request in enumerate(requests)]
        size = self.params.batch_size
        answers = [
            answer
            for start in range(0, len(requests), size)
            for answer in self.generate(requests[start : start + size], orders[start : start + size])
        ]
        return [progress_result(answer, order) for answer, order in zip(answers, orders)]

    def generate(self, requests: Sequence[RewardRequest], frame_orders: Sequence[Sequence[int]]) -> list[str]:
        """The greedy answers for one batch of requests shown in `frame_orders`."""
        inputs = self.encode(requests, frame_orders).model_inputs
        output = self.model.generate(**inputs, max_new_tokens=self.params.max_new_tokens, do_sample=False)
        return self.tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
