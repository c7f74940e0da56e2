"""Decoding one episode into the frames a reward sees (PyAV), run in decode workers.

`decode_episode(ref, sampling, budget)` returns a `DecodedEpisode` (sampled uint8 frames, their source
frame indices, the episode length, views, reference) or raises `DecodeError` with a reason for the
failures report. Only sampled frames are kept in memory; the last frame is always sampled.

With a frame `budget` (the reward's, `scoring.episode_budget`), only the frames that
`subsample_request(..., budget)` would keep of the sampled ones are converted to RGB and returned, so a
long episode costs its decode, not a colour conversion and a transfer of every frame; scoring gives the
same outputs either way (the request already fits the budget, `frame_index` says which frames it holds).

Cost per frame (profiled, 128x128 H.264): FFmpeg's own threads are set to `threads` (default 1: the
decode workers are the parallelism), and swscale runs single-threaded through one context per episode:
PyAV >= 17 otherwise gives every `to_ndarray` call a fresh swscale context with a thread pool, which
cost 16x the CPU of the conversion itself.
"""

from __future__ import annotations

import functools
import io
import os
from dataclasses import dataclass, field

import av
import numpy as np
from av.video.reformatter import VideoReformatter
from PIL import Image

from vlm_rewards.annotation.config import SamplingConfig
from vlm_rewards.annotation.sources import CameraSpan, EpisodeOutcome, EpisodeRef
from vlm_rewards.media import read_clip
from vlm_rewards.subsample import subsample_indices

# PyAV >= 17 scales with a pool of threads by default (`threads=0`); earlier versions take no `threads`
_SWS_SINGLE_THREAD = {"threads": 1} if int(av.__version__.split(".")[0]) >= 17 else {}


class DecodeError(Exception):
    """An episode that cannot be decoded; the message is the reason in the failures report."""


@dataclass
class DecodedEpisode:
    ref: EpisodeRef
    frames: np.ndarray  # (T_s, H, W, 3) uint8, the sampled frames
    frame_index: np.ndarray  # (T_s,) int64 source frame indices, strictly increasing, last = num_frames-1
    num_frames: int
    views: dict[str, np.ndarray] = field(default_factory=dict)
    reference: np.ndarray | None = None
    worker: str = ""  # "pid:thread" of the decode worker (diagnostics only, never in outputs)

    def to_bytes(self) -> bytes:
        """An .npz payload (no pickle) for passing between Ray stages."""
        arrays = {"frames": self.frames, "frame_index": self.frame_index, "num_frames": np.array(self.num_frames)}
        arrays |= {f"view.{name}": view for name, view in self.views.items()}
        if self.reference is not None:
            arrays["reference"] = self.reference
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, ref: EpisodeRef, payload: bytes) -> DecodedEpisode:
        with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
            return cls(
                ref=ref,
                frames=archive["frames"],
                frame_index=archive["frame_index"],
                num_frames=int(archive["num_frames"]),
                views={k.removeprefix("view."): archive[k] for k in archive.files if k.startswith("view.")},
                reference=archive["reference"] if "reference" in archive.files else None,
            )


class FrameSelector:
    """Online frame selection while decoding: every frame, every k-th, or `fps` frames per second."""

    def __init__(self, sampling: SamplingConfig, source_fps: float | None):
        self.sampling = sampling
        if sampling.mode == "fps":
            if not source_fps:
                raise DecodeError("sampling.mode 'fps' but the source has no frame rate")
            self.step = source_fps / sampling.fps
        else:
            self.step = float(sampling.stride if sampling.mode == "stride" else 1)
        self._next = 0.0

    def __call__(self, index: int) -> bool:
        if index + 1e-9 < self._next:
            return False
        while self._next <= index + 1e-9:
            self._next += self.step
        return True


def decode_episode(
    ref: EpisodeRef, sampling: SamplingConfig, budget: int | None = None, threads: int = 1
) -> DecodedEpisode:
    """Decode and sample one episode; raises DecodeError with the reason if it cannot.

    budget: keep only the sampled frames that `subsample_request(..., budget)` keeps (None: all).
    threads: FFmpeg decoding threads (0: FFmpeg's choice, one per core)."""
    if ref.problem:
        raise DecodeError(ref.problem)
    try:
        if ref.kind == "video":
            decoded = _decode_video_file(ref, sampling, budget, threads)
        elif ref.kind == "lerobot":
            decoded = _decode_lerobot(ref, sampling, budget, threads)
        elif ref.kind == "episodes":
            decoded = _decode_episode_dataset(ref, sampling, budget)
        else:
            raise DecodeError(f"unknown episode kind {ref.kind!r}")
        decoded.reference = _load_reference(ref.reference) if ref.reference else decoded.reference
        if decoded.reference is not None and sampling.max_side:
            decoded.reference = _resize_array(decoded.reference, sampling.max_side)
    except DecodeError:
        raise
    except (av.error.FFmpegError, OSError, ValueError, KeyError, IndexError, RuntimeError, EOFError) as error:
        raise DecodeError(f"{ref.path}: unreadable ({type(error).__name__}: {error})") from None
    decoded.worker = f"{os.getpid()}:{__import__('threading').get_ident()}"
    return decoded


