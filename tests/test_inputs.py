import re

import numpy as np
import pytest
import torch

from vlm_rewards.interface import RewardRequest
from vlm_rewards.models.backbones import FAMILIES, build_tiny_backbone, load_backbone
from vlm_rewards.models.inputs import ClipInputBuilder
from vlm_rewards.models.tokenizer import default_corpus, train_tokenizer

RNG = np.random.default_rng(0)
SHORT_CLIP = RNG.integers(0, 255, (3, 56, 56, 3), dtype=np.uint8)
LONG_CLIP = RNG.integers(0, 255, (5, 56, 56, 3), dtype=np.uint8)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_backbones")
    tokenizer = train_tokenizer(default_corpus())
    return {family: build_tiny_backbone(family, root / family, tokenizer=tokenizer) for family in FAMILIES}


@pytest.fixture(scope="session")
def backbones(tiny_dirs):
    return {family: load_backbone(folder) for family, folder in tiny_dirs.items()}


def token_id(processor, token):
    return processor.tokenizer.convert_tokens_to_ids(token)


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_of_clips_with_different_lengths(backbones, family):
    model, processor = backbones[family]
    builder = ClipInputBuilder(processor)
    samples = [
        RewardRequest(SHORT_CLIP, "move the red circle to the top left"),
        ("push the blue square to the center", LONG_CLIP),
    ]
    batch = builder.build(samples)
    inputs = batch.model_inputs
    assert set(inputs) == {"input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw"}
    assert inputs["image_grid_thw"].shape == (8, 3) and torch.all(inputs["image_grid_thw"][:, 0] == 1)
    torch.testing.assert_close(inputs["mm_token_type_ids"], (inputs["input_ids"] == model.config.image_token_id).long())
    assert batch.frame_mask.tolist() == [[True] * 3 + [False] * 2, [True] * 5]

    readout_tokens = inputs["input_ids"].gather(1, batch.readout_positions)[batch.frame_mask]
    assert torch.all(readout_tokens == token_id(processor, "<|vision_end|>"))
    assert inputs["attention_mask"][0, -1] == 0  # right padding: the short sample ends early

    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state
    assert torch.isfinite(hidden).all()
    readouts = batch.gather(hidden)
    assert readouts.shape == (2, 5, model.config.text_config.hidden_size)
    assert not torch.allclose(readouts[1, 0], readouts[1, 1])

    for index, sample in enumerate(samples):  # padding does not change a sample's readouts
        single = builder.build([sample])
        with torch.no_grad():
            single_readouts = single.gather(model(**single.model_inputs).last_hidden_state)[0]
        num_frames = int(batch.frame_mask[index].sum())
        torch.testing.assert_close(readouts[index, :num_frames], single_readouts, atol=1e-5, rtol=1e-4)


def test_layout_with_goal_views_question_and_generation_prompt(backbones):
    _, processor = backbones["qwen2_vl"]
    batch = ClipInputBuilder(processor).build(
        [("slide the green triangle to the bottom right", SHORT_CLIP, SHORT_CLIP[:1], {"wrist": SHORT_CLIP})],
        question="Is the task complete? Answer yes or no.",
        add_generation_prompt=True,
    )
    text = processor.tokenizer.decode(batch.model_inputs["input_ids"][0]).replace("<|image_pad|>", "")
    image = "<|vision_start|><|vision_end|>"
    assert text == (
        f"<|im_start|>user\nGoal: {image}\nslide the green triangle to the bottom right\n{image * 6}"
        "\nIs the task complete? Answer yes or no.<|im_end|>\n<|im_start|>assistant\n"
    )
    vision_ends = (batch.model_inputs["input_ids"][0] == token_id(processor, "<|vision_end|>")).nonzero().squeeze(-1)
    # images: the goal, then (main, wrist) per step; a step's readout is its wrist view's end.
    assert batch.readout_positions[0].tolist() == vision_ends[[2, 4, 6]].tolist()


