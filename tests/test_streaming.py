"""KVCacheSession: streaming progress equals one-pass full-clip scoring, for every Qwen-VL family.

Equality is checked at atol 1e-5 (float32; the observed gap is ~1e-7). The position test shows the
check can fail: the plausible M-RoPE mistakes (offset = cache length, offset 0, off by one) move
values by 2e-4 or more on these models.
"""

import numpy as np
import pytest
import torch

from vlm_rewards.interface import RewardRequest, RewardSession
from vlm_rewards.models.backbones import FAMILIES, build_tiny_backbone
from vlm_rewards.models.config import RewardNetworkConfig
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.models.streaming import KVCacheSession

ATOL = 1e-5
SIZE = 56
TEXTS = ("pick up the red block", "push the blue cube to the left", "open the drawer")


def _network(backbone, processor, **config) -> RewardNetwork:
    torch.manual_seed(0)
    return RewardNetwork(backbone, processor, RewardNetworkConfig(**config)).eval()


@pytest.fixture(scope="module", params=FAMILIES)
def networks(request, tmp_path_factory):
    """Per family: `plain` (16 frames, no reference) and `ref` (8 frames, goal image) on one backbone,
    at 4 merged tokens per frame."""
    folder = build_tiny_backbone(request.param, tmp_path_factory.mktemp(request.param))
    plain = RewardNetwork.from_backbone(folder, RewardNetworkConfig(max_frames=16))
    factor = plain.builder.vision.factor
    pixels = dict(min_pixels=4 * factor**2, max_pixels=4 * factor**2)
    return {
        "plain": _network(plain.backbone, plain.processor, max_frames=16, **pixels),
        "ref": _network(plain.backbone, plain.processor, max_frames=8, use_reference=True, **pixels),
        "bins": _network(plain.backbone, plain.processor, max_frames=16, head="bins", num_bins=8, **pixels),
    }


def _clip(seed: int, frames: int, width: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, SIZE, width, 3), dtype=np.uint8)


def _full(network: RewardNetwork, request: RewardRequest) -> np.ndarray:
    with torch.inference_mode():
        batch = network.encode([request])
        return network.predict(batch)[0].numpy(), batch.model_inputs["input_ids"][0]


def _stream(session: KVCacheSession, request: RewardRequest, chunks, index: int = 0) -> np.ndarray:
    """Append `request`'s frames to stream `index` of a one-stream session in `chunks`."""
    out, start = [], 0
    for count in chunks:
        views = {name: view[start : start + count] for name, view in request.views.items()}
        values = session.append([request.frames[start : start + count]], [views])
        assert len(values) == 1 and values[0].shape == (count,) and values[0].dtype == np.float64
        out.append(values[0])
        start += count
        assert session.num_frames == [start]
    return np.concatenate(out)


@pytest.mark.parametrize(
    "model, chunks, reference, views",
    [
        ("plain", (1,) * 16, False, False),  # one frame per step, up to the budget
        ("ref", (3, 1, 4), True, False),  # uneven chunks, goal image, up to the budget
        ("plain", (2, 5, 1, 8), False, True),  # an extra camera of another size
        ("ref", (1, 1, 2, 1, 3), True, True),
        ("bins", (4, 1, 3), False, False),
    ],
)
def test_streaming_equals_full_clip(networks, model, chunks, reference, views):
    network = networks[model]
    frames = sum(chunks)
    request = RewardRequest(
        _clip(0, frames),
        TEXTS[0],
        reference=_clip(1, 1) if reference else None,
        views={"wrist": _clip(2, frames, width=84)} if views else {},
    )
    full, full_ids = _full(network, request)
    session = KVCacheSession(network, [request.text], [request.reference])
    assert isinstance(session, RewardSession)
    np.testing.assert_allclose(_stream(session, request, chunks), full, atol=ATOL, rtol=0)
    # the pieces run are the full clip's tokens, all but its closing `<|im_end|>\n`
    streamed_ids = session.input_ids(0)
    assert torch.equal(streamed_ids, full_ids[: len(streamed_ids)]) and len(full_ids) - len(streamed_ids) == 2


