"""Qwen-VL backbones: load real checkpoints, or build tiny random ones that load the same way.

`load_backbone` is the path real users take (`Qwen/Qwen2.5-VL-3B-Instruct`, a fine-tuned folder, ...).
`build_tiny_backbone` writes a folder with a few-layer random model, the family's processor and a
tokenizer trained on the shipped corpus, so tests and CPU demos run every code path of a real
checkpoint in well under a second per forward.

The processors returned here have no video processor: transformers 5 instantiates every sub-processor
named in a processor's `__init__`, and the Qwen-VL video processors need torchvision, which this
project never installs. Clip frames are fed as images (see `vlm_rewards.models.inputs`), so nothing
here needs one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProcessorMixin,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLModel,
    Qwen2_5_VLProcessor,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLModel,
    Qwen2VLProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLModel,
    Qwen3VLProcessor,
)
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from vlm_rewards.io import make_readable
from vlm_rewards.models.config import FAMILIES
from vlm_rewards.models.hub import resolve_checkpoint
from vlm_rewards.models.tokenizer import (
    CHAT_TEMPLATE,
    ENDOFTEXT,
    IM_END,
    IMAGE_PAD,
    SPECIAL_TOKENS,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    default_corpus,
    train_tokenizer,
)
from vlm_rewards.models.vision import IMAGE_MIN_TOKENS

MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
TINY_MAX_TOKENS = 256  # per-frame token cap of tiny models, so CPU forwards stay fast


def _image_only(processor_class: type[ProcessorMixin]) -> type[ProcessorMixin]:
    """`processor_class` without its video processor (see the module docstring).

    It keeps the class name, so a saved folder still names e.g. Qwen2VLProcessor and loads with
    `AutoProcessor` on machines that do have torchvision.
    """

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        kwargs.pop("video_processor", None)  # the nested config a saved folder carries for AutoProcessor
        processor_class.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return type(processor_class.__name__, (processor_class,), {"__init__": __init__, "__module__": __name__})


def _qwen2_vl_vision(hidden_size: int, depth: int, width: int, heads: int) -> dict[str, Any]:
    return dict(depth=depth, embed_dim=width, hidden_size=hidden_size, num_heads=heads, mlp_ratio=2)


def _qwen2_5_vl_vision(hidden_size: int, depth: int, width: int, heads: int) -> dict[str, Any]:
    return dict(
        depth=depth,
        hidden_size=width,
        intermediate_size=2 * width,
        num_heads=heads,
        out_hidden_size=hidden_size,
        window_size=112,
        fullatt_block_indexes=[depth - 1],
    )


def _qwen3_vl_vision(hidden_size: int, depth: int, width: int, heads: int) -> dict[str, Any]:
    return dict(
        depth=depth,
        hidden_size=width,
        intermediate_size=2 * width,
        num_heads=heads,
        out_hidden_size=hidden_size,
        num_position_embeddings=64,  # an 8x8 grid, interpolated to any frame size
        deepstack_visual_indexes=[depth // 2],
    )


@dataclass(frozen=True)
class _Family:
    config_class: type[PretrainedConfig]
    base_model_class: type[PreTrainedModel]
    lm_model_class: type[PreTrainedModel]
    processor_class: type[ProcessorMixin]
    video_processor_type: str
    vision_config: Callable[[int, int, int, int], dict[str, Any]]
    patch_size: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    mrope_section: tuple[int, int, int]  # of the real checkpoints (head_dim 128); scaled for tiny ones
    mrope_interleaved: bool


_QWEN2_FAMILY = dict(
    video_processor_type="Qwen2VLVideoProcessor",
    patch_size=14,
    image_mean=tuple(OPENAI_CLIP_MEAN),
    image_std=tuple(OPENAI_CLIP_STD),
    mrope_section=(16, 24, 24),
    mrope_interleaved=False,
)
_FAMILIES: dict[str, _Family] = {
    "qwen2_vl": _Family(
        config_class=Qwen2VLConfig,
        base_model_class=Qwen2VLModel,
        lm_model_class=Qwen2VLForConditionalGeneration,
        processor_class=_image_only(Qwen2VLProcessor),
        vision_config=_qwen2_vl_vision,
        **_QWEN2_FAMILY,
    ),
    "qwen2_5_vl": _Family(
        config_class=Qwen2_5_VLConfig,
        base_model_class=Qwen2_5_VLModel,
        lm_model_class=Qwen2_5_VLForConditionalGeneration,
        processor_class=_image_only(Qwen2_5_VLProcessor),
        vision_config=_qwen2_5_vl_vision,
        **_QWEN2_FAMILY,
    ),
    "qwen3_vl": _Family(
        config_class=Qwen3VLConfig,
        base_model_class=Qwen3VLModel,
        lm_model_class=Qwen3VLForConditionalGeneration,
        processor_class=_image_only(Qwen3VLProcessor),
        vision_config=_qwen3_vl_vision,
        video_processor_type="Qwen3VLVideoProcessor",
        patch_size=16,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
        mrope_section=(24, 20, 20),
        mrope_interleaved=True,
    ),
}


def _family(name: str, where: str) -> _Family:
    if name not in _FAMILIES:
        raise ValueError(f"{where}: model family {name!r} is not supported; expected one of {', '.join(FAMILIES)}")
    return _FAMILIES[name]


def _mrope_section(family: _Family, head_dim: int) -> list[int]:
    """The family's multimodal-RoPE split of head_dim / 2 rotary pairs over (time, height, width)."""
    if head_dim % 32:
        raise ValueError(f"head_dim = hidden_size / num_heads = {head_dim}; tiny Qwen-VL models need a multiple of 32")
    return [section * head_dim // 128 for section in family.mrope_section]


def _token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    missing = [token for token, token_id in ids.items() if token_id is None or token_id == tokenizer.unk_token_id]
    if missing:
        raise ValueError(f"tokenizer lacks the Qwen special tokens {missing}; train it with train_tokenizer")
    return ids


def _tiny_config(
    family: _Family,
    ids: dict[str, int],
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    vision_depth: int,
    vision_hidden: int,
    vision_heads: int,
) -> PretrainedConfig:
    head_dim = hidden_size // num_heads
    rope = {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": _mrope_section(family, head_dim)}
    if family.mrope_interleaved:
        rope["mrope_interleaved"] = True
    text_config = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=8192,
        rope_parameters=rope,
        bos_token_id=ids[ENDOFTEXT],
        eos_token_id=ids[IM_END],
        pad_token_id=ids[ENDOFTEXT],
    )
    return family.config_class(
        text_config=text_config,
        vision_config={
            **family.vision_config(hidden_size, vision_depth, vision_hidden, vision_heads),
            "patch_size": family.patch_size,
        },
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=False,
    )


def _save_processor(
    family: _Family,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: Path,
    min_pixels: int | None,
    max_pixels: int | None,
) -> None:
    factor = family.patch_size * MERGE_SIZE
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=family.patch_size,
        merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        min_pixels=IMAGE_MIN_TOKENS * factor**2 if min_pixels is None else min_pixels,
        max_pixels=TINY_MAX_TOKENS * factor**2 if max_pixels is None else max_pixels,
        image_mean=list(family.image_mean),
        image_std=list(family.image_std),
    )
    chat_template = tokenizer.chat_template or CHAT_TEMPLATE
    family.processor_class(image_processor, tokenizer, chat_template=chat_template).save_pretrained(out_dir)
    # Where torchvision is installed, AutoProcessor builds the full processor and needs a video config.
    config_path = out_dir / "processor_config.json"
    processor_config = json.loads(config_path.read_text())
    processor_config["video_processor"] = {
        "video_processor_type": family.video_processor_type,
        "patch_size": family.patch_size,
        "merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "image_mean": list(family.image_mean),
        "image_std": list(family.image_std),
    }
    config_path.write_text(json.dumps(processor_config, indent=2) + "\n")


