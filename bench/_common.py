"""Helpers shared by the benchmark scripts: the machine description and the RM presets.

Imported as `_common` by a script run as `python bench/x.py` (which puts bench/ on sys.path), and as
`bench._common` where the repository root is on sys.path (the tests, which import `bench.x`;
annotate_throughput.py, which adds the root for `tests.annotation_fixtures`).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
import transformers
import typer
from rich.console import Console
from transformers import AutoConfig, AutoModel, PretrainedConfig, Qwen2_5_VLConfig

from vlm_rewards.io import write_json
from vlm_rewards.models.backbones import build_tiny_backbone, load_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.reward_network import RewardNetwork

Preset = Literal["tiny", "qwen2_5_vl_3b"]


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine(device: torch.device | str = "cpu") -> dict[str, Any]:
    device = torch.device(device)
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),  # other jobs on the machine skew absolute times
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def qwen2_5_vl_3b_config(tiny: PretrainedConfig) -> Qwen2_5_VLConfig:
    """Qwen2.5-VL-3B-Instruct's hyperparameters, with the special-token ids of the tiny model's tokenizer."""
    text = tiny.get_text_config()
    return Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            max_position_embeddings=128000,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [16, 24, 24]},
            bos_token_id=text.bos_token_id,
            eos_token_id=text.eos_token_id,
            pad_token_id=text.pad_token_id,
        ),
        vision_config=dict(
            depth=32,
            hidden_size=1280,
            intermediate_size=3420,
            num_heads=16,
            out_hidden_size=2048,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=112,
            fullatt_block_indexes=[7, 15, 23, 31],
            tokens_per_second=2,
        ),
        image_token_id=tiny.image_token_id,
        video_token_id=tiny.video_token_id,
        vision_start_token_id=tiny.vision_start_token_id,
        vision_end_token_id=tiny.vision_end_token_id,
        tie_word_embeddings=True,
    )


def build_model(
    preset: Preset,
    workdir: Path,
    device: torch.device,
    dtype: torch.dtype,
    max_frames: int,
    attn_implementation: str | None = None,
    seed: int = 0,
) -> RewardNetwork:
    """A progress RM with random weights; the 3B preset is built in memory on `device`, nothing is downloaded.

    The tiny backbone (tokenizer and processor for both presets) is built once in `workdir`; every
    call with the same `seed` gives the same weights."""
    tiny_dir = workdir / "tiny_backbone"
    if not tiny_dir.is_dir():
        build_tiny_backbone("qwen2_5_vl", tiny_dir)
    torch.manual_seed(seed)
    reward_config = RewardNetworkConfig(max_frames=max_frames)
    options = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if preset == "tiny":
        return RewardNetwork.from_backbone(tiny_dir, reward_config, dtype=dtype, **options).to(device).eval()
    _, processor = load_backbone(tiny_dir)  # the tiny tokenizer and Qwen2.5-VL image processor
    config = qwen2_5_vl_3b_config(AutoConfig.from_pretrained(tiny_dir))
    if len(processor.tokenizer) > config.get_text_config().vocab_size:
        raise ValueError(f"the tokenizer has {len(processor.tokenizer)} tokens, more than the config's vocab_size")
    with torch.device(device):
        backbone = AutoModel.from_config(config, dtype=dtype, **options)
    return RewardNetwork(backbone, processor, reward_config).to(device).eval()


def finish(
    result: dict[str, Any], output: Path, print_result: Callable[[dict[str, Any], Console], None], passed: bool = True
) -> None:
    """Print the result, write it as JSON to `output`, and exit with code 1 if the bench's output check failed."""
    console = Console()
    print_result(result, console)
    write_json(output, result)
    console.print(f"wrote {output}")
    if not passed:
        raise typer.Exit(code=1)
