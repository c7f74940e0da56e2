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
from functools import cached_property
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

    Frames are resized once here (smart_resize to multiples of the family's factor, PIL bicubic, on the
    CPU); `PieceEncoder` rescales, normalises and patchifies them as the image processor does, on the
    device given, and the tokenizer takes the prompts with each image's tokens expanded as the processor
    expands them. Pixel bounds default to the processor's. Sequences are right-padded by default; use
    padding_side="left" for batched generation.
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

    @cached_property
    def pieces(self) -> PieceEncoder:
        """A `PieceEncoder` on this builder's processor (streaming sessions share it: it caches tokens)."""
        return PieceEncoder(self.processor)

    def build(
        self,
        samples: Sequence[Sample],
        *,
        question: str | Sequence[str] | None = None,
        add_generation_prompt: bool = False,
        frame_orders: Sequence[Sequence[int]] | None = None,
        initial_scene: bool = False,
        device: torch.device | str | None = None,
    ) -> ClipBatch:
        """Encode `samples` (RewardRequest or (text, frames[, reference, views]) tuples).

        question: text after the frames, one for all samples or one per sample.
        add_generation_prompt: end with `<|im_start|>assistant\\n`, for the generative judge.
        frame_orders: per sample, the order to show its frames in (a permutation of range(T)); the
            frames are then labelled "Frame k: " in shown order.
        initial_scene: with frame_orders, show the first time step (all views) before the labelled
            frames as "Initial scene: " context; readouts still point at the labelled frames.
        device: where to preprocess the pixels (`PieceEncoder.pixels`); the rest stays on the CPU.
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

        tokens = self.processor.tokenizer(
            self._expand_images(prompts, [image.shape[:2] for image in images]),
            padding=True,
            padding_side=self.padding_side,
            return_tensors="pt",
        )
        mm_token_type_ids = self.processor.create_mm_token_type_ids(tokens["input_ids"].tolist())
        pixel_values, image_grid_thw = self.pieces.pixels(images, device)
        model_inputs = BatchFeature(
            {
                **tokens,
                "mm_token_type_ids": torch.tensor(mm_token_type_ids),
                "pixel_values": pixel_values,
                "image_grid_thw": image_grid_thw,
            }
        )
        readout_positions, frame_mask = self._readouts(model_inputs["input_ids"], readout_images)
        return ClipBatch(model_inputs, readout_positions, frame_mask)

    def _expand_images(self, prompts: list[str], sizes: list[tuple[int, int]]) -> list[str]:
        """The prompts with each image's `<|image_pad|>` repeated once per vision token, as the processor
        expands them (the images of all prompts in order, one size each)."""
        counts = iter([self.pieces.num_image_tokens(*size) for size in sizes])
        expanded = []
        for prompt in prompts:
            first, *rest = prompt.split(IMAGE_PAD)
            expanded.append(first + "".join(IMAGE_PAD * next(counts) + part for part in rest))
        return expanded

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


# ------------------------------------------------------------------------------ fast piece encoding


@dataclass(frozen=True)
class TokenBlock:
    """The processor's tokens for one piece of text with images: input_ids and mm_token_type_ids, (L,) long each,
    and the (t, h, w) patch grid of each of its images, in order."""

    input_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    grids: tuple[tuple[int, int, int], ...]


class PieceEncoder:
    """Model inputs for pieces of `ClipInputBuilder`'s layout, without a processor round trip per call.

    A streaming session runs small pieces (a prefix, or one frame per env) every env step, and a batch
    scoring call runs hundreds of frames, where the processor's costs (tokenizing, per-image numpy
    preprocessing on the CPU, float32 pixels sent to the device) dominate. Here:

    - tokens: `tokens(text, image_sizes)` is the processor's own output for that text and those image
      sizes (the ids depend on the sizes, not the pixels), computed once and cached; a piece of frames is
      the concatenation of its images' blocks (all special tokens, which tokenize separately).
    - pixels: `pixels(images, device)` sends resized uint8 frames to `device` (a quarter of float32's
      bytes, from pinned memory on CUDA), maps each channel value through a (channel, value) table and
      patchifies by reshapes there, all frames of a size at once. The table is read from the image
      processor's own output for a probe image that holds every value, whichever backend it runs
      (PIL or torchvision), since rescaling and normalising act on each channel value alone. A table
      lookup rounds nothing, so the result is the processor's to the bit on any device; for each frame
      size the first call is checked against the processor, and a size that differs (another processor,
      other settings) always goes through the processor.
    """

    MAX_CACHED = 1024

    def __init__(self, processor: ProcessorMixin):
        self.processor = processor
        self.image_processor = processor.image_processor
        self._tokens: dict[tuple[str, tuple[tuple[int, int], ...]], TokenBlock] = {}
        self._exact: dict[tuple[int, int], bool] = {}  # frame size -> the table path matched the processor
        self._tables: dict[torch.device, torch.Tensor] = {}  # `_table` on each device it was used on
        self.fallbacks = 0  # pixel calls that went through the image processor (after a mismatch)

    def tokens(self, text: str, image_sizes: Sequence[tuple[int, int]] = ()) -> TokenBlock:
        """The processor's tokens for `text` (IMAGE_PLACEHOLDER once per image) with images of `image_sizes`."""
        key = (text, tuple((int(h), int(w)) for h, w in image_sizes))
        block = self._tokens.get(key)
        if block is None:
            images = [np.zeros((h, w, 3), np.uint8) for h, w in key[1]]
            inputs = self.processor(text=[text], images=images or None, do_resize=False, return_tensors="pt")
            grids = inputs.get("image_grid_thw")
            block = TokenBlock(
                inputs["input_ids"][0].clone(),
                inputs["mm_token_type_ids"][0].long().clone(),
                tuple(tuple(int(x) for x in grid) for grid in grids.tolist()) if grids is not None else (),
            )
            if len(self._tokens) >= self.MAX_CACHED:
                self._tokens.clear()
            self._tokens[key] = block
        return block

    def image_tokens(self, height: int, width: int) -> TokenBlock:
        """The tokens of one image block (`<|vision_start|><|image_pad|>*n<|vision_end|>`) of a resized frame."""
        return self.tokens(IMAGE_PLACEHOLDER, ((height, width),))

    def num_image_tokens(self, height: int, width: int) -> int:
        """How many `<|image_pad|>` tokens the processor gives a resized frame of this size."""
        return int((self.image_tokens(height, width).mm_token_type_ids != 0).sum())

    def pixels(
        self, images: Sequence[np.ndarray], device: torch.device | str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values, image_grid_thw) of resized (H, W, 3) uint8 `images`, as the image processor gives them
        with do_resize=False; pixel_values on `device` (default: the CPU)."""
        device = torch.device(device or "cpu")
        by_size: dict[tuple[int, int], list[int]] = {}
        for index, image in enumerate(images):
            by_size.setdefault(image.shape[:2], []).append(index)
        if len(by_size) == 1:  # the common case: every frame one size, no reordering
            (size,) = by_size
            return self._pixels_of_size(size, np.stack(images), device)
        parts = {size: self._pixels_of_size(size, np.stack([images[i] for i in indices]), device)
                 for size, indices in by_size.items()}  # fmt: skip
        # back to the images' order: each image's rows, in turn
        values, grids, cursor = [], [], {size: 0 for size in by_size}
        for image in images:
            size = image.shape[:2]
            pixel_values, grid = parts[size]
            rows = int(grid[0].prod())
            start = cursor[size]
            values.append(pixel_values[start * rows : (start + 1) * rows])
            grids.append(grid[start])
            cursor[size] = start + 1
        return torch.cat(values), torch.stack(grids)

    def _pixels_of_size(
        self, size: tuple[int, int], frames: np.ndarray, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        exact = self._exact.get(size)
        if exact is None:
            reference = self._processor_pixels(list(frames))
            fast = self._table_pixels(frames, device)
            exact = fast is not None and all(
                a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b) for a, b in zip(fast, reference)
            )
            self._exact[size] = exact
            return (reference[0].to(device), reference[1])
        if exact:
            return self._table_pixels(frames, device)
        self.fallbacks += 1
        pixel_values, grid = self._processor_pixels(list(frames))
        return pixel_values.to(device), grid

    def _processor_pixels(self, images: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = self.image_processor(images=images, do_resize=False, return_tensors="pt")
        return inputs["pixel_values"], inputs["image_grid_thw"]

    def _table_pixels(self, frames: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The image processor's steps on (N, H, W, 3) uint8 frames, on `device`; None if they cannot apply."""
        if frames.shape[-1] != 3 or not self._patchable(*frames.shape[1:3]):
            return None
        table = self._value_table(device)
        if table is None:
            return None
        uint8 = torch.from_numpy(np.ascontiguousarray(frames))
        if device.type == "cuda":
            uint8 = uint8.pin_memory()
        uint8 = uint8.to(device, non_blocking=True)
        values = table[uint8.long() + torch.arange(3, device=device) * 256]  # (N, H, W, C) float32
        return self._patchify(values), self._grid(*frames.shape[:3])

    def _patchable(self, height: int, width: int) -> bool:
        unit = self.image_processor.patch_size * self.image_processor.merge_size
        return height % unit == 0 and width % unit == 0

    def _grid(self, count: int, height: int, width: int) -> torch.Tensor:
        patch = self.image_processor.patch_size
        return torch.tensor([1, height // patch, width // patch], dtype=torch.long).expand(count, 3).clone()

    def _patchify(self, values: torch.Tensor) -> torch.Tensor:
        """(N, H, W, C) -> (N * H/p * W/p, C * temporal * p * p) rows in the processor's order (merge
        blocks of m x m patches, each frame repeated `temporal` times)."""
        processor = self.image_processor
        patch, merge, temporal = processor.patch_size, processor.merge_size, processor.temporal_patch_size
        count, height, width, channels = values.shape
        grid_h, grid_w = height // patch, width // patch
        # (N, C, gh/m, m, p, gw/m, m, p) -> (N, gh/m, gw/m, m, m, C, temporal, p, p)
        patches = values.permute(0, 3, 1, 2).reshape(
            count, channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch
        )
        patches = patches.permute(0, 2, 5, 3, 6, 1, 4, 7).unsqueeze(6)
        patches = patches.expand(*patches.shape[:6], temporal, patch, patch)
        return patches.reshape(count * grid_h * grid_w, channels * temporal * patch * patch)

    def _value_table(self, device: torch.device) -> torch.Tensor | None:
        """(3 * 256,) float32 on `device`: the processor's value for channel c, uint8 value v at c * 256 + v;
        None where its output is not one value per (channel, value)."""
        if self._table is None:
            return None
        if device not in self._tables:
            self._tables[device] = self._table.to(device)
        return self._tables[device]

    @cached_property
    def _table(self) -> torch.Tensor | None:
        unit = self.image_processor.patch_size * self.image_processor.merge_size
        width = unit * -(-256 // unit)  # one row of merge blocks holding at least 256 pixels
        probe = (np.arange(unit * width) % 256).astype(np.uint8).reshape(1, unit, width, 1).repeat(3, axis=3)
        reference, _ = self._processor_pixels(list(probe))
        # where each output value comes from: patchify the probe's flat (pixel, channel) indices
        source = self._patchify(torch.arange(probe.size, dtype=torch.float64).reshape(probe.shape)).long()
        if reference.shape != source.shape or reference.dtype != torch.float32:
            return None
        flat = source.flatten()
        channel, value = flat % 3, torch.from_numpy(probe.reshape(-1)).long()[flat]
        table = torch.zeros(3 * 256, dtype=torch.float32)
        table[channel * 256 + value] = reference.flatten()
        # one value per (channel, value): the table must give back the processor's output
        return table if torch.equal(table[channel * 256 + value], reference.flatten()) else None