def _target_size(width: int, height: int, max_side: int | None) -> tuple[int, int] | None:
    if not max_side or max(width, height) <= max_side:
        return None
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


class _Converter:
    """Decoded frames -> (H, W, 3) uint8 RGB arrays (downscaled to `max_side`), the same pixels as
    `frame.to_ndarray(format="rgb24", ...)`, through one single-threaded swscale context."""

    def __init__(self, max_side: int | None):
        self.max_side = max_side
        self.reformatter = VideoReformatter()

    def __call__(self, frame: av.VideoFrame) -> np.ndarray:
        size = _target_size(frame.width, frame.height, self.max_side)
        if size is None:
            rgb = self.reformatter.reformat(frame, format="rgb24", **_SWS_SINGLE_THREAD)
        else:
            rgb = self.reformatter.reformat(frame, format="rgb24", width=size[0], height=size[1],
                                            interpolation="BILINEAR", **_SWS_SINGLE_THREAD)  # fmt: skip
        return rgb.to_ndarray()


def _open_video(path: str, threads: int) -> tuple[av.container.InputContainer, av.video.stream.VideoStream]:
    container = av.open(path)
    if not container.streams.video:
        container.close()
        raise DecodeError(f"{path}: no video stream")
    stream = container.streams.video[0]
    if threads != 0:  # 0: FFmpeg's default (threads per core)
        stream.codec_context.thread_count = threads
    return container, stream


MAX_PLANNED_FRAMES = 1_000_000  # a larger stated count is not trusted for planning (a corrupt header)


def _frame_count(stream: av.video.stream.VideoStream) -> int:
    """The frame count the container states (0: none or implausible); checked against the frames decoded."""
    count = stream.frames
    return count if 0 < count <= MAX_PLANNED_FRAMES else 0


def _selected(sampling: SamplingConfig, fps: float | None, num_frames: int) -> np.ndarray:
    """The indices the sampler keeps of `num_frames` frames (the last one always)."""
    select = FrameSelector(sampling, fps)
    keep = [i for i in range(num_frames) if select(i)]
    if keep[-1] != num_frames - 1:
        keep.append(num_frames - 1)
    return np.asarray(keep, dtype=np.int64)


def _within_budget(keep: np.ndarray, budget: int | None) -> np.ndarray:
    """The frames of `keep` that `subsample_request(..., budget)` keeps."""
    return keep[subsample_indices(len(keep), budget)]


def _resize_array(frames: np.ndarray, max_side: int) -> np.ndarray:
    size = _target_size(frames.shape[2], frames.shape[1], max_side)
    if size is None:
        return frames
    return np.stack([np.asarray(Image.fromarray(frame).resize(size, Image.BILINEAR)) for frame in frames])


def _check_file(path: str) -> None:
    if not os.path.exists(path):
        raise DecodeError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise DecodeError(f"{path}: not a file")
    if os.path.getsize(path) == 0:
        raise DecodeError(f"{path}: empty file (0 bytes)")


def _decode_video_file(ref: EpisodeRef, sampling: SamplingConfig, budget: int | None, threads: int) -> DecodedEpisode:
    _check_file(ref.path)
    convert = _Converter(sampling.max_side)
    container, stream = _open_video(ref.path, threads)
    with container:
        rate = stream.average_rate or stream.guessed_rate
        fps = float(rate) if rate else None
        select = FrameSelector(sampling, fps)  # checks the frame rate before anything is decoded
        expected = _frame_count(stream)
        if budget is not None and expected > 0:
            # the frames to keep are known before decoding: convert only those
            wanted = _within_budget(_selected(sampling, fps, expected), budget)
            frames, count = _decode_wanted(container, stream, wanted, convert)
        else:
            # count unknown: without a budget convert the sampled frames as they come; with one, keep
            # them as decoded (YUV, half the memory of RGB) and convert the ones it keeps at the end
            kept, indices, last, count = [], [], None, 0
            for frame in container.decode(stream):
                if select(count):
                    kept.append(frame if budget else convert(frame))
                    indices.append(count)
                last, count = frame, count + 1
    if count == 0:
        raise DecodeError(f"{ref.path}: the video has no frames")
    if budget is not None and expected > 0:
        if count != expected:  # the container's count was wrong (rare): again, with the true count
            wanted = _within_budget(_selected(sampling, fps, count), budget)
            container, stream = _open_video(ref.path, threads)
            with container:
                frames, count_again = _decode_wanted(container, stream, wanted, convert)
            if count_again != count:
                raise DecodeError(f"{ref.path}: decoded {count} frames, then {count_again}")
        return DecodedEpisode(ref, np.stack(frames), wanted, count)
    if indices[-1] != count - 1:
        kept.append(last if budget else convert(last))
        indices.append(count - 1)
    positions = subsample_indices(len(indices), budget)
    frames = [convert(kept[p]) for p in positions] if budget else kept
    return DecodedEpisode(ref, np.stack(frames), np.asarray(indices, dtype=np.int64)[positions], count)


