import itertools

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import Qwen2VLImageProcessorPil

from vlm_rewards.models.vision import VisionConfig, resize_frames, sample_frame_indices, smart_resize

SIZES = [1, 13, 28, 29, 56, 57, 99, 224, 480, 1080, 4000]


@pytest.mark.parametrize("factor", [28, 32])
@pytest.mark.parametrize("bounds", [(None, None), (3136, 1003520), (4 * 32 * 32, 256 * 32 * 32)])
def test_smart_resize_gives_multiples_of_factor_within_pixel_bounds(factor, bounds):
    min_pixels = 4 * factor**2 if bounds[0] is None else bounds[0]
    max_pixels = 16384 * factor**2 if bounds[1] is None else bounds[1]
    for height, width in itertools.product(SIZES, repeat=2):
        if max(height, width) / min(height, width) > 200:
            continue
        resized_height, resized_width = smart_resize(height, width, factor, *bounds)
        assert resized_height % factor == 0 and resized_width % factor == 0
        assert min_pixels <= resized_height * resized_width <= max_pixels


def test_smart_resize_keeps_fitting_sizes_and_aspect():
    assert smart_resize(56, 84, 28, 3136, 1003520) == (56, 84)
    height, width = smart_resize(480, 640, 28, 3136, 200_000)
    assert height * width <= 200_000 and abs(width / height - 640 / 480) < 0.1


def test_smart_resize_errors():
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 2500, 28)
    with pytest.raises(ValueError, match="max_pixels"):
        smart_resize(56, 56, 28, min_pixels=10_000, max_pixels=1_000)
    with pytest.raises(ValueError, match="positive"):
        smart_resize(0, 56, 28)


def test_sample_frame_indices():
    np.testing.assert_array_equal(sample_frame_indices(10, 10, nframes=5), [0, 3, 6, 9])  # 5 rounds to 4
    at_two_fps = sample_frame_indices(100, 10)  # 10 s at the default 2 fps
    assert len(at_two_fps) == 20 and at_two_fps[0] == 0 and at_two_fps[-1] == 99
    assert np.all(np.diff(at_two_fps) > 0)
    np.testing.assert_array_equal(sample_frame_indices(8, 30, fps=1.0), [0, 2, 5, 7])  # raised to min_frames
    assert len(sample_frame_indices(300, 30, fps=30, max_frames=17)) == 16
    assert sample_frame_indices(100, 10).dtype == np.int64


def test_sample_frame_indices_errors():
    with pytest.raises(ValueError, match="either nframes or fps"):
        sample_frame_indices(10, 10, nframes=4, fps=2)
    with pytest.raises(ValueError, match="between 2 and 5"):
        sample_frame_indices(5, 10, nframes=8)
    with pytest.raises(ValueError, match="positive"):
        sample_frame_indices(0, 10)


def test_resize_frames():
    frames = np.random.default_rng(0).integers(0, 255, (3, 40, 60, 3), dtype=np.uint8)
    resized = resize_frames(frames, 56, 84)
    assert resized.shape == (3, 56, 84, 3) and resized.dtype == np.uint8
    expected = np.asarray(Image.fromarray(frames[1]).resize((84, 56), Image.Resampling.BICUBIC))
    np.testing.assert_array_equal(resized[1], expected)
    assert resize_frames(frames, 40, 60) is frames
    with pytest.raises(ValueError, match="uint8"):
        resize_frames(frames.astype(np.float32), 56, 56)
    with pytest.raises(ValueError, match="rank 3"):
        resize_frames(frames[0], 56, 56)


def test_vision_config_from_processor_decides_factor():
    qwen2 = VisionConfig.from_processor(Qwen2VLImageProcessorPil())
    qwen3 = VisionConfig.from_processor(Qwen2VLImageProcessorPil(patch_size=16, min_pixels=4096, max_pixels=65536))
    assert qwen2.factor == 28 and (qwen2.min_pixels, qwen2.max_pixels) == (3136, 1003520)
    assert qwen3.factor == 32 and (qwen3.min_pixels, qwen3.max_pixels) == (4096, 65536)
    assert qwen3.with_pixels(max_pixels=8192).max_pixels == 8192
    with pytest.raises(ValueError, match="below min_pixels"):
        qwen3.with_pixels(max_pixels=1024)


def test_vision_config_rejects_frames_the_model_cannot_take():
    vision = VisionConfig(patch_size=16, merge_size=2, temporal_patch_size=2, min_pixels=4096, max_pixels=65536)
    assert vision.frame_size(56, 56) == (64, 64)
    assert vision.resize(np.zeros((2, 56, 40, 3), np.uint8)).shape == (2, 96, 64, 3)  # raised to min_pixels
    with pytest.raises(ValueError, match=r"goal: frames of 20x56 pixels.*at least 32"):
        vision.frame_size(20, 56, name="goal")
    with pytest.raises(ValueError, match="wrist: aspect ratio"):
        vision.frame_size(32, 7000, name="wrist")


def test_matches_qwen_vl_utils():
    vision_process = pytest.importorskip("qwen_vl_utils.vision_process")
    for factor, (height, width) in itertools.product([28, 32], itertools.product([13, 56, 99, 480, 1920], repeat=2)):
        for bounds in [(None, None), (3136, 1003520), (factor**2, 4 * factor**2)]:
            expected = vision_process.smart_resize(height, width, factor, *bounds)
            if 0 in expected:  # the reference returns an empty side where we raise
                with pytest.raises(ValueError, match="cannot keep its aspect ratio"):
                    smart_resize(height, width, factor, *bounds)
            else:
                assert smart_resize(height, width, factor, *bounds) == expected

    for total, video_fps in itertools.product([5, 16, 33, 120], [2.5, 24, 30]):
        for options in [{}, {"fps": 1.0}, {"fps": 4, "min_frames": 6, "max_frames": 17}, {"nframes": 4}]:
            count = vision_process.smart_nframes(dict(options), total_frames=total, video_fps=video_fps)
            expected = torch.linspace(0, total - 1, count).round().long().numpy()  # as its video readers index
            np.testing.assert_array_equal(sample_frame_indices(total, video_fps, **options), expected)

    rng = np.random.default_rng(0)
    for patch_size in (14, 16):
        vision = VisionConfig(
            patch_size, 2, 2, min_pixels=4 * (2 * patch_size) ** 2, max_pixels=64 * (2 * patch_size) ** 2
        )
        frames = [rng.integers(0, 255, size, dtype=np.uint8) for size in [(56, 56, 3), (100, 37, 3), (500, 700, 3)]]
        message = {"min_pixels": vision.min_pixels, "max_pixels": vision.max_pixels}
        content = [{"type": "image", "image": Image.fromarray(frame), **message} for frame in frames]
        images, _ = vision_process.process_vision_info(
            [{"role": "user", "content": content}], image_patch_size=patch_size
        )
        for frame, image in zip(frames, images, strict=True):
            fetched = vision_process.fetch_image(
                {"image": Image.fromarray(frame), **message}, image_patch_size=patch_size
            )
            np.testing.assert_array_equal(vision.resize(frame[None])[0], np.asarray(image))
            np.testing.assert_array_equal(np.asarray(fetched), np.asarray(image))