def test_frames_in_a_given_order_are_labelled(backbones):
    _, processor = backbones["qwen3_vl"]
    batch = ClipInputBuilder(processor).build(
        [("move the red circle to the top left", SHORT_CLIP)], frame_orders=[[2, 0, 1]]
    )
    text = processor.tokenizer.decode(batch.model_inputs["input_ids"][0]).replace("<|image_pad|>", "")
    image = "<|vision_start|><|vision_end|>"
    assert f"top left\nFrame 1: {image}\nFrame 2: {image}\nFrame 3: {image}<|im_end|>" in text
    vision_ends = (batch.model_inputs["input_ids"][0] == token_id(processor, "<|vision_end|>")).nonzero().squeeze(-1)
    assert batch.readout_positions[0].tolist() == vision_ends[[1, 2, 0]].tolist()  # indexed by original frame
    pixels = batch.model_inputs["pixel_values"].reshape(3, -1)
    unshuffled = ClipInputBuilder(processor).build([("move the red circle to the top left", SHORT_CLIP)])
    torch.testing.assert_close(pixels, unshuffled.model_inputs["pixel_values"].reshape(3, -1)[[2, 0, 1]])


def test_initial_scene_is_shown_as_context_before_the_labelled_frames(backbones):
    _, processor = backbones["qwen2_5_vl"]
    builder = ClipInputBuilder(processor)
    sample = ("move the red circle to the top left", SHORT_CLIP, None, {"wrist": SHORT_CLIP})
    batch = builder.build([sample], frame_orders=[[2, 0, 1]], initial_scene=True)
    text = processor.tokenizer.decode(batch.model_inputs["input_ids"][0]).replace("<|image_pad|>", "")
    image = "<|vision_start|><|vision_end|>" * 2  # main and wrist view per step
    assert f"top left\nInitial scene: {image}\nFrame 1: {image}\nFrame 2: {image}\nFrame 3: {image}<|im_end|>" in text
    vision_ends = (batch.model_inputs["input_ids"][0] == token_id(processor, "<|vision_end|>")).nonzero().squeeze(-1)
    # images: initial scene (main, wrist), then shown frames 2, 0, 1; readouts skip the context.
    assert batch.readout_positions[0].tolist() == vision_ends[[5, 7, 3]].tolist()
    pixels = batch.model_inputs["pixel_values"].reshape(8, -1)
    torch.testing.assert_close(pixels[0], pixels[4])  # the context is frame 0's main view
    with pytest.raises(ValueError, match="initial_scene: needs frame_orders"):
        builder.build([sample], initial_scene=True)


def test_frames_are_resized_once_to_the_family_factor(backbones):
    _, processor = backbones["qwen2_vl"]
    frames = RNG.integers(0, 255, (2, 64, 100, 3), dtype=np.uint8)
    batch = ClipInputBuilder(processor).build([("move the red circle", frames)])
    assert batch.model_inputs["image_grid_thw"].tolist() == [[1, 4, 8]] * 2  # 56x112 pixels, factor 28
    capped = ClipInputBuilder(processor, max_pixels=56 * 56).build([("move the red circle", frames)])
    assert capped.model_inputs["image_grid_thw"].tolist() == [[1, 2, 4]] * 2  # 28x56 pixels


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padded_batch_generates(tiny_dirs, family):
    model, processor = load_backbone(tiny_dirs[family], with_lm_head=True)
    batch = ClipInputBuilder(processor, padding_side="left").build(
        [("move the red circle", SHORT_CLIP), ("push the blue square", LONG_CLIP)],
        question=["Is it done? Answer yes or no.", "Is it done? Answer yes or no."],
        add_generation_prompt=True,
    )
    assert batch.model_inputs["attention_mask"][0, 0] == 0
    assert torch.all(batch.readout_positions[:, 0] < batch.readout_positions[:, 2])
    generated = model.generate(**batch.model_inputs, max_new_tokens=3, do_sample=False)
    assert generated.shape == (2, batch.model_inputs["input_ids"].shape[1] + 3)


