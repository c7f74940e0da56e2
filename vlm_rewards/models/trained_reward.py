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

    Progress RMs return per-frame progress, reward = the last frame's progress. With a success head, the
    `success` component is P(the task is done) at the last frame and `info["success_per_frame"]` has it
    at every frame; with a stage head, the `stage` component is the most likely stage at the last frame
    and `info["stage_per_frame"]` the one at every frame (all from the same forward pass). Preference
    RMs return the scalar of the last frame; `prefer` is σ(r_a − r_b), the Bradley–Terry probability
    they are trained on.
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
        components = ("success",) * model.config.success_head + ("stage",) * bool(model.config.num_stages)
        self.spec = RewardSpec(
            name=name,
            version=version,
            value_range=(0.0, 1.0) if progress else (-math.inf, math.inf),
            dense=progress,
            causal=progress,  # one causal pass: frame t is read before any later frame is seen
            requires=(REFERENCE,) if model.config.use_reference else (),
            components=components,
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
            outputs = {name: values.float().cpu().numpy() for name, values in self.model.predict_all(batch).items()}
            for row, mask in enumerate(batch.frame_mask.cpu().numpy()):
                per_frame = {name: values[row][mask].astype(np.float64) for name, values in outputs.items()}
                results.append(frame_result(per_frame, self.spec.dense))
        return results


def frame_result(per_frame: dict[str, np.ndarray], dense: bool) -> RewardResult:
    """A result from one clip's per-frame outputs ("progress", and "success" / "stage" probabilities)."""
    components, info = {}, {}
    if "success" in per_frame:
        components["success"] = float(per_frame["success"][-1])
        info["success_per_frame"] = per_frame["success"].tolist()
    if "stage" in per_frame:
        stages = per_frame["stage"].argmax(-1)
        components["stage"] = float(stages[-1])
        info["stage_per_frame"] = stages.tolist()
    progress = per_frame["progress"]
    return RewardResult(
        reward=float(progress[-1]), progress=progress if dense else None, components=components, info=info
    )
