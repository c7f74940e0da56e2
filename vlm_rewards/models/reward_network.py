"""Qwen-VL reward models: a backbone plus a head read at each frame's position, in one forward pass.

- progress RM: instruction + clip of T frames -> T progress values in [0, 1] (regression or bins head),
  with optional success and stage heads read at the same positions (`config.success_head`, `num_stages`).
- preference RM: prompt + image or clip -> one scalar (read at the last frame), trained Bradley–Terry.

A checkpoint is one folder that is also a loadable backbone: the backbone's config, weights and
processor, plus `reward_head.safetensors` and `reward_model.json` (task, head, input settings, version).
`vlm_rewards.models.trained_reward.TrainedRewardModel` puts a checkpoint behind the reward interface.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pydantic
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling

from vlm_rewards.fingerprint import changed_files, fingerprint, fingerprint_files
from vlm_rewards.interface import RewardRequest
from vlm_rewards.io import atomic_folder, make_readable, write_json
from vlm_rewards.models.backbones import load_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.fast_vision import fast_vision
from vlm_rewards.models.heads import FrameLogits, RewardHead
from vlm_rewards.models.inputs import ClipBatch, ClipInputBuilder

HEAD_FILE = "reward_head.safetensors"
CONFIG_FILE = "reward_model.json"


class RewardNetwork(nn.Module):
    def __init__(self, backbone: nn.Module, processor, config: RewardNetworkConfig):
        super().__init__()
        self.backbone = backbone
        self.processor = processor
        self.config = config
        hidden_size = backbone.config.get_text_config().hidden_size
        self.head = RewardHead(
            hidden_size,
            config.head,
            config.num_bins,
            config.head_mlp_size,
            config.success_head,
            config.num_stages,
            config.goal_offset_head,
        )
        self.builder = ClipInputBuilder(
            processor, min_pixels=config.min_pixels, max_pixels=config.max_pixels, max_frames=config.max_frames
        )

    @property
    def device(self) -> torch.device:
        return self.head.mlp[0].weight.device

    def encode(self, requests: list[RewardRequest]) -> ClipBatch:
        if not self.config.use_reference:
            requests = [replace(request, reference=None) for request in requests]
        return self.builder.build(requests, device=self.device).to(self.device)

    def forward(self, batch: ClipBatch) -> FrameLogits:
        """Every head's logits at every frame, from one backbone forward: progress (B, T_max[, K]), and
        success (B, T_max) and stage (B, T_max, S) when the model has those heads."""
        hidden = self.backbone(**self.backbone_inputs(batch)).last_hidden_state
        return self.head.frame_logits(batch.gather(hidden))

    def backbone_inputs(self, batch: ClipBatch) -> dict:
        """The batch's model inputs, with the images' features from the batched vision path in place of their
        pixels where it applies (`fast_vision`: Qwen2.5-VL, no gradient into the tower)."""
        inputs = batch.model_inputs
        vision = fast_vision(self.backbone) if "pixel_values" in inputs else None
        features = None if vision is None else vision(inputs["pixel_values"], inputs["image_grid_thw"])
        if features is None:
            return inputs
        encoded = BaseModelOutputWithPooling(pooler_output=(features,))
        return {**{k: v for k, v in inputs.items() if k != "pixel_values"}, "mm_encoder_outputs": {"image": encoded}}

    def predict(self, batch: ClipBatch) -> torch.Tensor:
        """(B, T_max) per-frame progress (progress RM) or per-frame reward (preference RM)."""
        return self.head.predict(self(batch).progress)

    def predict_all(self, batch: ClipBatch) -> dict[str, torch.Tensor]:
        """One forward: "progress" (B, T_max), and "success" (B, T_max) probabilities and "stage" (B, T_max, S)
        stage probabilities when the model has those heads."""
        logits = self(batch)
        outputs = {"progress": self.head.predict(logits.progress)}
        if logits.success is not None:
            outputs["success"] = logits.success.sigmoid()
        if logits.stage is not None:
            outputs["stage"] = logits.stage.softmax(-1)
        return outputs

    @staticmethod
    def last_frame(values: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
        """(B, T_max) -> (B,) the value at each sample's last frame."""
        last = frame_mask.sum(1) - 1
        return values.gather(1, last.unsqueeze(1)).squeeze(1)

    @classmethod
    def from_backbone(cls, name_or_path: str | Path, config: RewardNetworkConfig, **load_options) -> RewardNetwork:
        """A new reward model on a pretrained (or tiny random) backbone; the head starts random."""
        backbone, processor = load_backbone(name_or_path, **load_options)
        return cls(backbone, processor, config)

    @classmethod
    def from_pretrained(cls, path: str | Path, **load_options) -> RewardNetwork:
        """Load a folder written by `save_pretrained`, after checking every file against its recorded hash."""
        path = Path(path)
        record = read_export_record(path)
        config = RewardNetworkConfig.model_validate(record["config"])
        model = cls.from_backbone(path, config, **load_options)
        try:
            model.head.load_state_dict(load_file(path / HEAD_FILE))
        except (RuntimeError, OSError, SafetensorError) as error:
            raise ValueError(f"{path / HEAD_FILE}: could not load the reward head ({error})") from None
        return model

    def save_pretrained(self, path: str | Path, extra: dict | None = None) -> str:
        """Write backbone, processor, head and `reward_model.json`; returns the version it recorded.

        The folder is written whole into a hidden temporary folder next to `path` and renamed into
        place (an existing export is replaced only once the new one is complete), so a crash never
        leaves files of two exports mixed. The version hashes every file that changes outputs:
        weights (backbone and head), processor and tokenizer files, and the reward config;
        `reward_model.json` records it with each file's sha256, and loading checks them.
        """
        path = Path(path)
        extra = dict(extra or {})
        reserved = {"config", "version", "files"} & extra.keys()
        if reserved:
            raise ValueError(f"save_pretrained: extra may not set {sorted(reserved)}")
        with atomic_folder(path, replace=True) as temporary:
            backbone = self.backbone
            if hasattr(backbone, "merge_and_unload"):  # LoRA: save plain merged weights, keep training intact
                backbone = copy.deepcopy(backbone).merge_and_unload()
            backbone.save_pretrained(temporary)
            self.processor.save_pretrained(temporary)
            head_state = {
                name: tensor.detach().float().cpu().contiguous() for name, tensor in self.head.state_dict().items()
            }
            save_file(head_state, str(temporary / HEAD_FILE))
            make_readable(temporary)
            files = fingerprint_files(temporary, exclude=(CONFIG_FILE,))
            config = self.config.model_dump(mode="json")
            version = export_version(config, files)
            write_json(temporary / CONFIG_FILE, {**extra, "config": config, "version": version, "files": files})
        return version


