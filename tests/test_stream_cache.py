"""StreamCache (fixed key/value buffers, one row per stream) and the session's graphed language-model step.

The CUDA graph itself needs a GPU (bench/gpu_suite.sh runs it); here: the cache's writes, masks and
growth, both attention kinds' masks through a whole streaming session, and the step's eager fallback."""

import numpy as np
import pytest
import torch
from transformers import Qwen2Config

from vlm_rewards.interface import RewardRequest
from vlm_rewards.models.backbones import build_tiny_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.models.stream_cache import GraphedCall, StreamCache
from vlm_rewards.models.streaming import KVCacheSession


def _cache(capacity: int, attention: str = "sdpa") -> StreamCache:
    config = Qwen2Config(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2)
    config._attn_implementation = attention
    return StreamCache(config, streams=2, dtype=torch.float32, device="cpu", capacity=capacity)


def test_new_tokens_go_after_each_rows_own_tokens_and_the_mask_hides_what_follows():
    cache = _cache(8)
    mask = cache.prepare(torch.tensor([3, 0]), new_tokens=2)
    assert mask.shape == (2, 1, 2, 8) and mask.dtype == torch.bool
    assert mask[0, 0].nonzero()[:, 1].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4]  # row 0: columns <= 3, then <= 4
    assert mask[1, 0, 0].nonzero().flatten().tolist() == [0] and mask[1, 0, 1].nonzero().flatten().tolist() == [0, 1]
    new = torch.arange(2 * 1 * 2 * 4, dtype=torch.float32).reshape(2, 1, 2, 4) + 1
    keys, values = cache.update(new, -new, layer_idx=1)
    assert torch.equal(keys[0, :, 3:5], new[0]) and torch.equal(keys[1, :, 0:2], new[1])
    assert torch.equal(values[0, :, 3:5], -new[0]) and keys[0, :, :3].abs().sum() == 0
    assert cache.keys[0].abs().sum() == 0  # other layers untouched


def test_eager_attention_gets_an_additive_mask():
    cache = _cache(4, attention="eager")
    mask = cache.prepare(torch.tensor([1, 2]), new_tokens=1)
    assert mask.dtype == torch.float32
    assert mask[0, 0, 0].tolist() == [0.0, 0.0, torch.finfo(torch.float32).min, torch.finfo(torch.float32).min]


def test_growing_keeps_what_the_rows_hold():
    cache = _cache(4)
    cache.prepare(torch.tensor([0, 1]), new_tokens=2)
    written = torch.randn(2, 1, 2, 4)
    cache.update(written, written, layer_idx=0)
    before = cache.keys[0].data_ptr()
    assert not cache.reserve(4) and cache.keys[0].data_ptr() == before
    assert cache.reserve(5) and cache.capacity == 8  # doubles
    assert torch.equal(cache.keys[0][0, :, :2], written[0]) and torch.equal(cache.keys[0][1, :, 1:3], written[1])


def test_graphed_calls_run_eagerly_on_the_cpu():
    calls = []
    step = GraphedCall(lambda x, factor: calls.append(1) or x * factor, "cpu")
    for _ in range(3):
        assert torch.equal(step(torch.ones(2), key=(4,), constants=(2.0,)), torch.full((2,), 2.0))
    assert not step.enabled and step.replays == 0 and len(calls) == 3


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_streaming_equals_full_clip_with_either_attention(tmp_path, attention):
    folder = build_tiny_backbone("qwen2_5_vl", tmp_path / "backbone")
    torch.manual_seed(0)
    network = RewardNetwork.from_backbone(folder, RewardNetworkConfig(max_frames=8), attn_implementation=attention)
    assert network.backbone.config.get_text_config()._attn_implementation == attention
    frames = np.random.default_rng(0).integers(0, 256, (6, 56, 56, 3), dtype=np.uint8)
    session = KVCacheSession(network, ["pick up the red block", "open the drawer"])
    streamed = [session.append([frames[t : t + 1], frames[::-1][t : t + 1]]) for t in range(6)]
    for stream, clip in enumerate((frames, frames[::-1])):
        request = RewardRequest(clip, ["pick up the red block", "open the drawer"][stream])
        with torch.inference_mode():
            full = network.predict(network.encode([request]))[0].numpy()
        np.testing.assert_allclose(np.concatenate([step[stream] for step in streamed]), full, atol=1e-5, rtol=0)


def test_a_session_runs_checked_frame_grids_through_its_graphed_vision_step(tmp_path):
    network = RewardNetwork.from_backbone(build_tiny_backbone("qwen2_5_vl", tmp_path / "b"), RewardNetworkConfig())
    session = KVCacheSession(network, ["pick up the red block"])
    steps = []
    vision_step = session._vision_step
    session._vision_step = lambda *args, **kwargs: steps.append(kwargs["key"]) or vision_step(*args, **kwargs)
    frames = np.random.default_rng(1).integers(0, 256, (3, 56, 56, 3), dtype=np.uint8)
    for t in range(3):
        session.append([frames[t : t + 1]])
    assert steps == [((1, 4, 4),)] * 2  # the first frame's grid is checked against the tower, then graphed
