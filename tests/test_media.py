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
