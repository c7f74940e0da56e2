"""The streaming session's fast paths equal what they replace.

- `PieceEncoder`: token ids and mm_token_type_ids are the processor's; pixel_values and image_grid_thw
  are the image processor's, bit for bit (and a mismatch falls back to the image processor).
- piece layouts: ids and M-RoPE positions chained block by block equal `get_rope_index` on the whole piece.
- the Qwen2.5-VL vision tower's batched path equals the tower's `forward` (float rounding; windows of
  unequal lengths too); in bfloat16 it stays on within the bound derived from the tower's own rounding
  error and is turned off by a real fault; a session with it gives the values of a session without it.
- resets run with the next append (no forward of their own); the reused batched cache gives the values
  of full-clip scoring.
"""

import copy

import numpy as np
import pytest
import torch

from vlm_rewards.interface import RewardRequest
from vlm_rewards.models import fast_vision as fast_vision_module
from vlm_rewards.models.backbones import FAMILIES, build_tiny_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.fast_vision import Qwen25Vision, fast_vision
from vlm_rewards.models.inputs import IMAGE_PLACEHOLDER, PieceEncoder
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.models.stream_cache import StreamCache
from vlm_rewards.models.streaming import KVCacheSession, _Piece

ATOL = 1e-5
TEXTS = ("pick up the red block", "push the blue cube to the left", "open the drawer")


def _clip(seed: int, frames: int, height: int = 56, width: int = 56) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module", params=FAMILIES)
def network(request, tmp_path_factory):
    folder = build_tiny_backbone(request.param, tmp_path_factory.mktemp(request.param))
    torch.manual_seed(0)
    plain = RewardNetwork.from_backbone(folder, RewardNetworkConfig(max_frames=16))
    factor = plain.builder.vision.factor
    config = RewardNetworkConfig(max_frames=16, use_reference=True, min_pixels=4 * factor**2, max_pixels=64 * factor**2)
    return RewardNetwork(plain.backbone, plain.processor, config).eval()


def _sizes(network):
    factor = network.builder.vision.factor
    return (2 * factor, 2 * factor), (2 * factor, 6 * factor)  # 2x2 and 2x6 merged tokens


def test_tokens_are_the_processors(network):
    encoder, processor = PieceEncoder(network.processor), network.processor
    small, wide = _sizes(network)
    sizes = [small, wide, small, small, wide]
    images = [np.zeros((*size, 3), np.uint8) for size in sizes]
    expected = processor(text=[IMAGE_PLACEHOLDER * len(sizes)], images=images, do_resize=False, return_tensors="pt")
    blocks = [encoder.image_tokens(*size) for size in sizes]
    assert torch.equal(torch.cat([block.input_ids for block in blocks]), expected["input_ids"][0])
    assert torch.equal(torch.cat([b.mm_token_type_ids for b in blocks]), expected["mm_token_type_ids"][0].long())
    assert [list(grid) for block in blocks for grid in block.grids] == expected["image_grid_thw"].tolist()

    prefix = "<|im_start|>user\nGoal: " + IMAGE_PLACEHOLDER + "\npick up the red block\n"
    expected = processor(text=[prefix], images=images[:1], do_resize=False, return_tensors="pt")
    block = encoder.tokens(prefix, [small])
    assert torch.equal(block.input_ids, expected["input_ids"][0])
    assert encoder.tokens(prefix, [small]) is block  # cached
    text_only = encoder.tokens("<|im_start|>user\nopen the drawer\n")
    expected = processor(text=["<|im_start|>user\nopen the drawer\n"], return_tensors="pt")
    assert torch.equal(text_only.input_ids, expected["input_ids"][0])


def test_pixels_are_the_image_processors_bit_for_bit(network):
    encoder, image_processor = PieceEncoder(network.processor), network.processor.image_processor
    small, wide = _sizes(network)
    images = [*_clip(0, 3, *small), _clip(1, 1, *wide)[0], _clip(2, 1, *small)[0]]  # mixed sizes, in this order
    expected = image_processor(images=images, do_resize=False, return_tensors="pt")
    for _ in range(2):  # first call per size: checked against the image processor; then the fast path
        pixel_values, grids = encoder.pixels(images)
        assert pixel_values.dtype == expected["pixel_values"].dtype
        assert torch.equal(pixel_values, expected["pixel_values"]) and torch.equal(grids, expected["image_grid_thw"])
    assert encoder._exact == {small: True, wide: True} and encoder.fallbacks == 0

    broken = PieceEncoder(network.processor)
    broken._table += 1e-3  # a table path that disagrees is caught on its first call and never used
    for _ in range(2):
        pixel_values, _ = broken.pixels(images[:3])
        assert torch.equal(pixel_values, image_processor(images=images[:3], do_resize=False, return_tensors="pt")[
            "pixel_values"
        ])  # fmt: skip
    assert broken._exact == {small: False} and broken.fallbacks == 1