def test_build_errors(backbones):
    _, processor = backbones["qwen3_vl"]
    builder = ClipInputBuilder(processor, max_frames=4)
    with pytest.raises(ValueError, match=r"samples\[0\].frames: clip of 5 frames; ClipInputBuilder takes at most 4"):
        builder.build([("push", LONG_CLIP)])
    with pytest.raises(ValueError, match=r"samples\[1\].frames: frames of 20x56 pixels.*at least 32"):
        builder.build([("push", SHORT_CLIP), ("push", np.zeros((2, 20, 56, 3), np.uint8))])
    with pytest.raises(ValueError, match=r"samples\[0\].text: expected a non-empty"):
        builder.build([("  ", SHORT_CLIP)])
    with pytest.raises(ValueError, match="uint8"):
        builder.build([("push", SHORT_CLIP.astype(np.float32))])
    with pytest.raises(ValueError, match=r"rank 3"):
        builder.build([("push", SHORT_CLIP[0])])
    with pytest.raises(ValueError, match=r"samples\[0\].views\['wrist'\]: 2 frames, expected 3"):
        builder.build([("push", SHORT_CLIP, None, {"wrist": SHORT_CLIP[:2]})])
    with pytest.raises(ValueError, match=re.escape("special token '<|image_pad|>'")):
        builder.build([("push <|image_pad|>", SHORT_CLIP)])
    with pytest.raises(ValueError, match=r"question\[0\]: expected a non-empty"):
        builder.build([("push", SHORT_CLIP)], question="")
    with pytest.raises(ValueError, match="not a permutation of range"):
        builder.build([("push", SHORT_CLIP)], frame_orders=[[0, 0, 1]])
    with pytest.raises(ValueError, match="frame_orders: 2 entries for 1 samples"):
        builder.build([("push", SHORT_CLIP)], frame_orders=[[0, 1, 2], [0]])
    with pytest.raises(ValueError, match="empty batch"):
        builder.build([])


def _processor_inputs(processor, batch_prompts, images, padding_side="right"):
    return processor(
        text=batch_prompts, images=images, do_resize=False, padding=True, padding_side=padding_side,
        return_tensors="pt",
    )  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_build_equals_the_processor(backbones, family, padding_side):
    """Tokens expanded by the builder and pixels from `PieceEncoder` are the processor's to the bit."""
    _, processor = backbones[family]
    builder = ClipInputBuilder(processor, padding_side=padding_side)
    wide = RNG.integers(0, 255, (2, 56, 112, 3), dtype=np.uint8)
    samples = [
        RewardRequest(SHORT_CLIP, "stack the cubes", reference=LONG_CLIP[:1], views={"wrist": SHORT_CLIP[::-1]}),
        ("push the block", wide),
    ]
    batch = builder.build(samples, question="How far?")
    prompts, images = [], []
    for sample in samples:
        request = builder._as_request(sample, "s")
        prompt, sample_images, _ = builder._layout(
            request, "s", "How far?", False, list(range(request.num_frames)), False
        )
        prompts.append(prompt)
        images.extend(sample_images)
    expected = _processor_inputs(processor, prompts, images, padding_side)
    assert set(batch.model_inputs) == set(expected)
    for name, value in expected.items():
        assert torch.equal(batch.model_inputs[name], value), name


class _FusedNormalize:
    """An image processor whose rescale and normalise are one float32 step (as the torchvision backend
    fuses them): other roundings than PIL's, still one value per (channel, value)."""

    def __init__(self, image_processor, per_pixel_noise=False):
        self.inner, self.per_pixel_noise = image_processor, per_pixel_noise

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, images, **kwargs):
        out = self.inner(images=images, do_rescale=False, do_normalize=False, **kwargs)
        mean = torch.tensor(self.inner.image_mean, dtype=torch.float32) / self.inner.rescale_factor
        std = torch.tensor(self.inner.image_std, dtype=torch.float32) / self.inner.rescale_factor
        channels = out["pixel_values"].reshape(len(out["pixel_values"]), 3, -1)
        values = ((channels - mean[None, :, None]) / std[None, :, None]).reshape(out["pixel_values"].shape)
        if self.per_pixel_noise:  # a value that depends on where the pixel is: no table can give it
            values = values + torch.linspace(0, 1e-3, values.shape[1])
        out["pixel_values"] = values
        return out


@pytest.mark.parametrize("per_pixel_noise", [False, True])
def test_pixel_table_follows_another_image_processor(backbones, per_pixel_noise, monkeypatch):
    _, processor = backbones["qwen2_5_vl"]
    monkeypatch.setattr(processor, "image_processor", _FusedNormalize(processor.image_processor, per_pixel_noise))
    encoder = ClipInputBuilder(processor).pieces
    images = list(LONG_CLIP)
    expected = processor.image_processor(images=images, do_resize=False, return_tensors="pt")["pixel_values"]
    pil = processor.image_processor.inner(images=images, do_resize=False, return_tensors="pt")["pixel_values"]
    assert not torch.equal(expected, pil)  # other roundings: a table copied from PIL's steps would differ
    for _ in range(2):
        pixel_values, _ = encoder.pixels(images)
        assert torch.equal(pixel_values, expected)
    assert (encoder._table is None) == per_pixel_noise
    assert encoder._exact == {(56, 56): not per_pixel_noise} and encoder.fallbacks == int(per_pixel_noise)
