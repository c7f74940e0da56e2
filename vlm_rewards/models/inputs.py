"""Model inputs for clips: every frame its own image, all interleaved in one causal sequence.

The progress RM, the preference RM and the generative judge all encode a clip in one forward pass.
Per sample the sequence is one ChatML user turn (IMAGE = `<|vision_start|><|image_pad|>*n<|vision_end|>`):

    <|im_start|>user\\n
    Goal: IMAGE...IMAGE\\n                      only with reference frames, one IMAGE per frame
    {instruction}\\n
    IMAGE IMAGE ... IMAGE                      per time step: the main view, then extra views by name
    \\n{question}                               only with a question
    <|im_end|>\\n
    <|im_start|>assistant\\n                    only with add_generation_prompt

The instruction precedes the frames, so in a causal model every frame's hidden states already know
the task. Each frame is one image (grid_t = 1) and its readout position is the `<|vision_end|>` of
the last view of its time step: the first token that has seen the whole step. With `frame_orders`
the frames are shown in the given order, each step prefixed by `Frame k: ` (k = 1, 2, ... in shown
order) and steps separated by newlines, GVL-style; readout positions still index the original frames.
With `initial_scene` as well, the first time step is shown once more before them as a context image,
`Initial scene: IMAGE\n` (OpenGVL's layout: the context is not one of the queried frames).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from transformers import BatchFeature, ProcessorMixin

from vlm_rewards.interface import RewardRequest, RewardSpec, validate_requests
from vlm_rewards.models.tokenizer import IM_END, IM_START, IMAGE_PAD, VISION_END, VISION_START
from vlm_rewards.models.vision import VisionConfig

IMAGE_PLACEHOLDER = VISION_START + IMAGE_PAD + VISION_END  # the processor repeats IMAGE_PAD per token
Sample = RewardRequest | tuple[str, np.ndarray] | tuple[str, np.ndarray, np.ndarray | None, Mapping[str, np.ndarray]]


@dataclass
class ClipBatch:
    """A batch of clips ready for the backbone.

    model_inputs: input_ids, attention_mask, mm_token_type_ids (1 on image tokens, else 0),
        pixel_values, image_grid_thw; pass as `model(**batch.model_inputs)`.
    readout_positions: (B, T_max) long, the sequence index of each frame's readout token; 0 where
        `frame_mask` is False.
    frame_mask: (B, T_max) bool, True for the frames a sample has.
    """

    model_inputs: BatchFeature
    readout_positions: torch.Tensor
    frame_mask: torch.Tensor

    def to(self, device: torch.device | str) -> ClipBatch:
        return ClipBatch(self.model_inputs.to(device), self.readout_positions.to(device), self.frame_mask.to(device))

    def gather(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, L, D) hidden states -> (B, T_max, D) at the readout positions (padded frames: position 0)."""
        index = self.readout_positions.unsqueeze(-1).expand(-1, -1, hidden_states.shape[-1])
        return hidden_states.gather(1, index)


