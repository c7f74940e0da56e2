import json

import numpy as np
import pytest
import torch
from transformers import AutoConfig, Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor

from vlm_rewards.models.backbones import FAMILIES, build_tiny_backbone, load_backbone, resize_patches
from vlm_rewards.models.tokenizer import SPECIAL_TOKENS, default_corpus, train_tokenizer
from vlm_rewards.models.vision import VisionConfig

PROCESSOR_CLASSES = {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor}
FACTORS = {"qwen2_vl": 28, "qwen2_5_vl": 28, "qwen3_vl": 32}


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer(default_corpus())


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("tiny_backbones")
    return {family: build_tiny_backbone(family, root / family, tokenizer=tokenizer) for family in FAMILIES}


def test_default_corpus_covers_the_procedural_world():
    corpus = " ".join(default_corpus())
    for word in ["red", "green", "blue", "yellow", "purple", "orange", "circle", "square", "triangle"]:
        assert word in corpus
    for phrase in ["top left", "top right", "bottom left", "bottom right", "center", "push", "slide"]:
        assert phrase in corpus
    assert "Answer yes or no." in corpus and "Frame 3: 45%" in corpus


def test_tokenizer_special_tokens_are_single_ids(tokenizer):
    ids = [tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS]
    assert len(set(ids)) == len(SPECIAL_TOKENS)
    for token, token_id in zip(SPECIAL_TOKENS, ids, strict=True):
        assert tokenizer(token).input_ids == [token_id]
    text = "<|im_start|>user\nslide the purple triangle to the center<|vision_start|><|image_pad|><|vision_end|>é 日本"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert len(tokenizer) <= 2048


def test_chat_template_renders_chatml_with_images(tokenizer):
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is it red? Answer yes or no."}]},
        {"role": "assistant", "content": "yes"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Is it red? Answer yes or no.<|im_end|>\n"
        "<|im_start|>assistant\nyes<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_backbone_loads_like_a_checkpoint(tiny_dirs, tokenizer, family):
    folder = tiny_dirs[family]
    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == family
    assert config.vision_config.patch_size * config.vision_config.spatial_merge_size == FACTORS[family]
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert config.vision_end_token_id == tokenizer.convert_tokens_to_ids("<|vision_end|>")
    assert "video_processor" in json.loads((folder / "processor_config.json").read_text())

    model, processor = load_backbone(folder)
    assert isinstance(processor, PROCESSOR_CLASSES[family])
    assert VisionConfig.from_processor(processor).factor == FACTORS[family]
    assert processor.tokenizer.convert_tokens_to_ids("<|vision_start|>") == config.vision_start_token_id

    lm_model, _ = load_backbone(folder, with_lm_head=True)
    assert type(lm_model).__name__.endswith("ForConditionalGeneration")
    base_weights, lm_weights = model.state_dict(), lm_model.model.state_dict()
    assert base_weights.keys() == lm_weights.keys()
    assert all(torch.equal(base_weights[name], lm_weights[name]) for name in base_weights)


def question_about_a_frame(processor):
    """Model inputs of a chat turn with one random 64x64 frame and a question."""
    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "A cat?"}]}]
    return processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )


def test_processor_chat_template_with_an_image(tiny_dirs):
    model, processor = load_backbone(tiny_dirs["qwen3_vl"], with_lm_head=True)
    inputs = question_about_a_frame(processor)
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == 4
    assert model.generate(**inputs, max_new_tokens=2, do_sample=False).shape[1] == inputs["input_ids"].shape[1] + 2


def test_patch_size_sets_the_tokens_per_frame(tmp_path, tokenizer):
    """An 8-pixel patch makes a 64-pixel frame 4x4 merged tokens (2x2 at the family's 14)."""
    folder = build_tiny_backbone("qwen2_5_vl", tmp_path / "p8", tokenizer=tokenizer, patch_size=8)
    model, processor = load_backbone(folder, with_lm_head=True)
    assert model.config.vision_config.patch_size == 8 and VisionConfig.from_processor(processor).factor == 16
    inputs = question_about_a_frame(processor)
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == 16
    assert model(**inputs).logits.shape[1] == inputs["input_ids"].shape[1]


def test_resized_patches_embed_a_patch_as_the_old_model_embedded_it_enlarged(tmp_path, tiny_dirs):
    """FlexiViT's resize: an 8-pixel patch through the new kernel = its bilinear 14-pixel upsample through the old;
    every other weight is kept, and a 64-pixel frame becomes 4x4 merged tokens."""
    old, _ = load_backbone(tiny_dirs["qwen2_5_vl"], with_lm_head=True, dtype=torch.float32)
    new, processor = load_backbone(resize_patches(tiny_dirs["qwen2_5_vl"], tmp_path / "p8", 8), with_lm_head=True)
    patch = torch.randn(5, 3, 2, 8, 8)
    enlarged = torch.nn.functional.interpolate(patch.flatten(1, 2), size=(14, 14), mode="bilinear")
    enlarged = enlarged.view(5, 3, 2, 14, 14)
    old_embed, new_embed = old.model.visual.patch_embed, new.model.visual.patch_embed
    torch.testing.assert_close(new_embed(patch.flatten(1)), old_embed(enlarged.flatten(1)), rtol=1e-4, atol=1e-5)
    kept = {name: tensor for name, tensor in old.state_dict().items() if "patch_embed" not in name}
    assert all(torch.equal(tensor, new.state_dict()[name]) for name, tensor in kept.items())
    inputs = question_about_a_frame(processor)
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert new(**inputs).logits.shape[1] == inputs["input_ids"].shape[1]


def copy_folder(source, target):
    target.mkdir()
    for item in source.iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    return target


def test_load_backbone_errors_name_the_folder(tmp_path, tiny_dirs):
    with pytest.raises(ValueError, match="no config.json"):
        load_backbone(tmp_path)
    with pytest.raises(ValueError, match="missing/model: no such folder"):
        load_backbone(tmp_path / "missing" / "model")

    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match=r"llama: model family 'llama' is not supported; expected one of qwen2_vl"):
        load_backbone(llama)
    (llama / "config.json").write_text(json.dumps({"model_type": "not_a_model"}))
    with pytest.raises(ValueError, match="llama: could not read a model config"):
        load_backbone(llama)

    corrupt = copy_folder(tiny_dirs["qwen2_vl"], tmp_path / "corrupt")
    (corrupt / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="corrupt: could not load the qwen2_vl weights"):
        load_backbone(corrupt)
    (corrupt / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="corrupt: could not load the qwen2_vl weights"):
        load_backbone(corrupt)

    no_tokenizer = copy_folder(tiny_dirs["qwen2_vl"], tmp_path / "no_tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="no_tokenizer: no tokenizer.json"):
        load_backbone(no_tokenizer)

    mismatched = copy_folder(tiny_dirs["qwen2_vl"], tmp_path / "mismatched")
    config = json.loads((mismatched / "config.json").read_text())
    (mismatched / "config.json").write_text(json.dumps({**config, "image_token_id": 100}))
    with pytest.raises(ValueError, match="mismatched: tokenizer ids .* differ from the model config"):
        load_backbone(mismatched)


def test_build_tiny_backbone_errors(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="'llava' is not supported"):
        build_tiny_backbone("llava", tmp_path, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="multiple of 32"):
        build_tiny_backbone("qwen2_vl", tmp_path, tokenizer=tokenizer, hidden_size=96, num_heads=4)
