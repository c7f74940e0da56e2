"""The annotation decoder's cheaper paths give the same frames as the plain path: decoding with the
reward's frame budget equals decoding everything and subsampling afterwards (every source kind, every
sampling mode, containers with and without a frame count, a wrong frame count); single-threaded colour
conversion and FFmpeg threads do not change pixels; the local engine sends back budgeted episodes."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.annotation_fixtures import (
    make_lerobot_dataset,
    make_video_folder,
    ramp_frames,
    write_reward_yaml,
    write_video,
)
from vlm_rewards.annotation import AnnotateConfig, run_annotation, runner
from vlm_rewards.annotation import decode as decode_module
from vlm_rewards.annotation.config import SamplingConfig, SourceConfig
from vlm_rewards.annotation.decode import decode_episode
from vlm_rewards.annotation.scoring import build_request
from vlm_rewards.annotation.sources import iter_episodes
from vlm_rewards.subsample import subsample_request

BUDGETS = (2, 3, 5, 100)
SAMPLINGS = ({}, {"mode": "stride", "stride": 3}, {"mode": "fps", "fps": 4}, {"max_side": 16})


def assert_same_as_subsampled(ref, sampling: SamplingConfig, budget: int) -> None:
    plain = decode_episode(ref, sampling)
    expected = subsample_request(build_request(plain), budget)
    got = decode_episode(ref, sampling, budget)
    assert got.num_frames == plain.num_frames
    np.testing.assert_array_equal(got.frame_index, expected.frame_index)
    np.testing.assert_array_equal(got.frames, expected.frames)
    assert sorted(got.views) == sorted(expected.views)
    for name, view in expected.views.items():
        np.testing.assert_array_equal(got.views[name], view)
    # scoring subsamples again: a no-op on an episode that already fits its budget
    again = subsample_request(build_request(got), budget)
    np.testing.assert_array_equal(again.frame_index, expected.frame_index)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["all", "stride", "fps", "max_side"])
def test_budgeted_video_decode_equals_decode_then_subsample(tmp_path, sampling):
    root = make_video_folder(tmp_path / "videos", lengths=(6, 9, 7, 8))  # mp4, webm, avi, mkv
    write_video(root / "long.mp4", ramp_frames(23, seed=5))
    refs = list(iter_episodes(SourceConfig(kind="videos", path=root, instruction="brighten")))
    counts = {}
    for ref in refs:
        with av.open(ref.path) as container:
            counts[Path(ref.path).suffix] = container.streams.video[0].frames
        for budget in BUDGETS:
            assert_same_as_subsampled(ref, SamplingConfig(**sampling), budget)
    # both paths are covered: a container that states its frame count, and one that does not
    assert counts[".mp4"] > 0 and counts[".mkv"] == 0


def test_budgeted_lerobot_and_episode_decode_equal_decode_then_subsample(tmp_path):
    from vlm_rewards.data.episodes import EpisodeRecord, write_episodes

    dataset = make_lerobot_dataset(tmp_path / "lerobot", lengths=(6, 11, 5))
    source = SourceConfig(kind="lerobot", path=dataset, views={"wrist": "observation.images.wrist"})
    records = [EpisodeRecord(i, f"task {i}", ramp_frames(5 + 3 * i), np.linspace(0, 1, 5 + 3 * i), True)
               for i in range(3)]  # fmt: skip
    write_episodes(tmp_path / "eps", records, name="eps")
    refs = [*iter_episodes(source), *iter_episodes(SourceConfig(kind="episodes", path=tmp_path / "eps"))]
    for ref in refs:
        for sampling in SAMPLINGS[:2]:
            for budget in BUDGETS:
                assert_same_as_subsampled(ref, SamplingConfig(**sampling), budget)


@pytest.mark.parametrize("error", [+4, -3])
def test_wrong_container_frame_count_decodes_again(tmp_path, monkeypatch, error):
    path = write_video(tmp_path / "v" / "clip.mp4", ramp_frames(17, seed=2))
    (ref,) = iter_episodes(SourceConfig(kind="videos", path=path.parent, instruction="brighten"))
    expected = subsample_request(build_request(decode_episode(ref, SamplingConfig())), 5)
    count = decode_module._frame_count
    monkeypatch.setattr(decode_module, "_frame_count", lambda stream: count(stream) + error)
    opened, opens = decode_module._open_video, []
    monkeypatch.setattr(decode_module, "_open_video", lambda *args: opens.append(args) or opened(*args))
    got = decode_episode(ref, SamplingConfig(), budget=5)
    assert got.num_frames == 17 and len(opens) == 2  # the second pass, with the true count
    np.testing.assert_array_equal(got.frame_index, expected.frame_index)
    np.testing.assert_array_equal(got.frames, expected.frames)


def test_conversion_and_threads_keep_pixels(tmp_path):
    """One single-threaded swscale context per episode gives `to_ndarray`'s pixels, resized or not;
    FFmpeg's own decoding threads (threads=0) give the same frames as one thread."""
    path = write_video(tmp_path / "v" / "clip.mp4", ramp_frames(9, size=48, seed=3))
    (ref,) = iter_episodes(SourceConfig(kind="videos", path=path.parent, instruction="brighten"))
    for max_side in (None, 20):
        with av.open(str(path)) as container:
            size = {} if max_side is None else {"width": 20, "height": 20, "interpolation": "BILINEAR"}
            reference = np.stack([f.to_ndarray(format="rgb24", **size) for f in container.decode(video=0)])
        for threads in (1, 0, 2):
            decoded = decode_episode(ref, SamplingConfig(max_side=max_side), threads=threads)
            np.testing.assert_array_equal(decoded.frames, reference)


def test_local_engine_sends_back_only_the_frames_the_reward_sees(tmp_path, monkeypatch):
    root = tmp_path / "videos"
    write_video(root / "long.mp4", ramp_frames(23))
    write_video(root / "short.mkv", ramp_frames(3, seed=1))
    write_reward_yaml(tmp_path / "probe.yaml", "frame_budget_probe")
    sent = {}
    decode = runner.decode_or_failure

    def recording(ref, sampling, budget=None, threads=1):
        episode = decode(ref, sampling, budget, threads)
        sent[ref.episode] = (budget, threads, len(episode.frames))
        return episode

    monkeypatch.setattr(runner, "decode_or_failure", recording)
    cfg = AnnotateConfig.model_validate(
        {
            "reward": str(tmp_path / "probe.yaml"),
            "output_dir": str(tmp_path / "out"),
            "report": {"enabled": False},
            "source": {"kind": "videos", "path": str(root), "instruction": "brighten"},
            "sampling": {"max_frames": 4},
            "decode": {"workers": 2, "backend": "thread", "threads": 0},
        }  # fmt: skip
    )
    summary = run_annotation(cfg)
    assert summary.num_annotated == 2
    assert sent == {"long.mp4": (4, 0, 4), "short.mkv": (4, 0, 3)}
    frames = pq.read_table(summary.output_dir / "frames.parquet").to_pandas()
    long = frames[frames.episode == "long.mp4"]
    assert np.flatnonzero(long.scored).tolist() == [0, 7, 15, 22] and len(long) == 23
