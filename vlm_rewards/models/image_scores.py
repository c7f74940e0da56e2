"""Published image reward models on a CLIP dual encoder, loaded from their released checkpoints.

Every frame is scored on its own (an image is a clip of T = 1): progress[t] is frame t's score,
reward the last frame's. The formulas, each ported by hand from the file named:

- `pickscore` (PickScore, yuvalkirstain/PickScore_v1; README of yuvalkirstain/PickScore):
  s = logit_scale.exp() · cos(text, image). `prefer` is σ(s_a − s_b): PickScore's softmax over two
  candidates for one prompt.
- `clip_score` (CLIPScore, Hessel et al. 2021, arXiv:2104.08718, eq. 1): s = w · max(cos(text, image), 0),
  w = 2.5, on OpenAI CLIP ViT-B/32.
- `hpsv2` (HPSv2, tgxs002/HPSv2 score.py): s = cos(text, image) of open_clip ViT-H-14 fine-tuned on
  human preferences. Its checkpoint is an open_clip state dict (`{"state_dict": ...}` in a .pt);
  open_clip needs torchvision, which this project does not install, so `openclip_to_clip` maps its
  keys onto an equivalent transformers `CLIPModel`.
- `aesthetic` (LAION improved-aesthetic-predictor, christophschuhmann/improved-aesthetic-predictor
  simple_inference.py): s = MLP(x / ‖x‖), x the CLIP ViT-L/14 image embedding; the text is not used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pydantic
import torch
import torch.nn.functional as F
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import LocalEntryNotFoundError
from torch import nn
from transformers import CLIPConfig, CLIPModel, CLIPProcessor

from vlm_rewards.config import Settings
from vlm_rewards.fingerprint import fingerprint, sha256_file, weights_fingerprint
from vlm_rewards.interface import BaseReward, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.models.device import resolve_device
from vlm_rewards.models.hub import hub_offline, hub_reachable, resolve_checkpoint
from vlm_rewards.registry import register

DType = Literal["float32", "float16", "bfloat16"]
CLIP_SCORE_WEIGHT = 2.5  # w of CLIPScore (Hessel et al. 2021)
# open_clip's ViT-H-14 (open_clip/model_configs/ViT-H-14.json), the tower HPSv2 fine-tunes.
VIT_H_14 = {
    "embed_dim": 1024,
    "vision_cfg": {"image_size": 224, "layers": 32, "width": 1280, "head_width": 80, "patch_size": 14},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 1024, "heads": 16, "layers": 24},
}


def resolve_checkpoint_file(reference: str, expected: str) -> Path:
    """A local file, or `org/name/path/in/repo` on the hub (from the cache, or downloaded when online)."""
    path = Path(reference).expanduser()
    if path.is_file():
        return path
    parts = reference.split("/")
    if path.is_absolute() or reference.startswith((".", "~")) or len(parts) < 3:
        raise ValueError(
            f"{reference}: no such file, and not a hub file of the form org/name/file; expected {expected}"
        )
    repo_id, filename = "/".join(parts[:2]), "/".join(parts[2:])
    try:
        return Path(hf_hub_download(repo_id, filename, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if hub_offline() or not hub_reachable():
        raise ValueError(
            f"{reference}: a hub file, but this machine is offline and the Hugging Face cache does not hold it "
            f"({expected}). Download it where there is network (`hf download {repo_id} {filename} --local-dir DIR`), "
            "copy it here and name the local file in the config instead."
        )
    return Path(hf_hub_download(repo_id, filename))


def load_clip_processor(name: str, kind: str) -> CLIPProcessor:
    folder = resolve_checkpoint(name, f"{kind}: a hub id or folder with a CLIP tokenizer and image processor")
    try:
        return CLIPProcessor.from_pretrained(folder)
    except Exception as error:  # OSError, ValueError, JSONDecodeError, ...
        raise ValueError(f"{kind}: could not load a CLIP processor from {name!r}: {error}") from error


def load_clip(name: str, processor: str | None, kind: str, dtype: DType) -> tuple[CLIPModel, CLIPProcessor, str]:
    """A transformers CLIPModel, its processor (from `processor`, else from the model's folder) and what
    identifies its weights (`weights_fingerprint`)."""
    folder = resolve_checkpoint(name, f"{kind}: a hub id or folder with a transformers CLIPModel")
    try:
        clip = CLIPModel.from_pretrained(folder, dtype=getattr(torch, dtype))
    except Exception as error:  # OSError, ValueError, SafetensorError, ...
        raise ValueError(
            f"{kind}: could not load a CLIPModel from {name!r}; expected config.json and weights of a "
            f"transformers CLIP checkpoint: {error}"
        ) from error
    weights = weights_fingerprint(name, getattr(clip.config, "_commit_hash", None))
    return clip, load_clip_processor(processor or name, kind), weights


def clip_image_features(
    clip: CLIPModel, processor: CLIPProcessor, frames: list[np.ndarray], batch_size: int
) -> torch.Tensor:
    """(N, D) projected image embeddings (not normalised, float32) of N (H, W, 3) uint8 frames, `batch_size`
    frames per forward pass."""
    features = []
    for start in range(0, len(frames), batch_size):
        inputs = processor(
            images=frames[start : start + batch_size], input_data_format="channels_last", return_tensors="pt"
        )
        pixels = inputs["pixel_values"].to(clip.device, clip.dtype)
        features.append(clip.get_image_features(pixel_values=pixels).pooler_output.float())
    return torch.cat(features)


def clip_text_features(clip: CLIPModel, processor: CLIPProcessor, texts: list[str]) -> torch.Tensor:
    """(N, D) projected text embeddings (not normalised, float32) of N texts."""
    inputs = processor(text=texts, padding=True, truncation=True, return_tensors="pt").to(clip.device)
    return clip.get_text_features(**inputs).pooler_output.float()


class ImageScoreParams(Settings):
    name: str
    """The reward's name in results, logs and reports."""
    model: str = pydantic.Field(min_length=1)
    """Hub id or folder of the CLIP model (the published checkpoint)."""
    processor: str | None = None
    """Hub id or folder of its tokenizer and image processor; None: the `model` folder holds them."""
    batch_size: int = pydantic.Field(32, gt=0)
    """Frames per image-tower forward pass."""
    device: str = "cpu"
    """auto (cuda when present, else cpu) or a torch device string."""
    dtype: DType = "float32"
    """Weights' dtype."""


class ImageScore(BaseReward):
    """Per-frame score of a CLIP model (see the module docstring); subclasses give `frame_scores`."""

    text_conditioned = True  # the aesthetic predictor ignores the text
    value_range = (-math.inf, math.inf)  # bounds of one frame's score (PickScore's depend on its weights)

    def __init__(self, clip: CLIPModel, processor: CLIPProcessor, params: ImageScoreParams, weights: object):
        """`weights`: what identifies the checkpoint files, folded into the version."""
        self.params = params
        self.device = resolve_device(params.device)
        self.clip = clip.to(self.device).eval()
        self.processor = processor
        self.spec = RewardSpec(
            name=params.name,
            version=fingerprint(
                type(self).__name__, params.model_dump(exclude={"device", "batch_size", "name"}), weights
            ),
            value_range=self.score_range(),
            dense=True,
            causal=True,  # every frame is scored on its own
            frame_size=None,  # the processor resizes any frame to the model's input size
        )

    @classmethod
    def from_params(cls, params: ImageScoreParams) -> ImageScore:
        """The kind's published weights as a transformers CLIPModel (PickScore, CLIPScore)."""
        clip, processor, weights = load_clip(params.model, params.processor, params.name, params.dtype)
        return cls(clip, processor, params, weights)

    def score_range(self) -> tuple[float, float]:
        return self.value_range

    @torch.inference_mode()
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        frames = [frame for request in requests for frame in request.frames]
        owners = [i for i, request in enumerate(requests) for _ in range(request.num_frames)]
        images = clip_image_features(self.clip, self.processor, frames, self.params.batch_size)
        texts = None
        if self.text_conditioned:
            texts = clip_text_features(self.clip, self.processor, [request.text for request in requests])[owners]
        scores = self.frame_scores(images, texts).double().cpu().numpy()
        results, start = [], 0
        for request in requests:
            progress = scores[start : start + request.num_frames]
            start += request.num_frames
            results.append(RewardResult(reward=float(progress[-1]), progress=progress))
        return results

    def frame_scores(self, images: torch.Tensor, texts: torch.Tensor | None) -> torch.Tensor:
        """(N,) scores of N image embeddings (unnormalised, float32) with the texts' embeddings."""
        raise NotImplementedError


def cosine(images: torch.Tensor, texts: torch.Tensor) -> torch.Tensor:
    return (F.normalize(images, dim=-1) * F.normalize(texts, dim=-1)).sum(-1)


@register("pickscore")
class PickScore(ImageScore):
    """PickScore: logit_scale.exp() · cos(text, image); range ±logit_scale.exp() (100 for PickScore_v1)."""

    class Params(ImageScoreParams):
        name: str = "pickscore"
        """The reward's name in results, logs and reports."""

    def score_range(self) -> tuple[float, float]:
        scale = float(self.clip.logit_scale.detach().exp())
        return -scale, scale

    def frame_scores(self, images: torch.Tensor, texts: torch.Tensor | None) -> torch.Tensor:
        return self.clip.logit_scale.exp().float() * cosine(images, texts)


@register("clip_score")
class CLIPScore(ImageScore):
    """CLIPScore: w · max(cos(text, image), 0) with w = 2.5; range [0, 2.5]."""

    value_range = (0.0, CLIP_SCORE_WEIGHT)

    class Params(ImageScoreParams):
        name: str = "clip_score"
        """The reward's name in results, logs and reports."""

    def frame_scores(self, images: torch.Tensor, texts: torch.Tensor | None) -> torch.Tensor:
        return CLIP_SCORE_WEIGHT * cosine(images, texts).clamp(min=0.0)


def openclip_clip_config(architecture: Mapping[str, Any], tokenizer) -> CLIPConfig:
    """The transformers CLIPConfig of an open_clip model config (the JSON of open_clip/model_configs)."""
    vision, text = architecture["vision_cfg"], architecture["text_cfg"]
    act = "quick_gelu" if architecture.get("quick_gelu") else "gelu"
    return CLIPConfig(
        text_config=dict(
            vocab_size=text["vocab_size"],
            hidden_size=text["width"],
            intermediate_size=int(text["width"] * text.get("mlp_ratio", 4.0)),
            num_hidden_layers=text["layers"],
            num_attention_heads=text["heads"],
            max_position_embeddings=text["context_length"],
            hidden_act=act,
            # open_clip pools the highest token id, the end-of-text token of the CLIP vocabulary.
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ),
        vision_config=dict(
            hidden_size=vision["width"],
            intermediate_size=int(vision["width"] * vision.get("mlp_ratio", 4.0)),
            num_hidden_layers=vision["layers"],
            num_attention_heads=vision["width"] // vision.get("head_width", 64),
            image_size=vision["image_size"],
            patch_size=vision["patch_size"],
            hidden_act=act,
        ),
        projection_dim=architecture["embed_dim"],
    )


_BLOCK_KEYS = {
    "ln_1": "layer_norm1",
    "ln_2": "layer_norm2",
    "mlp.c_fc": "mlp.fc1",
    "mlp.c_proj": "mlp.fc2",
    "attn.out_proj": "self_attn.out_proj",
}
_TOWER_KEYS = {
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "logit_scale": "logit_scale",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
}
_PROJECTIONS = {"text_projection": "text_projection.weight", "visual.proj": "visual_projection.weight"}
_UNUSED_KEYS = {"attn_mask", "visual.attn_mask"}  # open_clip's causal-mask buffer in older checkpoints


def openclip_to_clip(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An open_clip CLIP state dict (ViT image tower, default text tower) as transformers CLIPModel keys.

    Followed: open_clip's model.py (CLIP, _build_text_tower) and transformer.py (ResidualAttentionBlock
    on nn.MultiheadAttention, whose packed in_proj is split into q, k, v); projections are stored
    (width, embed_dim) and applied as x @ proj, transformers' Linear weights are their transpose.
    """
    mapped, unknown = {}, []
    for key, value in state_dict.items():
        key = key.removeprefix("module.")  # checkpoints saved from DistributedDataParallel
        if key in _UNUSED_KEYS:
            continue
        if key in _TOWER_KEYS:
            mapped[_TOWER_KEYS[key]] = value
        elif key in _PROJECTIONS:
            mapped[_PROJECTIONS[key]] = value.t().contiguous()
        elif ".resblocks." in key:
            mapped.update(_map_block_key(key, value))
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"open_clip state dict: unexpected keys {unknown[:5]}; expected a ViT CLIP (open_clip layout)")
    return mapped


def _map_block_key(key: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    tower, rest = key.split("transformer.resblocks.")
    layer, name = rest.split(".", 1)
    prefix = f"{'vision_model' if tower == 'visual.' else 'text_model'}.encoder.layers.{layer}."
    if name.startswith("attn.in_proj_"):
        kind = name.removeprefix("attn.in_proj_")  # weight or bias, q, k, v stacked on dim 0
        return {f"{prefix}self_attn.{p}_proj.{kind}": part for p, part in zip("qkv", value.chunk(3))}
    for source, target in _BLOCK_KEYS.items():
        if name.startswith(source + "."):
            return {prefix + target + name.removeprefix(source): value}
    raise ValueError(f"open_clip state dict: unexpected key {key!r} in a transformer block")


@register("hpsv2")
class HPSv2(ImageScore):
    """HPSv2: cos(text, image) of open_clip ViT-H-14 fine-tuned on human preferences; range [-1, 1]."""

    value_range = (-1.0, 1.0)

    class Params(ImageScoreParams):
        name: str = "hpsv2"
        """The reward's name in results, logs and reports."""
        model: str = pydantic.Field(min_length=1)
        """The open_clip checkpoint: a local .pt file or org/name/file on the hub (HPS_v2.1_compressed.pt)."""
        processor: str = pydantic.Field(min_length=1)
        """Hub id or folder of the CLIP tokenizer and image processor of the ViT-H-14 base."""
        architecture: dict[str, Any] = VIT_H_14
        """The open_clip model config (embed_dim, vision_cfg, text_cfg) the checkpoint was trained with."""

    @classmethod
    def from_params(cls, params: Params) -> HPSv2:
        path = resolve_checkpoint_file(params.model, "hpsv2: an open_clip .pt checkpoint of HPSv2")
        processor = load_clip_processor(params.processor, "hpsv2")
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        state_dict = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
        if not isinstance(state_dict, Mapping):
            raise ValueError(f"hpsv2: {path} holds a {type(checkpoint).__name__}; expected an open_clip state dict")
        clip = CLIPModel(openclip_clip_config(params.architecture, processor.tokenizer))
        try:
            clip.load_state_dict(openclip_to_clip(state_dict), strict=True)
        except RuntimeError as error:
            raise ValueError(f"hpsv2: {path} does not fit the architecture {params.architecture}: {error}") from None
        clip = clip.to(getattr(torch, params.dtype))
        return cls(clip, processor, params, sha256_file(path))

    def frame_scores(self, images: torch.Tensor, texts: torch.Tensor | None) -> torch.Tensor:
        return cosine(images, texts)


class AestheticHead(nn.Module):
    """The MLP of improved-aesthetic-predictor (simple_inference.py), so its .pth keys load as they are."""

    def __init__(self, input_size: int):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.layers(embeddings)


@register("aesthetic")
class AestheticScore(ImageScore):
    """LAION aesthetic predictor: MLP of the L2-normalised CLIP ViT-L/14 image embedding (about 1..10)."""

    text_conditioned = False

    class Params(ImageScoreParams):
        name: str = "aesthetic"
        """The reward's name in results, logs and reports."""
        head: str = pydantic.Field(min_length=1)
        """The MLP head's .pth state dict: a local file or org/name/file on the hub."""

    def __init__(self, clip: CLIPModel, processor: CLIPProcessor, head: AestheticHead, params: Params, weights: object):
        super().__init__(clip, processor, params, weights)
        self.head = head.to(self.device).eval()

    @classmethod
    def from_params(cls, params: Params) -> AestheticScore:
        clip, processor, weights = load_clip(params.model, params.processor, params.name, params.dtype)
        path = resolve_checkpoint_file(params.head, "aesthetic: the .pth of an improved-aesthetic-predictor MLP")
        state_dict = torch.load(path, map_location="cpu", weights_only=True)
        head = AestheticHead(clip.config.projection_dim)
        try:
            head.load_state_dict(state_dict, strict=True)
        except (RuntimeError, AttributeError) as error:
            raise ValueError(
                f"aesthetic: {path} is not an improved-aesthetic-predictor head for {clip.config.projection_dim}-d "
                f"CLIP embeddings (keys layers.0.weight ... layers.7.bias): {error}"
            ) from None
        return cls(clip, processor, head, params, (weights, sha256_file(path)))

    def frame_scores(self, images: torch.Tensor, texts: torch.Tensor | None) -> torch.Tensor:
        return self.head(F.normalize(images, dim=-1)).squeeze(-1)
