"""Qwen-VL reward models: a backbone plus a head read at each frame's position, in one forward pass.

- progress RM: instruction + clip of T frames -> T progress values in [0, 1] (regression or bins head).
- preference RM: prompt + image or clip -> one scalar (read at the last frame), trained Bradley–Terry.

A checkpoint is one folder that is also a loadable backbone: the backbone's config, weights and
processor, plus `reward_head.safetensors` and `reward_model.json` (task, head, input settings, version).
`VLMReward` puts a checkpoint behind the reward interface.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
import pydantic
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from vlm_rewards.fingerprint import fingerprint
from vlm_rewards.interface import BaseReward, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.io import atomic_path, write_json
from vlm_rewards.models.backbones import load_backbone
from vlm_rewards.models.heads import HeadKind, RewardHead
from vlm_rewards.models.inputs import ClipBatch, ClipInputBuilder
from vlm_rewards.registry import register

HEAD_FILE = "reward_head.safetensors"
CONFIG_FILE = "reward_model.json"
Task = Literal["progress", "preference"]


class RewardModelConfig(pydantic.BaseModel, extra="forbid"):
    task: Task = "progress"
    head: HeadKind = "regression"  # progress: regression | bins; preference: scalar
    num_bins: int = 32
    head_mlp_size: int = 256
    min_pixels: int | None = None  # None: the processor's bounds
    max_pixels: int | None = None
    max_frames: int = 32
    use_reference: bool = False  # show the request's goal/reference frames to the model

    @pydantic.model_validator(mode="after")
    def _head_fits_task(self) -> RewardModelConfig:
        allowed = {"progress": ("regression", "bins"), "preference": ("scalar",)}[self.task]
        if self.head not in allowed:
            raise ValueError(f"a {self.task} model needs a head in {allowed}, got {self.head!r}")
        return self


class VLMRewardModel(nn.Module):
    def __init__(self, backbone: nn.Module, processor, config: RewardModelConfig):
        super().__init__()
        self.backbone = backbone
        self.processor = processor
        self.config = config
        hidden_size = backbone.config.get_text_config().hidden_size
        self.head = RewardHead(hidden_size, config.head, config.num_bins, config.head_mlp_size)
        self.builder = ClipInputBuilder(
            processor, min_pixels=config.min_pixels, max_pixels=config.max_pixels, max_frames=config.max_frames
        )

    @property
    def device(self) -> torch.device:
        return self.head.mlp[0].weight.device

    def encode(self, requests: list[RewardRequest]) -> ClipBatch:
        if not self.config.use_reference:
            requests = [replace(request, reference=None) for request in requests]
        return self.builder.build(requests).to(self.device)

    def forward(self, batch: ClipBatch) -> torch.Tensor:
        """Head logits at every frame: (B, T_max[, K])."""
        hidden = self.backbone(**batch.model_inputs).last_hidden_state
        return self.head(batch.gather(hidden))

    def predict(self, batch: ClipBatch) -> torch.Tensor:
        """(B, T_max) per-frame progress (progress RM) or per-frame reward (preference RM)."""
        return self.head.predict(self(batch))

    @staticmethod
    def last_frame(values: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
        """(B, T_max) -> (B,) the value at each sample's last frame."""
        last = frame_mask.sum(1) - 1
        return values.gather(1, last.unsqueeze(1)).squeeze(1)

    @classmethod
    def from_backbone(cls, name_or_path: str | Path, config: RewardModelConfig, **load_options) -> VLMRewardModel:
        """A new reward model on a pretrained (or tiny random) backbone; the head starts random."""
        backbone, processor = load_backbone(name_or_path, **load_options)
        return cls(backbone, processor, config)

    @classmethod
    def from_pretrained(cls, path: str | Path, **load_options) -> VLMRewardModel:
        path = Path(path)
        for required in (CONFIG_FILE, HEAD_FILE):
            if not (path / required).is_file():
                raise ValueError(f"{path}: no {required}; expected a reward-model folder saved by save_pretrained")
        try:
            config = RewardModelConfig.model_validate(json.loads((path / CONFIG_FILE).read_text()).get("config"))
        except (json.JSONDecodeError, pydantic.ValidationError) as error:
            raise ValueError(f"{path / CONFIG_FILE}: not a valid reward-model config ({error})") from None
        model = cls.from_backbone(path, config, **load_options)
        try:
            model.head.load_state_dict(load_file(path / HEAD_FILE))
        except (RuntimeError, OSError) as error:
            raise ValueError(f"{path / HEAD_FILE}: could not load the reward head ({error})") from None
        return model

    def save_pretrained(self, path: str | Path, extra: dict | None = None) -> str:
        """Write backbone, processor, head and config; returns the version fingerprint it recorded."""
        path = Path(path)
        backbone = self.backbone
        if hasattr(backbone, "merge_and_unload"):  # LoRA: save plain merged weights, keep training intact
            backbone = copy.deepcopy(backbone).merge_and_unload()
        backbone.save_pretrained(path)
        self.processor.save_pretrained(path)
        head_state = {
            name: tensor.detach().float().cpu().contiguous() for name, tensor in self.head.state_dict().items()
        }
        with atomic_path(path / HEAD_FILE) as temporary:
            save_file(head_state, str(temporary))
        version = fingerprint(
            self.config.model_dump(), [float(t.sum()) for t in head_state.values()], (extra or {}).get("step")
        )
        write_json(path / CONFIG_FILE, {"config": self.config.model_dump(), "version": version, **(extra or {})})
        return version


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, dtype)


@register("vlm_reward_model")
class VLMReward(BaseReward):
    """A trained progress or preference RM checkpoint behind the reward interface.

    Progress RMs return per-frame progress, reward = the last frame's progress. Preference RMs return
    the scalar of the last frame; `prefer` is σ(r_a − r_b), the Bradley–Terry probability they are
    trained on.
    """

    class Params(pydantic.BaseModel, extra="forbid"):
        model: str  # a reward-model folder written by `vlmr train-rm`
        device: str = "auto"
        dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
        batch_size: int = pydantic.Field(8, ge=1)
        name: str | None = None

    def __init__(self, model: VLMRewardModel, version: str, name: str, batch_size: int = 8):
        self.model = model.eval()
        self.batch_size = batch_size
        config = model.config
        self.spec = RewardSpec(
            name=name,
            version=version,
            output=config.task,
            value_range=(0.0, 1.0) if config.task == "progress" else (-float("inf"), float("inf")),
            frame_size=(model.builder.vision.factor, 1 << 16),
            max_frames=config.max_frames,
        )

    @classmethod
    def from_params(cls, params: Params) -> VLMReward:
        device = resolve_device(params.device)
        model = VLMRewardModel.from_pretrained(params.model, dtype=resolve_dtype(params.dtype, device)).to(device)
        version = json.loads((Path(params.model) / CONFIG_FILE).read_text())["version"]
        return cls(model, version, params.name or Path(params.model).name, params.batch_size)

    @torch.inference_mode()
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        results = []
        for start in range(0, len(requests), self.batch_size):
            batch = self.model.encode(requests[start : start + self.batch_size])
            values = self.model.predict(batch).float().cpu().numpy()
            for row, mask in zip(values, batch.frame_mask.cpu().numpy()):
                per_frame = row[mask].astype(np.float64)
                progress = per_frame if self.model.config.task == "progress" else None
                results.append(RewardResult(reward=float(per_frame[-1]), progress=progress))
        return results
