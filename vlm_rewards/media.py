"""Reading and writing clips: .npz arrays, still images, and mp4 video through PyAV."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import av
import numpy as np
from PIL import Image

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
VIDEO_SUFFIXES = {".mp4", ".mkv", ".webm", ".avi", ".mov"}


def read_clip(path: str | Path, key: str = "frames") -> np.ndarray:
    """A (T, H, W, 3) uint8 clip from an .npz (array `key`), an image (T=1) or a video file.

    Any file that cannot be read as what its suffix says (missing, empty, truncated, a folder, a
    .npy renamed .npz, an undecodable video) raises a ValueError naming the path and what was expected.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix not in {".npz", *IMAGE_SUFFIXES, *VIDEO_SUFFIXES}:
        raise ValueError(f"{path}: unsupported clip type {suffix!r}; expected .npz, an image or a video")
    kind = "an .npz archive" if suffix == ".npz" else "an image" if suffix in IMAGE_SUFFIXES else "a video"
    if not path.is_file():
        raise ValueError(f"{path}: is a directory, not a file; expected {kind}")
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: empty file (0 bytes); expected {kind}")
    if suffix == ".npz":
        return read_npz(path, key)
    if suffix in IMAGE_SUFFIXES:
        try:
            with Image.open(path) as image:
                return np.asarray(image.convert("RGB"))[None]
        except (OSError, SyntaxError, ValueError) as error:  # PIL: unidentified or truncated image
            raise ValueError(f"{path}: not a readable image ({error})") from None
    return read_video(path)


def read_npz(path: Path, key: str = "frames") -> np.ndarray:
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path}: not a readable .npz archive ({type(error).__name__}: {error})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(
            f"{path}: a single .npy array, not an .npz archive; save clips with np.savez(path, {key}=frames)"
        )
    with loaded as archive:
        if key not in archive:
            raise ValueError(f"{path}: no array {key!r} in the archive (found {sorted(archive.files)})")
        try:
            return archive[key]
        except (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error) as error:
            raise ValueError(
                f"{path}: array {key!r} could not be read ({type(error).__name__}: {error}); expected a "
                "uint8 array in an intact archive"
            ) from None


def read_video(path: str | Path) -> np.ndarray:
    try:
        with av.open(str(path)) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    except (av.error.FFmpegError, IndexError, OSError, ValueError) as error:
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
