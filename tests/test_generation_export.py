"""LoRA export: peft and diffusers' `load_lora_weights` round trips on tiny SD3 and Flux pipelines, merged
weights, a tiny (ShapesWorld-style) generator, and the exports `vlmr grpo` and `vlmr export-generator` write."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import (
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
)
from peft import PeftModel
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    PreTrainedTokenizerFast,
    T5Config,
    T5EncoderModel,
)
from typer.testing import CliRunner

from vlm_rewards.cli import app
from vlm_rewards.generation.config import GRPOConfig, ModelSettings
from vlm_rewards.generation.export import export_checkpoint, export_generator, run_algorithm, save_lora, save_merged
from vlm_rewards.generation.models import ImageGenerator, build_tiny_generator, load_tiny_generator
from vlm_rewards.generation.sampling import sample_deterministic
from vlm_rewards.generation.train import add_lora, lora_parameters, run_grpo

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = "a red circle in the center"
WORDS = ["a", "red", "blue", "purple", "circle", "square", "triangle", "in", "the", "center", "top", "left", "right"]
CLIP = {"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1}
VAE = {"block_out_channels": (4,), "layers_per_block": 1, "norm_num_groups": 1, "shift_factor": 0.06}
PIPELINES = {"flow": StableDiffusion3Pipeline, "flux": FluxPipeline}


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer built locally: <s> words </s>, padded with <pad>."""
    vocab = {word: i for i, word in enumerate(["<s>", "<pad>", "</s>", "<unk>", *WORDS])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=16,
    )


def tiny_pipeline_folder(family: str, folder: Path) -> Path:
    """A tiny random SD3 ("flow") or Flux pipeline, saved as a folder its pipeline class loads."""
    torch.manual_seed(0)
    clip = CLIPTextConfig(
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
        vocab_size=32,
        projection_dim=16,
        max_position_embeddings=16,
        **CLIP,
    )
    t5 = T5Config(vocab_size=32, d_model=32, d_kv=8, d_ff=32, num_layers=1, num_heads=2, pad_token_id=1)
    common = {"scheduler": FlowMatchEulerDiscreteScheduler(), "tokenizer": word_tokenizer()}
    if family == "flow":
        pipeline = StableDiffusion3Pipeline(
            transformer=SD3Transformer2DModel(
                sample_size=8,
                patch_size=1,
                in_channels=4,
                out_channels=4,
                num_layers=2,
                attention_head_dim=8,
                num_attention_heads=2,
                caption_projection_dim=16,
                joint_attention_dim=32,
                pooled_projection_dim=32,
                pos_embed_max_size=8,
            ),
            vae=AutoencoderKL(latent_channels=4, **VAE),
            text_encoder=CLIPTextModelWithProjection(clip),
            text_encoder_2=CLIPTextModelWithProjection(clip),
            tokenizer_2=word_tokenizer(),
            text_encoder_3=T5EncoderModel(t5),
            tokenizer_3=word_tokenizer(),
            **common,
        )
    else:
        pipeline = FluxPipeline(
            transformer=FluxTransformer2DModel(
                patch_size=1,
                in_channels=4,
                num_layers=1,
                num_single_layers=1,
                attention_head_dim=8,
                num_attention_heads=2,
                joint_attention_dim=32,
                pooled_projection_dim=16,
                axes_dims_rope=(2, 2, 4),
            ),
            vae=AutoencoderKL(latent_channels=1, **VAE),
            text_encoder=CLIPTextModel(clip),
            text_encoder_2=T5EncoderModel(t5),
            tokenizer_2=word_tokenizer(),
            **common,
        )
    pipeline.save_pretrained(folder)
    return folder


def images(pipeline) -> np.ndarray:
    extra = {"max_sequence_length": 16} if isinstance(pipeline, FluxPipeline) else {}
    generator = torch.Generator().manual_seed(0)
    output = pipeline(PROMPT, height=8, width=8, num_inference_steps=2, generator=generator, output_type="np", **extra)
    return output.images


