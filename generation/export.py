"""Exporting a GRPO-trained generator: its LoRA adapter in the formats people load, or merged full weights.

- "lora": the adapter as peft's `save_pretrained` writes it (adapter_config.json, adapter_model.safetensors;
  `PeftModel.from_pretrained(denoiser, folder)`) and, for SD3 ("flow") and Flux ("flux") denoisers, in the
  same folder as diffusers' pytorch_lora_weights.safetensors: `transformer.`-prefixed keys, the LoRA settings
  (rank, alpha, targets) in its metadata, so `StableDiffusion3Pipeline/FluxPipeline.load_lora_weights(folder)`
  reads it.
- "merged": the adapter merged into the base weights (peft's `merge_and_unload`), saved with `save_pretrained`.
  A pretrained pipeline's denoiser goes to `transformer/` (`unet/` for ddim), to pass to the pipeline's
  `from_pretrained`; a tiny generator (ShapesWorld's: pixel space, its own text encoder, no diffusers pipeline)
  is written whole, as the folder `load_tiny_generator` reads and a GRPO config names as `model.trained_tiny`.

`vlmr grpo` writes `export.formats` of its final weights to output_dir/export/<format> (`export_final`);
`vlmr export-generator RUN_DIR` exports any checkpoint of a run (`export_checkpoint`). Either exports the
weights the run evaluated: with `ema_decay`, the EMA.

`export_base` writes a tiny generator folder (`vlmr pretrain-generator`'s output) in fp16 or bf16: the shipped
base model's format (`vlm_rewards.generation.pretrain ship`). It loads back in fp32 like any such folder.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import torch
from accelerate import Accelerator
from diffusers import FluxPipeline, StableDiffusion3Pipeline
from peft import PeftModel, get_peft_model_state_dict

from vlm_rewards.generation.config import ALGORITHM_CONFIGS, GRPOConfig
from vlm_rewards.generation.ema import ParameterEMA
from vlm_rewards.generation.models import Family, ImageGenerator, load_tiny_generator, save_tiny_generator
from vlm_rewards.io import atomic_folder, write_json

logger = logging.getLogger(__name__)

FORMATS = ("lora", "merged")  # in this order: merging consumes the adapter
EXPORT_INFO = "export.json"
LORA_PIPELINES = {"flow": StableDiffusion3Pipeline, "flux": FluxPipeline}
PEFT_PREFIX = "base_model.model."  # a PeftModel's key prefix; diffusers' layout names the denoiser's modules
MERGED_FOLDER = {"flow": "transformer", "flux": "transformer", "ddim": "unet"}
HALF_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def save_lora(model: PeftModel, folder: Path, family: Family) -> None:
    """The adapter with peft's `save_pretrained`, and for SD3 and Flux also in diffusers' LoRA layout."""
    model.save_pretrained(folder)
    pipeline = LORA_PIPELINES.get(family)
    if pipeline is None:
        return
    layers = {name.removeprefix(PEFT_PREFIX): value for name, value in get_peft_model_state_dict(model).items()}
    pipeline.save_lora_weights(
        folder,
        transformer_lora_layers=layers,
        transformer_lora_adapter_metadata=model.peft_config[model.active_adapter].to_dict(),
    )


def save_merged(generator: ImageGenerator, folder: Path) -> None:
    """The denoiser with its adapter merged in, in place (the adapter is gone afterwards)."""
    denoiser = generator.denoiser.merge_and_unload()
    if generator.text_encoder is not None:  # a tiny pixel-space generator: the whole of it
        save_tiny_generator(replace(generator, denoiser=denoiser), folder)
    else:
        denoiser.save_pretrained(folder / MERGED_FOLDER[generator.family])


def export_generator(generator: ImageGenerator, formats: list[str], folder: Path, info: dict) -> list[Path]:
    """Each format into folder/<format>, replacing an earlier export atomically, with `info` in export.json.
    `generator.denoiser` is the LoRA-wrapped `PeftModel`; a "merged" export merges it in place."""
    if not isinstance(generator.denoiser, PeftModel):
        raise ValueError(f"export: expected a LoRA-wrapped denoiser (peft PeftModel), got {type(generator.denoiser)}")
    check_formats(formats)
    written = []
    for format in [format for format in FORMATS if format in formats]:
        with atomic_folder(folder / format, replace=True) as target:
            if format == "lora":
                save_lora(generator.denoiser, target, generator.family)
            else:
                save_merged(generator, target)
            write_json(target / EXPORT_INFO, {"format": format, "family": generator.family, **info})
        written.append(folder / format)
        logger.info("exported %s weights to %s", format, folder / format)
    return written


def check_formats(formats: list[str]) -> None:
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise ValueError(f"export formats {unknown}: expected some of {list(FORMATS)}")


def export_final(
    accelerator: Accelerator,
    generator: ImageGenerator,
    denoiser: torch.nn.Module,
    ema: ParameterEMA | None,
    config: GRPOConfig,
) -> None:
    """The end of a run: its final weights (the EMA's when on) in `export.formats`, under output_dir/export.
    A "merged" export merges the adapter into the model in place: call this last."""
    formats = config.export.formats
    if formats and accelerator.is_main_process:
        if ema is not None:
            ema.apply()
        model = replace(generator, denoiser=accelerator.unwrap_model(denoiser))
        info = {"run": str(config.output_dir), "epoch": config.train.epochs, "ema": ema is not None}
        export_generator(model, formats, config.output_dir / "export", info)
    accelerator.wait_for_everyone()


def export_checkpoint(
    run_dir: Path, formats: list[str], checkpoint: str = "latest", output: Path | None = None
) -> list[Path]:
    """A `vlmr grpo` run's checkpoint ("latest", "best", or a checkpoint folder) in `formats`, under `output`
    (default run_dir/export). The model and LoRA settings come from the run's latest checkpoint."""
    from vlm_rewards.generation.shapes_eval import load_policy
    from vlm_rewards.generation.train import checkpoints  # train imports this module

    check_formats(formats)  # before a model is loaded
    config = run_config(run_dir)
    path = {"latest": checkpoints(run_dir)[-1][1], "best": run_dir / "best"}.get(checkpoint, Path(checkpoint))
    if not (path / "model.safetensors").is_file():
        raise ValueError(
            f"checkpoint {checkpoint!r} ({path}): no model.safetensors; expected 'latest', 'best' (after a run with "
            "keep_best_by) or a checkpoint folder of the run"
        )
    generator = load_policy(config, path)
    info = {"run": str(run_dir), "checkpoint": str(path), "ema": bool(config.train.ema_decay)}
    return export_generator(generator, formats, output or run_dir / "export", info)


def saved_run_settings(run_dir: Path) -> dict:
    """Every setting of a `vlmr grpo`, `rwr` or `nft` run, as its latest checkpoint saved them."""
    from vlm_rewards.generation.train import CHECKPOINT_CONFIG, checkpoints  # train imports this module

    found = checkpoints(run_dir)
    if not found:
        raise ValueError(f"{run_dir}: no complete checkpoint in {run_dir / 'checkpoints'}; expected a vlmr grpo run")
    return json.loads((found[-1][1] / CHECKPOINT_CONFIG).read_text())


def run_algorithm(run_dir: Path) -> str:
    """ "grpo", "rwr" or "nft": the command that trained a run, told by the settings of its own that it saved."""
    saved = saved_run_settings(run_dir)
    for algorithm, config_class in ALGORITHM_CONFIGS.items():
        own_settings = set(config_class.model_fields) - set(GRPOConfig.model_fields)
        if own_settings and own_settings <= saved.keys():
            return algorithm
    return "grpo"


def run_config(run_dir: Path) -> GRPOConfig:
    """The model, LoRA and sampling settings of a `vlmr grpo`, `rwr` or `nft` run, from its latest checkpoint."""
    saved = saved_run_settings(run_dir)
    # a `vlmr rwr` or `vlmr nft` run's own settings (temperature, nft) do not change its model
    return GRPOConfig.model_validate({name: saved[name] for name in GRPOConfig.model_fields if name in saved})


def export_base(model_folder: Path, output: Path, dtype: str = "float16") -> Path:
    """A tiny generator folder (`save_tiny_generator`'s) with its weights cast to fp16 or bf16, in the same layout,
    replacing `output` atomically. `load_tiny_generator` reads it back in fp32 (diffusers' default dtype)."""
    if dtype not in HALF_DTYPES:
        raise ValueError(f"export dtype {dtype!r}: expected one of {list(HALF_DTYPES)}")
    generator = load_tiny_generator(model_folder)
    for module in (generator.denoiser, generator.text_encoder):
        module.to(HALF_DTYPES[dtype])
    with atomic_folder(output, replace=True) as target:
        save_tiny_generator(generator, target)
        write_json(target / EXPORT_INFO, {"format": dtype, "family": generator.family, "source": str(model_folder)})
    logger.info("exported %s in %s to %s", model_folder, dtype, output)
    return output