def export_version(config: dict, files: dict[str, str]) -> str:
    """The version of an export: a hash of the reward config and of every file's sha256."""
    return fingerprint("reward-model-export/v2", config, sorted(files.items()))


def read_export_record(path: str | Path, verify: bool = True) -> dict:
    """The checked contents of `path/reward_model.json`: a valid config, the version, per-file hashes.

    With `verify`, every file of the folder is hashed and compared with the record: a changed,
    missing or unrecorded file is a ValueError naming it.
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: no such reward-model folder")
    for required in (CONFIG_FILE, HEAD_FILE):
        if not (path / required).is_file():
            raise ValueError(f"{path}: no {required}; expected a reward-model folder saved by save_pretrained")
    config_path = path / CONFIG_FILE
    try:
        record = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_path}: not a valid reward-model config ({error})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{config_path}: not a valid reward-model config (expected a JSON object)")
    try:
        RewardNetworkConfig.model_validate(record.get("config"))
    except pydantic.ValidationError as error:
        raise ValueError(f"{config_path}: not a valid reward-model config ({error})") from None
    version, files = record.get("version"), record.get("files")
    if not isinstance(version, str) or not version:
        raise ValueError(f"{config_path}: no version; re-export the model with save_pretrained")
    if not isinstance(files, dict) or not files or not all(isinstance(v, str) for v in files.values()):
        raise ValueError(
            f"{config_path}: no per-file hashes ('files'), so its version cannot be checked; "
            "re-export the model with this version of vlm-rewards"
        )
    # the config as recorded: an export from before a setting existed keeps its version
    if export_version(record["config"], files) != version:
        raise ValueError(f"{config_path}: version {version!r} does not match its config and file hashes")
    if verify:
        changes = changed_files(files, fingerprint_files(path, exclude=(CONFIG_FILE,)))
        if changes:
            raise ValueError(
                f"{path}: files differ from those recorded at export (version {version}): {', '.join(changes)}"
            )
    return record