def test_piece_layout_equals_get_rope_index_on_the_whole_piece(network):
    session = KVCacheSession(network, [TEXTS[0]], [_clip(3, 2)])
    small, wide = _sizes(network)
    prefix = session._streams[0].prefix
    images = [_clip(4, 1, *size)[0] for size in (small, wide, small, wide)]  # 2 steps x (main view, a wide view)
    layout = session._layout(_Piece(prefix, images, views_per_step=2))

    all_images = prefix.images + images
    text = prefix.text + IMAGE_PLACEHOLDER * len(images)
    expected = network.processor(text=[text], images=all_images, do_resize=False, return_tensors="pt")
    assert torch.equal(layout.input_ids, expected["input_ids"][0])
    positions, _ = network.backbone.get_rope_index(
        expected["input_ids"],
        mm_token_type_ids=expected["mm_token_type_ids"],
        image_grid_thw=expected["image_grid_thw"],
        attention_mask=expected["attention_mask"],
    )
    assert torch.equal(layout.positions, positions[:, 0])
    assert layout.extent == int(positions.max()) + 1
    vision_ends = (layout.input_ids == network.builder.vision_end_id).nonzero().squeeze(-1)
    assert layout.readouts.tolist() == vision_ends[-4:][1::2].tolist()  # the last view of each step


def _qwen2_5(network):
    if not Qwen25Vision.supports(network.backbone.visual):
        pytest.skip("the batched vision path is Qwen2.5-VL's")
    return Qwen25Vision(network.backbone.visual)


