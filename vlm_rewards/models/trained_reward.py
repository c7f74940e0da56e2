"""`kind: trained_rm`: a checkpoint written by `vlmr train-rm` behind the reward interface."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
import pydantic
import torch

from vlm_rewards.config import Settings
from vlm_rewards.interface import REFERENCE, BaseReward, RewardRequest, RewardResult, RewardSession, RewardSpec
from vlm_rewards.models.device import resolve_device, resolve_dtype
from vlm_rewards.models.reward_network import RewardNetwork, read_export_record
from vlm_rewards.models.streaming import KVCacheSession
from vlm_rewards.registry import register


@register("trained_rm")
class TrainedRewardModel(BaseReward):
    """A trained progress or preference RM checkpoint behind the reward interface.

    Progress RMs return per-frame progress, reward = the last frame's progress. Preference RMs return
    the scalar of the last frame; `prefer` is σ(r_a − r_b), the Bradley–Terry probability they are
    trained on.
    """

    class Params(Settings):
        model: str
        """A reward-model folder written by `vlmr train-rm`."""
        device: str = "auto"
        """auto (cuda when present, else cpu) or a torch device string."""
        dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
        """Weights' dtype; auto: bfloat16 on GPUs that support it, else float32."""
        batch_size: int = pydantic.Field(8, ge=1)
        """Requests (clips) per forward pass."""
        name: str | None = None
        """The reward's name in results, logs and reports; None: the model folder's name."""

    def __init__(self, model: RewardNetwork, version: str, name: str, batch_size: int = 8):
        self.model = model.eval()
        self.batch_size = batch_size
        progress = model.config.task == "progress"
        self.spec = RewardSpec(
            name=name,
            version=version,
            value_range=(0.0, 1.0) if progress else (-math.inf, math.inf),
            dense=progress,
            causal=progress,  # one causal pass: frame t is read before any later frame is seen
            requires=(REFERENCE,) if model.config.use_reference else (),
            frame_size=(model.builder.vision.factor, 1 << 16),
            max_frames=model.config.max_frames,
            # at least one token per character, so a longer text cannot fit the model's context
            max_text_length=model.backbone.config.get_text_config().max_position_embeddings,
        )

    @classmethod
    def from_params(cls, params: Params) -> TrainedRewardModel:
        device = resolve_device(params.device)
        model = RewardNetwork.from_pretrained(params.model, dtype=resolve_dtype(params.dtype, device)).to(device)
    # from_pretrained checked every file against reward_model.json, so its version names these weights
        version = read_export_record(params.model, verify=False)["version"]
        return cls(model, version, params.name or Path(params.model).name, params.batch_size)

    def open_session(self, texts, references=None) -> RewardSession:
        """Progress RMs stream with a KV cache: each append costs the new frames only."""
        if not self.spec.causal:
            return super().open_session(texts, references)
        return KVCacheSession(self.model, texts, references, spec=self.spec)

    @torch.inference_mode()
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        results = []
        for start in range(0, len(requests), self.batch_size):
            batch = self.model.encode(requests[start : start + self.batch_size])
            values = self.model.predict(batch).float().cpu().numpy()
            for row, mask in zip(values, batch.frame_mask.cpu().numpy()):
                per_frame = row[mask].astype(np.float64)
                progress = per_frame if self.spec.dense else None
                results.append(RewardResult(reward=float(per_frame[-1]), progress=progress))
        return results
