"""Reading and writing clips: .npz arrays, still images, and mp4 video through PyAV."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
from PIL import Image

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
VIDEO_SUFFIXES = {".mp4", ".mkv", ".webm", ".avi", ".mov"}


def read_clip(path: str | Path, key: str = "frames") -> np.ndarray:
    """A (T, H, W, 3) uint8 clip from an .npz (array `key`), an image (T=1) or a video file."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with np.load(path) as archive:
            if key not in archive:
                raise ValueError(f"{path}: no array {key!r} in the archive (found {sorted(archive.files)})")
            return archive[key]
    if suffix in IMAGE_SUFFIXES:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))[None]
    if suffix in VIDEO_SUFFIXES:
        return read_video(path)
    raise ValueError(f"{path}: unsupported clip type {suffix!r}; expected .npz, an image or a video")


def read_video(path: str | Path) -> np.ndarray:
    try:
        with av.open(str(path)) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    except (av.error.FFmpegError, IndexError) as error:
        raise ValueError(f"{path}: not a readable video ({error})") from None
    if not frames:
        raise ValueError(f"{path}: the video has no frames")
    return np.stack(frames)


def write_video(path: str | Path, frames: np.ndarray, fps: int = 10, crf: int = 18, pix_fmt: str = "yuv444p") -> None:
    """Encode (T, H, W, 3) uint8 frames as H.264 (lossy).

    yuv444p keeps full colour resolution, which small coloured objects need; yuv420p plays everywhere
    but needs even height and width.
    """
    height, width = frames.shape[1:3]
    if pix_fmt == "yuv420p" and (height % 2 or width % 2):
        raise ValueError(f"{path}: frames of {height}x{width}; H.264 in yuv420p needs even height and width")
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps, options={"crf": str(crf)})
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