def perturb_lora(model: torch.nn.Module, seed: int = 1) -> None:
    """Random LoRA weights, as training leaves them (peft starts B at zero: the adapter would do nothing)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in lora_parameters(model):
            parameter.copy_(torch.randn_like(parameter) * 0.3)


@pytest.mark.parametrize("family", ["flow", "flux"])
def test_lora_and_merged_exports_give_the_in_memory_adapters_images(tmp_path, family):
    pipeline_class = PIPELINES[family]
    base = tiny_pipeline_folder(family, tmp_path / "base")
    trained = pipeline_class.from_pretrained(base)
    lora = ModelSettings.model_validate({"family": family, "lora": {"r": 4, "alpha": 8}})  # scale 2: alpha matters
    peft_model = add_lora(trained.transformer, lora)
    perturb_lora(peft_model)
    trained.transformer = peft_model.get_base_model()  # the pipeline runs the wrapped modules
    expected = images(trained)

    save_lora(peft_model, tmp_path / "lora", family)
    assert sorted(path.name for path in (tmp_path / "lora").glob("*.safetensors")) == [
        "adapter_model.safetensors",
        "pytorch_lora_weights.safetensors",
    ]
    fresh = pipeline_class.from_pretrained(base)
    assert np.abs(images(fresh) - expected).max() > 0.05  # the adapter changes the images
    fresh.load_lora_weights(tmp_path / "lora")
    np.testing.assert_allclose(images(fresh), expected, atol=1e-5)

    with_peft = pipeline_class.from_pretrained(base)
    with_peft.transformer = PeftModel.from_pretrained(with_peft.transformer, tmp_path / "lora").get_base_model()
    np.testing.assert_allclose(images(with_peft), expected, atol=1e-5)

    generator = ImageGenerator(family, peft_model, trained.scheduler, lambda prompts: None, lambda x: x, (4, 8, 8))
    save_merged(generator, tmp_path / "merged")
    transformer = type(peft_model.get_base_model()).from_pretrained(tmp_path / "merged" / "transformer")
    assert not any("lora" in name for name, _ in transformer.named_parameters())
    merged = pipeline_class.from_pretrained(base, transformer=transformer)
    np.testing.assert_allclose(images(merged), expected, atol=1e-5)


@pytest.mark.parametrize("family", ["flow", "flux"])
def test_a_tiny_generators_merged_export_is_a_trained_tiny_folder_with_the_same_images(tmp_path, family):
    generator = build_tiny_generator(family)
    generator.denoiser = add_lora(generator.denoiser, ModelSettings(family=family))
    perturb_lora(generator.denoiser)
    expected = sample_deterministic(generator, [PROMPT] * 2, 3, seed=0)
    assert not np.array_equal(expected, sample_deterministic(build_tiny_generator(family), [PROMPT] * 2, 3, seed=0))

    written = export_generator(generator, ["merged", "lora"], tmp_path, {"note": "test"})

    assert written == [tmp_path / "lora", tmp_path / "merged"]  # lora first: merging consumes the adapter
    assert json.loads((tmp_path / "merged" / "export.json").read_text())["note"] == "test"
    reloaded = load_tiny_generator(tmp_path / "merged")
    np.testing.assert_array_equal(sample_deterministic(reloaded, [PROMPT] * 2, 3, seed=0), expected)


def test_export_refuses_a_model_without_an_adapter_and_unknown_formats(tmp_path):
    generator = build_tiny_generator("flow")
    with pytest.raises(ValueError, match="LoRA-wrapped"):
        export_generator(generator, ["lora"], tmp_path, {})
    generator.denoiser = add_lora(generator.denoiser, ModelSettings())
    with pytest.raises(ValueError, match=r"\['onnx'\]"):
        export_generator(generator, ["onnx"], tmp_path, {})


def tiny_run_config(tmp_path: Path, **fields) -> GRPOConfig:
    return GRPOConfig.model_validate(
        {
            "output_dir": str(tmp_path / "run"),
            "sampling": {"num_steps": 3, "eval_num_steps": 3},
            "train": {
                "epochs": 1,
                "batches_per_epoch": 1,
                "sample_batch_size": 4,
                "group_size": 2,
                "train_batch_size": 4,
                "lr": 0.05,
                "ema_decay": 0.5,
            },
            "eval_every": 0,
            "checkpoint_every": 1,
            **fields,
        }
    )


def test_a_run_exports_its_final_weights_and_the_cli_exports_its_checkpoint_alike(tmp_path):
    config = tiny_run_config(tmp_path)
    run_grpo(config)
    run = config.output_dir
    assert run_algorithm(run) == "grpo"
    exported = load_file(run / "export" / "lora" / "adapter_model.safetensors")
    trained = load_file(run / "checkpoints" / "epoch_000001" / "model.safetensors")
    name = "base_model.model.transformer_blocks.0.attn.to_q.lora_B"
    assert trained[f"{name}.default.weight"].abs().max() > 0.01  # trained away from peft's zeros
    # the EMA's weights (decay 0.5 of one step from zero), not the optimizer's
    torch.testing.assert_close(exported[f"{name}.weight"], 0.5 * trained[f"{name}.default.weight"])

    result = CliRunner().invoke(app, ["export-generator", str(run), "--format", "merged"])
    assert result.exit_code == 0, result.output

    # the final export (in memory, EMA applied) and the checkpoint's merged weights draw the same images
    from_lora = build_tiny_generator("flow")
    from_lora.denoiser = PeftModel.from_pretrained(from_lora.denoiser, run / "export" / "lora")
    expected = sample_deterministic(from_lora, [PROMPT] * 2, 3, seed=0)
    merged = load_tiny_generator(run / "export" / "merged")
    np.testing.assert_allclose(sample_deterministic(merged, [PROMPT] * 2, 3, seed=0), expected, atol=1)
    assert json.loads((run / "export" / "merged" / "export.json").read_text())["ema"] is True


def test_export_checkpoint_names_what_is_missing(tmp_path):
    result = CliRunner().invoke(app, ["export-generator", str(tmp_path), "--format", "onnx"])
    assert result.exit_code == 2 and "['onnx']" in result.output
    with pytest.raises(ValueError, match="no complete checkpoint"):
        export_checkpoint(tmp_path, ["lora"])
    config = tiny_run_config(tmp_path, export={"formats": []})
    run_grpo(config)
    assert not (config.output_dir / "export").exists()
    with pytest.raises(ValueError, match="'best'.*no model.safetensors"):
        export_checkpoint(config.output_dir, ["lora"], "best")
