"""Frame sampling and resizing by the qwen-vl-utils conventions, without torchvision.

Qwen-VL vision towers cut a frame into `patch_size` pixel patches and merge `merge_size` x `merge_size`
neighbouring patches into one LLM token, so frame sides must be multiples of
`factor = patch_size * merge_size`: 28 for Qwen2-VL / Qwen2.5-VL (patch 14), 32 for Qwen3-VL (patch 16).
`smart_resize` picks the nearest such size that keeps the aspect ratio and a pixel count within
[min_pixels, max_pixels]; `resize_frames` resizes with PIL bicubic as qwen-vl-utils does for images;
`sample_frame_indices` picks which frames of a longer video to keep, as qwen-vl-utils does for videos.

Every frame here is one image (its own `<|vision_start|>...<|vision_end|>` block), so the image rules
apply to clip frames too.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from vlm_rewards.interface import validate_clip

MAX_ASPECT_RATIO = 200
IMAGE_MIN_TOKENS = 4  # default pixel bounds, in merged tokens: min_pixels = 4 * factor**2
IMAGE_MAX_TOKENS = 16384
FRAME_FACTOR = 2  # sampled frame counts are multiples of this (the temporal patch size)
FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int | None = None, max_pixels: int | None = None
) -> tuple[int, int]:
    """The (height, width) closest to the input with both sides multiples of `factor`, the aspect ratio
    kept as well as possible and height * width within [min_pixels, max_pixels].

    Defaults: min_pixels = 4 * factor**2, max_pixels = 16384 * factor**2 (qwen-vl-utils' image bounds).
    """
    min_pixels = IMAGE_MIN_TOKENS * factor**2 if min_pixels is None else min_pixels
    max_pixels = IMAGE_MAX_TOKENS * factor**2 if max_pixels is None else max_pixels
    if height <= 0 or width <= 0:
        raise ValueError(f"smart_resize: expected a positive height and width, got {height}x{width}")
    if max_pixels < min_pixels:
        raise ValueError(f"smart_resize: max_pixels ({max_pixels}) must be at least min_pixels ({min_pixels})")
    aspect_ratio = max(height, width) / min(height, width)
    if aspect_ratio > MAX_ASPECT_RATIO:
        raise ValueError(
            f"aspect ratio of {height}x{width} is {aspect_ratio:.1f}; at most {MAX_ASPECT_RATIO} is allowed"
        )

    resized_height = max(factor, round(height / factor) * factor)
    resized_width = max(factor, round(width / factor) * factor)
    if resized_height * resized_width > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        resized_height = math.floor(height / scale / factor) * factor
        resized_width = math.floor(width / scale / factor) * factor
    elif resized_height * resized_width < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        resized_height = math.ceil(height * scale / factor) * factor
        resized_width = math.ceil(width * scale / factor) * factor
    if resized_height == 0 or resized_width == 0:
        raise ValueError(
            f"smart_resize: {height}x{width} cannot keep its aspect ratio within max_pixels={max_pixels} "
            f"with sides that are multiples of {factor}"
        )
    return resized_height, resized_width


def sample_frame_indices(
    total_frames: int,
    video_fps: float,
    *,
    nframes: int | None = None,
    fps: float | None = None,
    min_frames: int = FPS_MIN_FRAMES,
    max_frames: int | None = None,
) -> np.ndarray:
    """Indices of the frames to keep from a video of `total_frames` frames recorded at `video_fps`.

    Either `nframes` (rounded to a multiple of FRAME_FACTOR) or a sampling rate `fps` (default FPS),
    the count then clamped to [min_frames, max_frames] (max_frames defaults to min(FPS_MAX_FRAMES,
    total_frames)) and floored to a multiple of FRAME_FACTOR. Indices are spread evenly over the video,
    first and last frame included.
    """
    if nframes is not None and fps is not None:
        raise ValueError("sample_frame_indices: pass either nframes or fps, not both")
    if total_frames <= 0 or video_fps <= 0:
        raise ValueError(
            f"sample_frame_indices: expected positive total_frames and video_fps, got {total_frames}, {video_fps}"
        )
    if nframes is not None:
        count = round(nframes / FRAME_FACTOR) * FRAME_FACTOR
    else:
        lowest = math.ceil(min_frames / FRAME_FACTOR) * FRAME_FACTOR
        highest_allowed = min(FPS_MAX_FRAMES, total_frames) if max_frames is None else max_frames
        highest = math.floor(highest_allowed / FRAME_FACTOR) * FRAME_FACTOR
        wanted = total_frames / video_fps * (FPS if fps is None else fps)
        count = min(max(wanted, lowest), highest, total_frames)
        count = math.floor(count / FRAME_FACTOR) * FRAME_FACTOR
    if not FRAME_FACTOR <= count <= total_frames:
        raise ValueError(
            f"sample_frame_indices: {count} frames to sample from a video of {total_frames}; "
            f"expected between {FRAME_FACTOR} and {total_frames}"
        )
    # torch.linspace in float32, as the reference readers use, so rounding ties land on the same frames.
    return torch.linspace(0, total_frames - 1, count).round().long().numpy()


def resize_frames(frames: np.ndarray, height: int, width: int) -> np.ndarray:
    """(T, H, W, 3) uint8 -> (T, height, width, 3) uint8, each frame resized with PIL bicubic."""
    validate_clip(frames, "frames")
    if frames.shape[1:3] == (height, width):
        return frames
    resized = [np.asarray(Image.fromarray(frame).resize((width, height), Image.Resampling.BICUBIC)) for frame in frames]
    return np.stack(resized)


@dataclass(frozen=True)
class VisionConfig:
    """How a Qwen-VL family turns frames into vision tokens.

    Read it from a loaded processor with `VisionConfig.from_processor`, so the family decides the
    factor (28 or 32). A frame whose shorter side is below `factor` is rejected rather than upsampled:
    it holds less than one merged token of real pixels, so the model would only see invented detail.
    """

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    min_pixels: int
    max_pixels: int

    def __post_init__(self) -> None:
        if self.max_pixels < self.min_pixels:
            raise ValueError(f"VisionConfig: max_pixels ({self.max_pixels}) is below min_pixels ({self.min_pixels})")

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_processor(cls, processor: Any) -> VisionConfig:
        """From a Qwen-VL processor or its image processor."""
        image_processor = getattr(processor, "image_processor", processor)
        return cls(
            patch_size=image_processor.patch_size,
            merge_size=image_processor.merge_size,
            temporal_patch_size=image_processor.temporal_patch_size,
            min_pixels=image_processor.size["shortest_edge"],
            max_pixels=image_processor.size["longest_edge"],
        )

    def with_pixels(self, min_pixels: int | None = None, max_pixels: int | None = None) -> VisionConfig:
        """A copy with other pixel bounds; None keeps the current one."""
        return dataclasses.replace(
            self,
            min_pixels=self.min_pixels if min_pixels is None else min_pixels,
            max_pixels=self.max_pixels if max_pixels is None else max_pixels,
        )

    def frame_size(self, height: int, width: int, name: str = "frames") -> tuple[int, int]:
        """The (height, width) frames of this size are resized to; a ValueError naming `name` if the
        model cannot take them."""
        if min(height, width) < self.factor:
            raise ValueError(
                f"{name}: frames of {height}x{width} pixels; this model needs sides of at least {self.factor} "
                f"pixels (one {self.patch_size}-pixel patch merged {self.merge_size}x{self.merge_size})"
            )
        try:
            return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None

    def resize(self, frames: np.ndarray, name: str = "frames") -> np.ndarray:
        """Resize a (T, H, W, 3) uint8 clip to the size this model takes."""
        validate_clip(frames, name)
        return resize_frames(frames, *self.frame_size(frames.shape[1], frames.shape[2], name))
