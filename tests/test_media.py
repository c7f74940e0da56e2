import re

import numpy as np
import pytest
from PIL import Image

from vlm_rewards.media import read_clip, write_video


def test_npz_image_and_video_round_trip(tmp_path, world):
    frames = world.rollout(np.random.default_rng(0), 6, "expert").frames
    np.savez(tmp_path / "clip.npz", frames=frames)
    np.testing.assert_array_equal(read_clip(tmp_path / "clip.npz"), frames)
    Image.fromarray(frames[0]).save(tmp_path / "frame.png")
    np.testing.assert_array_equal(read_clip(tmp_path / "frame.png"), frames[:1])
    write_video(tmp_path / "clip.mp4", frames)
    decoded = read_clip(tmp_path / "clip.mp4")
    assert decoded.shape == frames.shape
    assert np.abs(decoded.astype(int) - frames).mean() < 4  # lossy but close


def test_bad_clip_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        read_clip(tmp_path / "missing.npz")
    np.savez(tmp_path / "other.npz", images=np.zeros((1, 2, 2, 3), np.uint8))
    with pytest.raises(ValueError, match=r"no array 'frames' in the archive \(found \['images'\]\)"):
        read_clip(tmp_path / "other.npz")
    (tmp_path / "broken.mp4").write_bytes(b"not a video")
    with pytest.raises(ValueError, match="not a readable video"):
        read_clip(tmp_path / "broken.mp4")
    with pytest.raises(ValueError, match="unsupported clip type '.txt'"):
        (tmp_path / "a.txt").write_text("x")
        read_clip(tmp_path / "a.txt")
    with pytest.raises(ValueError, match="needs even height and width"):
        write_video(tmp_path / "odd.mp4", np.zeros((2, 5, 6, 3), np.uint8), pix_fmt="yuv420p")


def make_bad_files(folder, frames):
    """Files that are not what their names say, each -> a phrase its error must contain."""
    np.savez(folder / "good.npz", frames=frames)
    whole = (folder / "good.npz").read_bytes()
    (folder / "truncated.npz").write_bytes(whole[: len(whole) // 2])
    (folder / "zero.npz").write_bytes(b"")
    np.save(folder / "array.npy", frames)
    (folder / "array.npy").rename(folder / "renamed.npz")
    (folder / "folder.npz").mkdir()
    Image.fromarray(frames[0]).save(folder / "good.png")
    png = (folder / "good.png").read_bytes()
    (folder / "truncated.png").write_bytes(png[: len(png) // 2])
    (folder / "zero.png").write_bytes(b"")
    (folder / "junk.mp4").write_bytes(b"junk" * 100)
    corrupt = bytearray(whole)
    corrupt[200:260] = b"x" * 60
    (folder / "corrupt.npz").write_bytes(bytes(corrupt))
    return {
        "truncated.npz": "not a readable .npz archive",
        "zero.npz": "empty file",
        "renamed.npz": "a single .npy array, not an .npz archive",
        "folder.npz": "is a directory",
        "truncated.png": "not a readable image",
        "zero.png": "empty file",
        "junk.mp4": "not a readable video",
        "corrupt.npz": "array 'frames' could not be read",
    }


def test_unreadable_files_raise_value_errors_naming_the_file(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (3, 16, 16, 3), dtype=np.uint8)
    for name, phrase in make_bad_files(tmp_path, frames).items():
        with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / name))}: .*{re.escape(phrase)}"):
            read_clip(tmp_path / name)
    np.testing.assert_array_equal(read_clip(tmp_path / "good.npz"), frames)