def build_tiny_backbone(
    family: str,
    out_dir: str | Path,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vision_depth: int = 2,
    vision_hidden: int = 64,
    vision_heads: int = 4,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    patch_size: int | None = None,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised `family` model (with LM head), its processor and tokenizer to `out_dir`.

    The folder loads like a real checkpoint, with `load_backbone` or `from_pretrained`. Special-token
    ids in the config are the tokenizer's; the default tokenizer is trained on the shipped corpus.
    Pixel bounds default to 4..256 merged tokens per frame. `patch_size` (default: the family's, 14 or 16)
    sets the pixels per vision patch: a frame has `(side / (2 * patch_size))**2` merged tokens.
    """
    spec = _family(family, "build_tiny_backbone")
    if patch_size is not None:
        spec = replace(spec, patch_size=patch_size)
    tokenizer = train_tokenizer(default_corpus()) if tokenizer is None else tokenizer
    ids = _token_ids(tokenizer)
    config = _tiny_config(
        spec,
        ids,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        vision_depth=vision_depth,
        vision_hidden=vision_hidden,
        vision_heads=vision_heads,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = spec.lm_model_class(config)
    model.generation_config.bos_token_id = ids[ENDOFTEXT]
    model.generation_config.eos_token_id = [ids[IM_END], ids[ENDOFTEXT]]
    model.generation_config.pad_token_id = ids[ENDOFTEXT]

    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    _save_processor(spec, tokenizer, out_dir, min_pixels, max_pixels)
    make_readable(out_dir)  # safetensors writes weights with mode 0600
    return out_dir


def resize_patches(source: str | Path, out_dir: str | Path, patch_size: int) -> Path:
    """Save the backbone in `source` with `patch_size`-pixel vision patches to `out_dir`; every weight but the
    patch embedding is kept.

    The patch embedding is resized as FlexiViT does for a smaller patch: the new kernel is the old one read
    through bilinear upsampling, so a new patch embeds exactly as the old model embedded it upsampled to the old
    patch size. A frame then has more tokens that start out meaning what the old ones meant (the model sees it
    as the old model saw the frame enlarged), a warm start for pretraining at the finer grid.
    """
    model, processor = load_backbone(source, with_lm_head=True, dtype=torch.float32)
    family = replace(_FAMILIES[model.config.model_type], patch_size=patch_size)
    state = model.state_dict()
    key = next(name for name in state if name.endswith("patch_embed.proj.weight"))
    state[key] = _resized_kernel(state[key], patch_size)
    config = model.config
    config.vision_config.patch_size = patch_size
    resized = family.lm_model_class(config)
    resized.load_state_dict(state)
    out_dir = Path(out_dir)
    resized.save_pretrained(out_dir)
    _save_processor(family, processor.tokenizer, out_dir, None, None)
    make_readable(out_dir)
    return out_dir


def _resized_kernel(kernel: torch.Tensor, patch_size: int) -> torch.Tensor:
    """A (..., old, old) patch kernel as a (..., patch_size, patch_size) one: <new, x> = <old, upsample(x)>."""
    old = kernel.shape[-1]
    basis = torch.eye(patch_size * patch_size, dtype=kernel.dtype).view(-1, 1, patch_size, patch_size)
    upsampled = torch.nn.functional.interpolate(basis, size=(old, old), mode="bilinear", align_corners=False)
    resized = kernel.flatten(-2) @ upsampled.flatten(1).T  # (..., patch_size**2)
    return resized.unflatten(-1, (patch_size, patch_size)).contiguous()


def _load_config(name_or_path: str | Path) -> PretrainedConfig:
    path = Path(name_or_path)
    if path.is_dir() and not (path / "config.json").is_file():
        raise ValueError(f"{name_or_path}: no config.json; expected a saved Qwen-VL model folder")
    try:
        config = AutoConfig.from_pretrained(name_or_path)
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(
            f"{name_or_path}: could not read a model config; expected a Qwen-VL model folder or hub id ({error})"
        ) from error
    _family(config.model_type, str(name_or_path))
    return config


def _load_processor(name_or_path: str | Path, family: _Family, config: PretrainedConfig) -> ProcessorMixin:
    path = Path(name_or_path)
    # Without its files a tokenizer still loads, empty, and would encode all text to nothing.
    if path.is_dir() and not any((path / name).is_file() for name in ("tokenizer.json", "vocab.json")):
        raise ValueError(f"{name_or_path}: no tokenizer.json or vocab.json; expected the model's tokenizer")
    try:
        processor = family.processor_class.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"{name_or_path}: could not load the processor (tokenizer, image processor): {error}"
        ) from error
    expected = {
        IMAGE_PAD: config.image_token_id,
        VISION_START: config.vision_start_token_id,
        VISION_END: config.vision_end_token_id,
    }
    actual = {token: processor.tokenizer.convert_tokens_to_ids(token) for token in expected}
    if actual != expected:
        raise ValueError(f"{name_or_path}: tokenizer ids {actual} differ from the model config's {expected}")
    return processor


def load_backbone(
    name_or_path: str | Path,
    *,
    with_lm_head: bool = False,
    dtype: torch.dtype | str | None = None,
    attn_implementation: str | None = None,
) -> tuple[PreTrainedModel, ProcessorMixin]:
    """Load a Qwen-VL model and its processor from a hub id or a local folder.

    Without LM head: the family's base model (`Qwen2VLModel`, ...), whose forward returns
    `last_hidden_state`; with LM head: `...ForConditionalGeneration`, for generation and log-probs.
    A folder that is not a loadable Qwen-VL model raises a ValueError naming it.
    """
    name_or_path = resolve_checkpoint(name_or_path, "a Qwen-VL model folder or hub id")
    config = _load_config(name_or_path)
    family = _FAMILIES[config.model_type]
    model_class = family.lm_model_class if with_lm_head else family.base_model_class
    options: dict[str, Any] = {"config": config}
    if dtype is not None:
        options["dtype"] = dtype
    if attn_implementation is not None:
        options["attn_implementation"] = attn_implementation
    try:
        model = model_class.from_pretrained(name_or_path, **options)
    except (OSError, ValueError, SafetensorError) as error:
        raise ValueError(
            f"{name_or_path}: could not load the {config.model_type} weights; expected model weights "
            f"(*.safetensors) next to config.json: {error}"
        ) from error
    return model, _load_processor(name_or_path, family, config)