def _decode_wanted(container, stream, wanted: np.ndarray, convert: _Converter) -> tuple[list[np.ndarray], int]:
    """Decode the whole stream, converting the frames at the `wanted` indices; (frames, frame count)."""
    wanted_set, frames, count = set(wanted.tolist()), [], 0
    for frame in container.decode(stream):
        if count in wanted_set:
            frames.append(convert(frame))
        count += 1
    return frames, count


def _decode_span(
    span: CameraSpan, length: int, fps: float, keep: np.ndarray, max_side: int | None, threads: int
) -> np.ndarray:
    """The frames at episode indices `keep` of one camera: frames whose timestamps lie in the span,
    episode frame i at from_timestamp + i / fps (LeRobot's convention, tolerance 1e-4 s + half a frame)."""
    _check_file(span.path)
    wanted = {int(i): n for n, i in enumerate(keep)}
    out: list[np.ndarray | None] = [None] * len(keep)
    tolerance = 0.5 / fps
    convert = _Converter(max_side)
    container, stream = _open_video(span.path, threads)
    with container:
        if span.from_timestamp > 0:
            container.seek(int(span.from_timestamp / stream.time_base), stream=stream, backward=True)
        for frame in container.decode(stream):
            if frame.time is None:
                continue
            position = (frame.time - span.from_timestamp) * fps
            index = round(position)
            if abs(position - index) / fps > tolerance or index < 0:
                continue
            if index >= length or frame.time >= span.to_timestamp + 1e-4:
                break
            if index in wanted and out[wanted[index]] is None:
                out[wanted[index]] = convert(frame)
    missing = [int(keep[n]) for n, frame in enumerate(out) if frame is None]
    if missing:
        raise DecodeError(
            f"{span.path}: camera {span.name!r} has no frame for episode frame(s) {missing[:5]} "
            f"(timestamps {span.from_timestamp:.3f}..{span.to_timestamp:.3f} s at {fps} fps); truncated or corrupt?"
        )
    return np.stack(out)


def _decode_lerobot(ref: EpisodeRef, sampling: SamplingConfig, budget: int | None, threads: int) -> DecodedEpisode:
    if not ref.length:
        raise DecodeError(f"episode {ref.episode}: length 0")
    keep_array = _within_budget(_selected(sampling, ref.fps, ref.length), budget)
    clips = {span.name: _decode_span(span, ref.length, ref.fps, keep_array, sampling.max_side, threads)
             for span in ref.cameras}  # fmt: skip
    frames = clips.pop("frames")
    return DecodedEpisode(ref, frames, keep_array, ref.length, views=clips)


@functools.lru_cache(maxsize=4)
def _open_episode_dataset(root: str):
    from vlm_rewards.data.episodes import EpisodeDataset

    return EpisodeDataset(root)


def _decode_episode_dataset(ref: EpisodeRef, sampling: SamplingConfig, budget: int | None) -> DecodedEpisode:
    record = _open_episode_dataset(ref.path)[ref.episode_index]
    keep_array = _within_budget(_selected(sampling, ref.fps, record.num_frames), budget)

    def prepare(clip: np.ndarray) -> np.ndarray:
        clip = clip[keep_array]
        return _resize_array(clip, sampling.max_side) if sampling.max_side else clip

    return DecodedEpisode(
        ref,
        prepare(record.frames),
        keep_array,
        record.num_frames,
        views={name: prepare(view) for name, view in record.views.items()},
        reference=record.reference,
    )


@functools.lru_cache(maxsize=16)
def _load_reference_cached(path: str) -> np.ndarray:
    return read_clip(path)


def _load_reference(path: str) -> np.ndarray:
    try:
        return _load_reference_cached(path)
    except ValueError as error:
        raise DecodeError(f"reference {path}: {error}") from None


def decode_or_failure(
    ref: EpisodeRef, sampling: SamplingConfig, budget: int | None = None, threads: int = 1
) -> DecodedEpisode | EpisodeOutcome:
    """Top-level (picklable) task for decode workers: the decoded episode (only the frames the
    reward's `budget` keeps, see `decode_episode`), or its failure outcome."""
    try:
        return decode_episode(ref, sampling, budget, threads)
    except DecodeError as error:
        return EpisodeOutcome(ref=ref, error=str(error), stage="decode")
