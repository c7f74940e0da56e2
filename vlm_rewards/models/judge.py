"""Generative judges: any chat VLM checkpoint (Qwen-VL family) as a zero-shot reward, no training.

- `YesNoJudge` (kind `vlm_judge`): asks a yes/no question about the clip and reads P(yes) from the
  LM head's next-token distribution after the assistant prompt, as RewardDance does. The yes and no
  token sets hold the first token of each spelling ("yes", "Yes", " yes", ...); P(yes) is the softmax
  mass of the yes set within yes ∪ no. With `per_frame`, progress[t] = P(yes) given frames 0..t.
- `GVLProgressJudge` (kind `gvl_progress`): Generative Value Learning (GVL, arXiv:2411.04549), laid
  out as OpenGVL does: the first frame is shown once as an "Initial scene:" context image (0%), then
  all T frames shuffled, labelled "Frame k:"; the model answers a completion percentage per frame
  with greedy decoding, and the answer is parsed and mapped back to time order. Shuffling breaks the
  temporal order a model would otherwise copy into monotone answers, and no queried frame is pinned,
  so a judge that guesses at random scores VOC ≈ 0. The shuffle is seeded by the request itself (its
  `key` when given, else a hash of its text and pixels), never by its batch position, so a result
  does not depend on its batch-mates. GVL's in-context example episodes are not supported.

Both show the request's reference frames as the "Goal:" image(s) and its extra views per time step
(see `vlm_rewards.models.inputs`). Neither has a native pairwise judgement: `prefer` is the default
σ(r_a − r_b) of the two rewards.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from typing import Literal

import numpy as np
import pydantic
import torch
from transformers import PreTrainedModel, ProcessorMixin

from vlm_rewards.config import Settings
from vlm_rewards.fingerprint import fingerprint, weights_fingerprint
from vlm_rewards.interface import BaseReward, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.models.backbones import load_backbone
from vlm_rewards.models.device import resolve_device, resolve_dtype
from vlm_rewards.models.inputs import ClipBatch, ClipInputBuilder
from vlm_rewards.registry import register

YES_WORDS = ("yes", "Yes", " yes", " Yes", "YES", " YES")
NO_WORDS = ("no", "No", " no", " No", "NO", " NO")
DEFAULT_YES_NO_QUESTION = "Does this show the task '{text}' completed? Answer yes or no."
DEFAULT_GVL_QUESTION = (
    "The initial scene shows the task '{text}' at 0% completion. The frames after it are shown in random "
    "order. For each frame, estimate the task completion percentage (0-100%). Answer one line per frame "
    "as 'Frame k: p%'."
)
# A frame label: "Frame 3:", "**Frame 3** -", "frame 3 =", "Frame #3)", or a bare "3:" at the start of a line.
FRAME_LABEL_PATTERN = re.compile(
    r"(?:\bframe\s*#?\s*(?P<frame>\d+)|^[ \t]*(?P<bare>\d+))[*\s]*(?:[:=)\-–—]|\.(?!\d))",
    re.IGNORECASE | re.MULTILINE,
)
PERCENT_PATTERN = re.compile(r"(?<![\d.])(?P<value>-?\d+(?:\.\d+)?)\s*%")
NUMBER_PATTERN = re.compile(r"(?<![\d.])-?\d+(?:\.\d+)?(?![\d.])")
COMPLETION_PATTERN = re.compile(r"complet|progress", re.IGNORECASE)
PARSER_VERSION = (FRAME_LABEL_PATTERN.pattern, PERCENT_PATTERN.pattern, NUMBER_PATTERN.pattern, "completion-first")
# Params that change how fast a judge runs, not what it answers; left out of the version.
RUNTIME_PARAMS = {"device", "dtype", "batch_size", "name"}


class QwenVLRuntime(Settings):
    """Where and how a Qwen-VL checkpoint runs, and the frames it accepts."""

    device: str = "auto"
    """auto (cuda when present, else cpu) or a torch device string."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights' dtype; auto: bfloat16 on GPUs that support it, else float32."""
    batch_size: int = pydantic.Field(4, ge=1)
    """Requests (clips) per forward pass or generate call."""
    min_pixels: int | None = pydantic.Field(None, ge=1)
    """Fewest pixels per frame after resizing; None: the processor's bound."""
    max_pixels: int | None = pydantic.Field(None, ge=1)
    """Most pixels per frame after resizing; None: the processor's bound."""
    max_frames: int = pydantic.Field(32, ge=1)
    """Most frames per request; longer clips are refused (subsample them first)."""


class JudgeParams(QwenVLRuntime):
    model: str = pydantic.Field(min_length=1)
    """Hub id or folder of a chat Qwen-VL checkpoint."""
    question: str
    """Asked after the frames; `{text}` is replaced by the request's instruction."""
    name: str
    """The reward's name in results, logs and reports."""

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
        dense: bool,
        causal: bool,
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
            version=fingerprint(
                type(self).__name__,
                params.model_dump(exclude=RUNTIME_PARAMS),
                weights_fingerprint(params.model, getattr(model.config, "_commit_hash", None)),
                decoding,
            ),
            dense=dense,
            causal=causal,
            value_range=(0.0, 1.0),
            frame_size=(self.builder.vision.factor, 1 << 16),
            max_frames=params.max_frames,
            max_text_length=context_text_limit(model),
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