def test_fast_vision_equals_the_tower(network):
    vision = _qwen2_5(network)
    encoder = PieceEncoder(network.processor)
    small, wide = _sizes(network)
    factor = network.builder.vision.factor
    large = (6 * factor, 10 * factor)  # windows of 4x4, 4x2, 2x4 and 2x2 merged tokens: three lengths
    lists = (
        [*_clip(5, 4, *small)],  # equal windows: one batched call
        [*_clip(6, 2, *wide)],  # windows of two lengths
        [*_clip(7, 1, *large)],
        [*_clip(7, 2, *small), _clip(8, 1, *wide)[0], _clip(9, 1, *large)[0]],  # mixed sizes, every grid seen
    )
    for number, images in enumerate(lists):
        pixel_values, grids = encoder.pixels(images)
        with torch.inference_mode():
            reference = network.backbone.visual(pixel_values, grid_thw=grids).pooler_output
            first = vision(pixel_values, grids)  # the first call with a new image grid returns the tower's output
            fast = vision(pixel_values, grids)
        assert torch.equal(first, reference) == (number < 3)
        torch.testing.assert_close(first, reference, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(fast, reference, atol=1e-6, rtol=1e-5)
    windows = vision._geometry[tuple(map(tuple, grids.tolist()))][5]
    assert sorted(bucket.length for bucket in windows) == [16, 32, 64]  # (1 + 2 + 2 + 1 windows) in 3 SDPA calls
    assert vision.enabled and vision.max_abs_diff < 1e-6
    assert vision.check["reference_error"] is None and vision.check["fast_error"] <= vision.check["bound"] < 1e-4


def _bf16_vision(network, monkeypatch=None) -> tuple[Qwen25Vision, list]:
    """A bfloat16 copy of the tower, its fast path, and (pixel_values, grids) of three frame sizes."""
    _qwen2_5(network)
    vision = Qwen25Vision(copy.deepcopy(network.backbone.visual).to(torch.bfloat16))
    encoder = PieceEncoder(network.processor)
    factor = network.builder.vision.factor
    sizes = (*_sizes(network), (6 * factor, 10 * factor))
    return vision, [encoder.pixels([*_clip(50 + i, 2, *size)]) for i, size in enumerate(sizes)]


def test_bf16_fast_vision_stays_on_within_the_derived_bound(network):
    """In bfloat16 the fast path and the tower round differently; each is compared with the tower in float32,
    and the fast path is kept where it is as accurate as the tower (error <= 2 x the tower's + 1e-5)."""
    vision, inputs = _bf16_vision(network)
    for pixel_values, grids in inputs:
        with torch.inference_mode():
            reference = vision.visual(pixel_values.to(torch.bfloat16), grid_thw=grids).pooler_output
            assert torch.equal(vision(pixel_values, grids), reference)  # checked
            fast = vision(pixel_values, grids)
        assert fast.dtype == torch.bfloat16
        torch.testing.assert_close(fast.float(), reference.float(), atol=2e-2, rtol=2e-2)
    check = vision.check
    assert vision.enabled and check["agrees"]
    assert 0 < check["reference_error"] < 0.05  # bfloat16 rounding: ~2^-8 relative per op
    assert check["fast_error"] <= check["bound"] == pytest.approx(2 * check["reference_error"] + 1e-5)
    assert vision.summary() == {"enabled": True, "max_abs_diff": vision.max_abs_diff, "check": check}
    assert all(p.dtype == torch.bfloat16 for p in vision.visual.parameters())  # the float32 copy was a copy


def test_bf16_fast_vision_that_drops_a_window_is_turned_off(network, monkeypatch):
    """A fault only the fast path has (one window's attention output lost in every block) exceeds the bound.
    With the tiny model's small random attention weights it moves the output by ~3x the tower's own
    bfloat16 error (0.019 vs 0.0065 relative), so this also shows the bound leaves little room for faults."""
    vision, inputs = _bf16_vision(network)
    batched = fast_vision_module._batched_attention

    def drop_first_chunk(query, key, value, length, scale):
        out = batched(query, key, value, length, scale)
        out[:length] = 0
        return out

    monkeypatch.setattr(fast_vision_module, "_batched_attention", drop_first_chunk)
    pixel_values, grids = inputs[2]
    with torch.inference_mode():
        reference = vision.visual(pixel_values.to(torch.bfloat16), grid_thw=grids).pooler_output
        assert torch.equal(vision(pixel_values, grids), reference)
    assert not vision.enabled and not vision.check["agrees"] and vision.check["ratio"] > 1
    assert vision(pixel_values, grids) is None


def test_session_values_with_and_without_thefast_vision(network):
    vision = _qwen2_5(network)
    clips, goal = [_clip(10 + i, 6) for i in range(2)], _clip(20, 1)

    def run(enabled: bool) -> np.ndarray:
        vision.enabled = enabled
        try:
            session = KVCacheSession(network, TEXTS[:2], [goal, goal])
            session._vision = vision
            out = [session.append([clip[t : t + 2] for clip in clips]) for t in range(0, 6, 2)]
        finally:
            vision.enabled = True
        return np.array(out)

    np.testing.assert_allclose(run(True), run(False), atol=1e-6, rtol=0)
    assert fast_vision(network.backbone) is fast_vision(network.backbone)  # shared by the network's sessions


@pytest.mark.parametrize("capacity", [256, 8])
def test_resets_run_with_the_next_append_and_equal_full_clip_scoring(network, capacity):
    """Three streams appending one frame each, one reset mid-way: one forward per append, none for opening
    or resetting; the cache's buffers stay where they are (nothing copied between steps) unless they must
    grow (capacity 8: they double, several times); every value as full-clip scoring gives it."""
    forwards = []
    hook = network.backbone.language_model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        clips, goals = [_clip(30 + i, 8) for i in range(4)], [_clip(40 + i, 1) for i in range(4)]
        session = KVCacheSession(network, TEXTS, goals[:3])
        cache = StreamCache(network.backbone.language_model.config, 3, network.backbone.dtype, "cpu", capacity)
        session._cache = cache
        assert not forwards  # opening runs nothing
        texts, shown, starts, outputs = list(TEXTS), [0, 1, 2], [0, 0, 0], [[], [], []]
        for step in range(6):
            if step == 3:
                session.reset(2, "close the drawer", goals[3])
                texts[2], shown[2], starts[2], outputs[2] = "close the drawer", 3, 0, []
            calls, buffers, columns = len(forwards), cache.keys[0].data_ptr(), cache.capacity
            values = session.append([clips[shown[i]][starts[i] : starts[i] + 1] for i in range(3)])
            assert len(forwards) == calls + 1
            assert (cache.keys[0].data_ptr() == buffers) == (cache.capacity == columns)
            assert max(stream.cache_length for stream in session._streams) <= cache.capacity
            for i in range(3):
                outputs[i].append(values[i])
                starts[i] += 1
    finally:
        hook.remove()
    for i in range(3):
        request = RewardRequest(clips[shown[i]][: starts[i]], texts[i], reference=goals[shown[i]])
        with torch.inference_mode():
            full = network.predict(network.encode([request]))[0].numpy()
        np.testing.assert_allclose(np.concatenate(outputs[i]), full, atol=ATOL, rtol=0)
        assert torch.equal(session.input_ids(i), network.encode([request]).model_inputs["input_ids"][0][:-2])
        assert session._streams[i].cache_length == len(session.input_ids(i))
    assert (cache.capacity > 8) if capacity == 8 else cache.capacity == 256


def test_fast_vision_that_disagrees_is_turned_off(network):
    vision = _qwen2_5(network)
    pixel_values, grids = PieceEncoder(network.processor).pixels([*_clip(9, 2, *_sizes(network)[0])])
    with torch.inference_mode():
        reference = network.backbone.visual(pixel_values, grid_thw=grids).pooler_output
    vision.forward = lambda *args: torch.zeros_like(reference)
    with torch.inference_mode():
        assert torch.equal(vision(pixel_values, grids), reference)  # the check's call returns the tower's output
    assert not vision.enabled and vision(pixel_values, grids) is None  # then the session uses the tower
