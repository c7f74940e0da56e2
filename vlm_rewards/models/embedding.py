"""Goal–baseline embedding reward with a CLIP or SigLIP dual encoder (VLM-RMs, arXiv:2310.12921).

x is the L2-normalised image embedding of a frame, g the mean of the normalised text embeddings of the
goal prompts (the request's text plus any extra goal prompts), b the same for the baseline prompts
("a robot arm"). With d = (g − b)/‖g − b‖ and P = α d dᵀ + (1 − α) I,

    r = 1 − ½ ‖(x − g) P‖²

α = 0 gives 1 − ½‖x − g‖², the cosine similarity when ‖g‖ = 1; α = 1 keeps only the component along
the baseline→goal direction, discarding variation unrelated to the task (background, arm pose).

Range: P has eigenvalues 1 and 1 − α, so ‖(x − g)P‖ ≤ ‖x − g‖ ≤ ‖x‖ + ‖g‖ ≤ 2 (x is unit, g a mean of
unit vectors), hence r ∈ [−1, 1], with r = 1 at x = g.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import numpy as np
import pydantic
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoProcessor, PreTrainedModel, ProcessorMixin

from vlm_rewards.config import Settings
from vlm_rewards.fingerprint import fingerprint, weights_fingerprint
from vlm_rewards.interface import BaseReward, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.models.hub import resolve_checkpoint
from vlm_rewards.registry import register

Prompt = Annotated[str, pydantic.Field(min_length=1)]
DType = Literal["float32", "float16", "bfloat16"]
TEXT_CACHE_SIZE = 10_000  # request texts kept; bounded so that GRPO runs over many prompts do not grow


def goal_baseline_reward(images: np.ndarray, goal: np.ndarray, baseline: np.ndarray, alpha: float) -> np.ndarray:
    """r = 1 − ½‖(x − g)P‖² for each row x of `images` (N, D); goal and baseline are (D,) vectors."""
    offset = images - goal
    if alpha == 0.0:  # the baseline plays no part, so it may coincide with the goal
        return 1.0 - 0.5 * np.sum(offset**2, axis=-1)
    direction = goal - baseline
    norm = float(np.linalg.norm(direction))
    if norm < 1e-8:
        raise ValueError(
            f"goal and baseline embeddings coincide (‖g − b‖ = {norm:.1e}), so the baseline direction is "
            "undefined for alpha > 0; use baseline prompts that differ from the goal"
        )
    direction = direction / norm
    # (x − g)P = α ((x − g)·d) d + (1 − α)(x − g), without forming the D×D matrix.
    projected = alpha * (offset @ direction)[:, None] * direction + (1.0 - alpha) * offset
    return 1.0 - 0.5 * np.sum(projected**2, axis=-1)


def load_dual_encoder(model: str, device: str, dtype: DType) -> tuple[PreTrainedModel, ProcessorMixin]:
    """A CLIP/SigLIP model and its processor from a hub id or a saved folder, in eval mode on `device`."""
    model = resolve_checkpoint(model, "embedding_goal: a hub id or a folder holding a CLIP or SigLIP model")
    try:
        encoder = AutoModel.from_pretrained(model, dtype=getattr(torch, dtype))
        processor = AutoProcessor.from_pretrained(model)
    except Exception as error:  # OSError, ValueError, JSONDecodeError, SafetensorError, ...
        raise ValueError(
            f"embedding_goal: could not load {model!r}; expected a hub id or a folder holding a CLIP or SigLIP "
            f"model (config.json, weights) and its processor (tokenizer + image processor files): {error}"
        ) from error
    if not (hasattr(encoder, "get_image_features") and hasattr(encoder, "get_text_features")):
        raise ValueError(
            f"embedding_goal: {model!r} is a {type(encoder).__name__}; expected a dual encoder with image and "
            "text towers (CLIPModel, SiglipModel)"
        )
    return encoder.to(device).eval(), processor


@register("embedding_goal")
class EmbeddingGoalReward(BaseReward):
    """Per-frame goal–baseline reward from CLIP/SigLIP embeddings (see the module docstring).

    progress: r for every frame of the clip; reward: r of the last frame; info["goal_similarity"]: the
    cosine similarity of the last frame to the goal. Reference frames and extra views are not used.
    """

    class Params(Settings):
        name: str = "embedding_goal"
        """The reward's name in results, logs and reports."""
        model: str = pydantic.Field(min_length=1)
        """Hub id or folder of a CLIP or SigLIP dual encoder with its processor."""
        baseline_prompts: list[Prompt] = pydantic.Field(min_length=1)
        """Texts of the scene without the goal achieved: the baseline b of goal-baseline regularisation."""
        goal_prompts: list[Prompt] = []
        """Extra goal texts, averaged with the request's own text into the goal embedding g."""
        alpha: float = pydantic.Field(0.5, ge=0.0, le=1.0)
        """Projection onto the baseline-to-goal direction: 0 is the plain cosine to g, 1 the full projection."""
        batch_size: int = pydantic.Field(32, gt=0)
        """Frames per image-tower forward pass."""
        device: str = "cpu"
        """auto (cuda when present, else cpu) or a torch device string."""
        dtype: DType = "float32"
        """Weights' dtype."""

    def __init__(
        self,
        model: str,
        baseline_prompts: Sequence[str],
        goal_prompts: Sequence[str] = (),
        alpha: float = 0.5,
        batch_size: int = 32,
        device: str = "cpu",
        dtype: DType = "float32",
        name: str = "embedding_goal",
    ):
        if not baseline_prompts:
            raise ValueError(f"{name}: expected at least one baseline prompt (e.g. 'a robot arm'), got none")
        self.alpha, self.batch_size, self.device = alpha, batch_size, torch.device(device)
        self.goal_prompts = list(goal_prompts)
        self.encoder, self.processor = load_dual_encoder(model, device, dtype)
        # SigLIP was trained on max_length-padded text and pools the last token, so padding changes g.
        self.padding: bool | str = "max_length" if "siglip" in self.encoder.config.model_type else True
        self._text_cache: dict[str, np.ndarray] = {}
        self.baseline = self.embed_texts(list(baseline_prompts)).mean(axis=0)
        self.spec = RewardSpec(
            name=name,
            version=fingerprint(
                "embedding_goal",
                weights_fingerprint(model, getattr(self.encoder.config, "_commit_hash", None)),
                alpha,
                list(baseline_prompts),
                self.goal_prompts,
            ),
            value_range=(-1.0, 1.0),
            dense=True,
            causal=True,  # every frame is embedded on its own
            frame_size=None,  # the processor resizes any frame to the model's input size
        )

    @classmethod
    def from_params(cls, params: Params) -> EmbeddingGoalReward:
        return cls(
            params.model,
            params.baseline_prompts,
            goal_prompts=params.goal_prompts,
            alpha=params.alpha,
            batch_size=params.batch_size,
            device=params.device,
            dtype=params.dtype,
            name=params.name,
        )

    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        images = self.embed_images([frame for request in requests for frame in request.frames])
        goals = self.goal_embeddings([request.text for request in requests])
        results, start = [], 0
        for index, request in enumerate(requests):
            frames = images[start : start + request.num_frames]
            start += request.num_frames
            try:
                progress = goal_baseline_reward(frames, goals[index], self.baseline, self.alpha)
            except ValueError as error:
                raise ValueError(f"requests[{index}].text {request.text!r}: {error}") from None
            similarity = float(frames[-1] @ goals[index] / np.linalg.norm(goals[index]))
            results.append(
                RewardResult(reward=float(progress[-1]), progress=progress, info={"goal_similarity": similarity})
            )
        return results

    def embed_images(self, frames: list[np.ndarray]) -> np.ndarray:
        """(N, D) float64 unit-norm embeddings of N (H, W, 3) uint8 frames, `batch_size` at a time."""
        chunks = [self._encode_images(frames[i : i + self.batch_size]) for i in range(0, len(frames), self.batch_size)]
        return np.concatenate(chunks)

    def goal_embeddings(self, texts: list[str]) -> np.ndarray:
        """(N, D) goal vectors g: the mean embedding of each text together with the extra goal prompts."""
        prompts = [prompt for text in texts for prompt in (text, *self.goal_prompts)]
        return self.embed_texts(prompts).reshape(len(texts), 1 + len(self.goal_prompts), -1).mean(axis=1)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """(N, D) float64 unit-norm text embeddings, encoding only texts not seen recently."""
        missing = [text for text in dict.fromkeys(texts) if text not in self._text_cache]
        for i in range(0, len(missing), self.batch_size):
            chunk = missing[i : i + self.batch_size]
            self._text_cache.update(zip(chunk, self._encode_texts(chunk)))
        embeddings = np.stack([self._text_cache[text] for text in texts])
        while len(self._text_cache) > TEXT_CACHE_SIZE:
            del self._text_cache[next(iter(self._text_cache))]  # oldest first
        return embeddings

    @torch.inference_mode()
    def _encode_images(self, frames: list[np.ndarray]) -> np.ndarray:
        inputs = self.processor(images=frames, input_data_format="channels_last", return_tensors="pt")
        inputs = {key: self._to_device(value) for key, value in inputs.items()}
        return _normalized(self.encoder.get_image_features(**inputs).pooler_output)

    @torch.inference_mode()
    def _encode_texts(self, texts: list[str]) -> np.ndarray:
        inputs = self.processor(text=texts, padding=self.padding, truncation=True, return_tensors="pt")
        inputs = {key: self._to_device(value) for key, value in inputs.items()}
        return _normalized(self.encoder.get_text_features(**inputs).pooler_output)

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_floating_point():
            return tensor.to(self.device, self.encoder.dtype)
        return tensor.to(self.device)


def _normalized(features: torch.Tensor) -> np.ndarray:
    return F.normalize(features.double(), dim=-1).cpu().numpy()