CHARS_PER_TOKEN = 3  # a generous average: English BPE text runs about 4 characters per token


def context_window(model: PreTrainedModel) -> int | None:
    """The language model's context in tokens (`max_position_embeddings`), None if it has none."""
    context = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    return int(context) if context else None


def context_text_limit(model: PreTrainedModel) -> int | None:
    """`spec.max_text_length` of a judge: the context window × CHARS_PER_TOKEN characters.

    A text this long fills the whole context on its own (frames and question come on top), so it is
    rejected at the boundary before any tokenising or forward pass; shorter texts that still overflow
    with the frames are caught after encoding (see `GVLProgressJudge.generate`).
    """
    context = context_window(model)
    return None if context is None else context * CHARS_PER_TOKEN


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
    """reward = P(yes) to a yes/no question about the clip; info: p_yes, logit_yes, logit_no.

    With `per_frame`, progress[t] = P(yes) given frames 0..t (one forward per prefix) and the info
    values are those of the whole clip.
    """

    class Params(JudgeParams):
        name: str = "vlm_judge"
        """The reward's name in results, logs and reports."""
        question: str = DEFAULT_YES_NO_QUESTION
        """The yes/no question asked after the frames; `{text}` is replaced by the request's instruction."""
        per_frame: bool = False
        """Ask at every frame prefix (dense progress, one forward per prefix) instead of once after the clip."""

    def __init__(self, model: PreTrainedModel, processor: ProcessorMixin, params: Params):
        super().__init__(
            model,
            processor,
            params,
            dense=params.per_frame,
            causal=params.per_frame,  # progress[t] reads only frames 0..t
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
            info = {"p_yes": float(p_yes[last]), "logit_yes": float(logit_yes[last]), "logit_no": float(logit_no[last])}
            progress = p_yes[start:end] if self.params.per_frame else None
            results.append(RewardResult(reward=float(p_yes[last]), progress=progress, info=info))
        return results

    def readout(self, requests: Sequence[RewardRequest]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(p_yes, logit_yes, logit_no) for one batch of requests."""
        batch = self.encode(requests)
        logits = self.model(**batch.model_inputs, logits_to_keep=1).logits[:, -1]
        return yes_no_readout(logits, self.yes_ids, self.no_ids)


def parse_progress_answer(answer: str, num_frames: int) -> np.ndarray:
    """Per shown frame k = 1..num_frames, the percentage the answer gives it, clipped to [0, 100] and
    divided by 100; NaN where none is given.

    The answer is cut at its frame labels ("Frame k:", or "k:" at the start of a line); frame k's
    value comes from its segment, up to the next label: the first number followed by "%" after the
    last mention of completion/progress, else the first number followed by "%", else the segment's
    number if it has exactly one ("Frame 2: 45"). So "Frame 2: top-left, 90%" reads 90% and
    "Frame 2: 2 blocks stacked, 60%" reads 60%, not 2%; "Frame 2: 2 blocks, 60" (no %) is ambiguous
    and stays NaN. The first value given for a frame wins; frame numbers outside 1..num_frames are
    ignored. A fraction like "0.45" is read as 0.45%, not 45%.
    """
    values = np.full(num_frames, np.nan)
    labels = list(FRAME_LABEL_PATTERN.finditer(answer))
    for label, following in zip(labels, [*labels[1:], None]):
        index = int(label["frame"] or label["bare"]) - 1
        if not 0 <= index < num_frames or not math.isnan(values[index]):
            continue
        value = segment_percentage(answer[label.end() : following.start() if following else len(answer)])
        if value is not None:
            values[index] = min(max(value, 0.0), 100.0) / 100.0
    return values


def segment_percentage(segment: str) -> float | None:
    """The percentage one frame's part of an answer gives (see `parse_progress_answer`), or None."""
    mentions = list(COMPLETION_PATTERN.finditer(segment))
    if mentions and (after := PERCENT_PATTERN.search(segment, mentions[-1].end())):
        return float(after["value"])
    if percent := PERCENT_PATTERN.search(segment):
        return float(percent["value"])
    numbers = NUMBER_PATTERN.findall(segment)
    return float(numbers[0]) if len(numbers) == 1 else None


def progress_result(answer: str, frame_order: Sequence[int]) -> RewardResult:
    """The result for a GVL answer about frames shown in `frame_order` (shown k-th = original frame_order[k]).

    reward: the last frame's progress, else the latest parsed frame's; NaN if none parsed.
    info: answer, frame_order, unparsed_frames (original indices left NaN). `error` is set whenever a
    frame could not be parsed (its progress is NaN), even if the reward is finite.
    """
    progress = np.empty(len(frame_order))
    progress[list(frame_order)] = parse_progress_answer(answer, len(frame_order))
    parsed = np.flatnonzero(~np.isnan(progress))
    unparsed = np.flatnonzero(np.isnan(progress)).tolist()
    info = {"answer": answer, "frame_order": [int(t) for t in frame_order], "unparsed_frames": unparsed}
    if parsed.size == 0:
        error = f"no 'Frame k: p%' line could be parsed from the answer {answer[:200]!r}"
        return RewardResult(reward=math.nan, progress=progress, info=info, error=error)
    error = f"no percentage parsed for frames {unparsed} (time order) from the answer" if unparsed else None
    return RewardResult(reward=float(progress[parsed[-1]]), progress=progress, info=info, error=error)


def gvl_frame_order(request: RewardRequest, seed: int = 0) -> list[int]:
    """The order GVL shows `request`'s frames in: a permutation of range(T) that depends only on the
    request (its `key` when given, else its text and pixels) and `seed`, never on its batch-mates."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{request.num_frames}\0{request.text}\0".encode())
    if request.key is not None:
        digest.update(repr(("key", request.key.source, request.key.episode, request.key.frame)).encode())
    else:
        arrays = [request.frames, request.reference, *(request.views[name] for name in sorted(request.views))]
        for array in arrays:
            if array is not None:
                digest.update(repr(array.shape).encode())
                digest.update(np.ascontiguousarray(array).data)
    words = np.frombuffer(digest.digest(), dtype=np.uint32).tolist()
    return np.random.default_rng([seed, *words]).permutation(request.num_frames).tolist()


@register("gvl_progress")
class GVLProgressJudge(ChatJudge):
    """Zero-shot per-frame progress from a generated answer (see the module docstring).

    info: answer (raw text), frame_order (original index of each shown frame), unparsed_frames
    (original indices with NaN progress); `error` says which frames could not be parsed. The spec is
    dense, not causal (every frame's value is read from one answer about the whole clip), batch
    invariant (the shuffle is seeded by the request, see `gvl_frame_order`) and deterministic (greedy
    decoding). `max_text_length` comes from the model's context window, as for every `ChatJudge`.
    """

    class Params(JudgeParams):
        name: str = "gvl_progress"
        """The reward's name in results, logs and reports."""
        question: str = DEFAULT_GVL_QUESTION
        """The prompt asking for each shown frame's completion percentage; `{text}` is the instruction."""
        max_new_tokens: int = pydantic.Field(512, ge=1)
        """Longest answer generated; about 8 tokens per "Frame k: p%" line."""
        seed: int = 0
        """Seed of the shuffled frame order the judge sees (GVL's protocol), mixed with the request's key."""

    def __init__(self, model: PreTrainedModel, processor: ProcessorMixin, params: Params):
        super().__init__(
            model, processor, params, dense=True, causal=False, decoding=("opengvl-layout", PARSER_VERSION)
        )

    def frame_order(self, request: RewardRequest) -> list[int]:
        """The order `request`'s frames are shown in (all of them shuffled; see `gvl_frame_order`)."""
        return gvl_frame_order(request, self.params.seed)

    @torch.inference_mode()
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        orders = [self.frame_order(request) for request in requests]
        size = self.params.batch_size
        answers = [
            answer
            for start in range(0, len(requests), size)
            for answer in self.generate(requests[start : start + size], orders[start : start + size])
        ]
        return [progress_result(answer, order) for answer, order in zip(answers, orders)]

    def encode(self, requests: Sequence[RewardRequest], frame_orders: Sequence[Sequence[int]]) -> ClipBatch:
        """The prompts: instruction, the first frame as "Initial scene:", the shuffled frames, the question."""
        questions = [self.params.question.format(text=request.text) for request in requests]
        batch = self.builder.build(
            requests, question=questions, add_generation_prompt=True, frame_orders=frame_orders, initial_scene=True
        )
        return batch.to(self.model.device)

    def generate(self, requests: Sequence[RewardRequest], frame_orders: Sequence[Sequence[int]]) -> list[str]:
        """The greedy answers for one batch of requests shown in `frame_orders`."""
        inputs = self.encode(requests, frame_orders).model_inputs
        context = context_window(self.model)
        lengths = inputs["attention_mask"].sum(-1).tolist()
        if context is not None and max(lengths) + self.params.max_new_tokens > context:
            row = max(range(len(lengths)), key=lengths.__getitem__)
            raise ValueError(
                f"{self.spec.name}: request {requests[row].key or row} needs {lengths[row]} prompt tokens + "
                f"max_new_tokens {self.params.max_new_tokens}, more than the model's context of {context} "
                "tokens; shorten the text or show fewer or smaller frames"
            )
        output = self.model.generate(**inputs, max_new_tokens=self.params.max_new_tokens, do_sample=False)
        return self.tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