def test_streams_of_different_lengths_and_reset(networks):
    """Three streams, uneven appends in one batched forward each, one stream reset mid-way."""
    network = networks["ref"]
    clips = [_clip(10 + i, 8) for i in range(4)]
    goals = [_clip(20 + i, 1) for i in range(4)]
    session = KVCacheSession(network, TEXTS, goals[:3])
    steps = [(1, 3, 2), (2, 1, 1), (1, 2, 3)]  # frames per stream per append
    starts, outputs = [0, 0, 0], [[], [], []]
    texts, streams = list(TEXTS), [0, 1, 2]  # which clip/goal each stream is showing
    for step, counts in enumerate(steps):
        if step == 2:  # stream 1's env starts a new episode
            session.reset(1, "close the drawer", goals[3])
            texts[1], streams[1], starts[1], outputs[1] = "close the drawer", 3, 0, []
            assert session.num_frames[1] == 0
        new = [clips[streams[i]][starts[i] : starts[i] + k] for i, k in enumerate(counts)]
        values = session.append(new)
        assert [v.shape for v in values] == [(k,) for k in counts]
        for i, k in enumerate(counts):
            outputs[i].append(values[i])
            starts[i] += k
        assert session.num_frames == starts
    for i in range(3):
        request = RewardRequest(clips[streams[i]][: starts[i]], texts[i], reference=goals[streams[i]])
        np.testing.assert_allclose(np.concatenate(outputs[i]), _full(network, request)[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("mistake", ["cache length", "zero", "+1", "-1"])
def test_wrong_rope_offset_changes_values(networks, mistake):
    """The test above can fail: continuing M-RoPE positions from anything but max position + 1 (e.g.
    from the cache length, which image blocks make longer than their position span) changes values."""
    network = networks["plain"]
    request = RewardRequest(_clip(3, 8), TEXTS[0])
    full = _full(network, request)[0]
    session = KVCacheSession(network, [request.text])
    session.append([request.frames[:4]])
    stream = session._streams[0]
    correct = stream.next_position
    assert correct < stream.cache_length  # image blocks span fewer positions than tokens
    wrong_offsets = {"cache length": stream.cache_length, "zero": 0, "+1": correct + 1, "-1": correct - 1}
    stream.next_position = wrong_offsets[mistake]
    wrong = session.append([request.frames[4:]])[0]
    assert np.abs(wrong - full[4:]).max() > 10 * ATOL


def test_refusals_leave_the_session_unchanged(networks):
    network = networks["ref"]
    goal = _clip(1, 1)
    request = RewardRequest(_clip(0, 8), TEXTS[0], reference=goal)
    session = KVCacheSession(network, [TEXTS[0], TEXTS[1]], [goal, goal])
    first = session.append([request.frames[:6], request.frames[:1]])[0]
    tiny = network.builder.vision.factor - 1
    too_many = r"frames\[0\]: stream 0 has 6 frames; 3 more would exceed the model's max_frames=8"
    with pytest.raises(ValueError, match=too_many):
        session.append([request.frames[:3], request.frames[:1]])
    with pytest.raises(ValueError, match=r"frames\[1\]: frames of .* needs sides of at least"):
        session.append([request.frames[:1], np.zeros((1, tiny, tiny, 3), np.uint8)])
    with pytest.raises(ValueError, match=r"frames\[1\]: expected dtype uint8"):
        session.append([request.frames[:1], request.frames[:1].astype(np.float32)])
    with pytest.raises(ValueError, match=r"frames\[1\]: expected shape \(T, H, W, 3\)"):
        session.append([request.frames[:1], request.frames[0]])
    with pytest.raises(ValueError, match=r"frames\[1\]: empty clip"):
        session.append([request.frames[:1], request.frames[:0]])
    with pytest.raises(ValueError, match=r"frames\[1\]: frames of 56x84, stream 1 began with 56x56"):
        session.append([request.frames[:1], _clip(5, 1, width=84)])
    with pytest.raises(ValueError, match=r"views\[0\]: views \['wrist'\], stream 0 began with \[\]"):
        session.append([request.frames[:1], request.frames[:1]], [{"wrist": request.frames[:1]}, {}])
    with pytest.raises(ValueError, match="append: 1 frame arrays and 1 view dicts for 2 streams"):
        session.append([request.frames[:1]])
    with pytest.raises(ValueError, match=r"references\[1\]: this model needs reference/goal frames"):
        KVCacheSession(network, TEXTS[:2], [goal, None])
    with pytest.raises(ValueError, match="reset: stream index 2"):
        session.reset(2, TEXTS[0], goal)
    with pytest.raises(ValueError, match="text: contains the special token"):
        session.reset(0, "<|vision_end|>", goal)
    with pytest.raises(ValueError, match="needs a progress network"):
        KVCacheSession(_network(network.backbone, network.processor, task="preference", head="scalar"), TEXTS[:1])
    # nothing above changed the session: stream 0 goes on as the full clip says
    assert session.num_frames == [6, 1]
    last = session.append([request.frames[6:8], request.frames[1:2]])[0]
    np.testing.assert_allclose(np.concatenate([first, last]), _full(network, request)[0], atol=ATOL, rtol=0)
    session.close()
    with pytest.raises(ValueError, match="the session is closed"):
        session.append([request.frames[:1], request.frames[:1]])


def test_benchmark_smoke(tmp_path):
    """bench/streaming.py runs and its streamed values match rescoring (timings not checked)."""
    from bench.streaming import run_benchmark

    result = run_benchmark(tmp_path, family="qwen2_vl", lengths=(2, 3), frame_size=56, repeats=1)
    assert result["streaming_matches"] and [row["T"] for row in result["rows"]] == [2, 3]
    assert all(row["step_ratio"] > 0 and row["episode_ratio"] > 0 for row in result["rows"])