class ClipInputBuilder:
    """Turns (instruction, clip[, reference][, views]) samples into a `ClipBatch`.

    Frames are resized once here (smart_resize to multiples of the family's factor, PIL bicubic) and
    the image processor only rescales, normalises and patchifies them. Pixel bounds default to the
    processor's. Sequences are right-padded by default; use padding_side="left" for batched generation.
    """

    def __init__(
        self,
        processor: ProcessorMixin,
        *,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        max_frames: int = 32,
        padding_side: Literal["right", "left"] = "right",
    ):
        self.processor = processor
        self.vision = VisionConfig.from_processor(processor).with_pixels(min_pixels, max_pixels)
        # validate_requests checks clips, texts and views; frame sizes are checked against `vision`.
        self._limits = RewardSpec(
            name=type(self).__name__,
            version="",
            max_frames=max_frames,
        )
        self.padding_side = padding_side
        self.vision_end_id = processor.tokenizer.convert_tokens_to_ids(VISION_END)
        self.special_tokens = tuple(processor.tokenizer.all_special_tokens)

    def build(
        self,
        samples: Sequence[Sample],
        *,
        question: str | Sequence[str] | None = None,
        add_generation_prompt: bool = False,
        frame_orders: Sequence[Sequence[int]] | None = None,
        initial_scene: bool = False,
    ) -> ClipBatch:
        """Encode `samples` (RewardRequest or (text, frames[, reference, views]) tuples).

        question: text after the frames, one for all samples or one per sample.
        add_generation_prompt: end with `<|im_start|>assistant\\n`, for the generative judge.
        frame_orders: per sample, the order to show its frames in (a permutation of range(T)); the
            frames are then labelled "Frame k: " in shown order.
        initial_scene: with frame_orders, show the first time step (all views) before the labelled
            frames as "Initial scene: " context; readouts still point at the labelled frames.
        """
        if initial_scene and frame_orders is None:
            raise ValueError("initial_scene: needs frame_orders (the context precedes labelled frames)")
        requests = [self._as_request(sample, f"samples[{i}]") for i, sample in enumerate(samples)]
        validate_requests(requests, self._limits, name="samples")
        questions = self._per_sample(question, len(requests), "question")
        orders = self._per_sample(frame_orders, len(requests), "frame_orders")
        for i, request in enumerate(requests):
            self._check_text(request.text, f"samples[{i}].text")
            if questions[i] is not None:
                self._check_text(questions[i], f"question[{i}]")

        prompts, images, readout_images = [], [], []
        for i, request in enumerate(requests):
            order = self._frame_order(orders[i], request.num_frames, f"frame_orders[{i}]")
            prompt, sample_images, sample_readouts = self._layout(
                request,
                f"samples[{i}]",
                questions[i],
                add_generation_prompt,
                order,
                labelled=orders[i] is not None,
                initial_scene=initial_scene,
            )
            prompts.append(prompt)
            images.extend(sample_images)
            readout_images.append(sample_readouts)

        model_inputs = self.processor(
            text=prompts,
            images=images,
            do_resize=False,
            padding=True,
            padding_side=self.padding_side,
            return_tensors="pt",
        )
        readout_positions, frame_mask = self._readouts(model_inputs["input_ids"], readout_images)
        return ClipBatch(model_inputs, readout_positions, frame_mask)

    @staticmethod
    def _as_request(sample: Sample, where: str) -> RewardRequest:
        if isinstance(sample, RewardRequest):
            return sample
        if not isinstance(sample, tuple) or len(sample) not in (2, 4):
            raise ValueError(
                f"{where}: expected a RewardRequest or a (text, frames[, reference, views]) tuple, "
                f"got {type(sample).__name__}"
            )
        text, frames, *extra = sample
        reference, views = extra if extra else (None, None)
        return RewardRequest(frames=frames, text=text, reference=reference, views=views or {})

    def _check_text(self, text: Any, where: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: expected a non-empty string, got {text!r}")
        for token in self.special_tokens:
            if token in text:
                raise ValueError(f"{where}: contains the special token {token!r}, which would break the layout")

    @staticmethod
    def _per_sample(value: Any, batch_size: int, name: str) -> list[Any]:
        if value is None or isinstance(value, str):
            return [value] * batch_size
        if len(value) != batch_size:
            raise ValueError(f"{name}: {len(value)} entries for {batch_size} samples")
        return list(value)

    @staticmethod
    def _frame_order(order: Sequence[int] | None, num_frames: int, where: str) -> list[int]:
        if order is None:
            return list(range(num_frames))
        if sorted(int(t) for t in order) != list(range(num_frames)):
            raise ValueError(f"{where}: {list(order)} is not a permutation of range({num_frames})")
        return [int(t) for t in order]

    def _layout(
        self,
        request: RewardRequest,
        where: str,
        question: str | None,
        add_generation_prompt: bool,
        order: list[int],
        labelled: bool,
        initial_scene: bool = False,
    ) -> tuple[str, list[np.ndarray], list[int]]:
        """The prompt text, its images in sequence order, and per original frame t the index (among
        this sample's images) of the image whose `<|vision_end|>` is frame t's readout."""
        views = [self.vision.resize(request.frames, f"{where}.frames")]
        views += [self.vision.resize(request.views[name], f"{where}.views[{name!r}]") for name in sorted(request.views)]
        images: list[np.ndarray] = []
        parts = [f"{IM_START}user\n"]
        if request.reference is not None:
            images.extend(self.vision.resize(request.reference, f"{where}.reference"))
            parts.append("Goal: " + IMAGE_PLACEHOLDER * len(request.reference) + "\n")
        parts.append(request.text + "\n")
        if initial_scene:
            images.extend(view[0] for view in views)
            parts.append("Initial scene: " + IMAGE_PLACEHOLDER * len(views) + "\n")

        readout_image = [0] * len(order)
        steps = []
        for shown, t in enumerate(order):
            images.extend(view[t] for view in views)
            readout_image[t] = len(images) - 1
            label = f"Frame {shown + 1}: " if labelled else ""
            steps.append(label + IMAGE_PLACEHOLDER * len(views))
        parts.append(("\n" if labelled else "").join(steps))

        if question is not None:
            parts.append("\n" + question)
        parts.append(f"{IM_END}\n")
        if add_generation_prompt:
            parts.append(f"{IM_START}assistant\n")
        return "".join(parts), images, readout_image

    def _readouts(self, input_ids: torch.Tensor, readout_images: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        max_frames = max(len(indices) for indices in readout_images)
        positions = torch.zeros(len(readout_images), max_frames, dtype=torch.long)
        mask = torch.zeros(len(readout_images), max_frames, dtype=torch.bool)
        for b, indices in enumerate(readout_images):
            vision_ends = (input_ids[b] == self.vision_end_id).nonzero().squeeze(-1)
            positions[b, : len(indices)] = vision_ends[indices]
            mask[b, : len(indices)] = True
        return positions, mask
