import string
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import (
    CLIPConfig,
    CLIPImageProcessor,
    CLIPModel,
    CLIPProcessor,
    CLIPTokenizer,
    SiglipConfig,
    SiglipImageProcessor,
    SiglipModel,
    SiglipProcessor,
)

from vlm_rewards.interface import RewardRequest
from vlm_rewards.models.embedding import EmbeddingGoalReward, goal_baseline_reward
from vlm_rewards.registry import REWARDS_DIR, build_reward

GOAL = "the drawer is open"
BASELINE = "a robot arm"
IMAGE_SIZE = 32


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def _tokenizer() -> CLIPTokenizer:
    # Characters as the whole vocabulary (no merges): offline, and every lowercase prompt tokenizes.
    tokens = ["<|startoftext|>", "<|endoftext|>", *string.ascii_lowercase]
    tokens += [char + "</w>" for char in string.ascii_lowercase]
    vocab = {token: index for index, token in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=24)


def _tiny_towers(vocab_size: int) -> tuple[dict, dict]:
    text = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=24,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=8,
    )
    return text, vision


def _save_tiny_clip(folder: Path) -> Path:
    tokenizer = _tokenizer()
    text, vision = _tiny_towers(len(tokenizer))
    torch.manual_seed(0)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).save_pretrained(folder)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


def _save_tiny_siglip(folder: Path) -> Path:
    tokenizer = _tokenizer()
    text, vision = _tiny_towers(len(tokenizer))
    torch.manual_seed(0)
    SiglipModel(SiglipConfig(text_config=text, vision_config=vision)).save_pretrained(folder)
    image_processor = SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    SiglipProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory) -> Path:
    return _save_tiny_clip(tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="module", params=["clip", "siglip"])
def model_folder(request, clip_folder, tmp_path_factory) -> Path:
    return clip_folder if request.param == "clip" else _save_tiny_siglip(tmp_path_factory.mktemp("siglip"))


def _build(folder: Path, **params) -> EmbeddingGoalReward:
    config = {"kind": "embedding_goal", "model": str(folder), "baseline_prompts": [BASELINE], **params}
    return build_reward(config)


def _frames(seed: int, num_frames: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (num_frames, 64, 64, 3), dtype=np.uint8)


# The formula on its own.


def test_formula_matches_explicit_projection_matrix():
    rng = np.random.default_rng(0)
    images, goal, baseline = (
        _unit(rng.normal(size=(5, 8))),
        _unit(rng.normal(size=8)),
        _unit(rng.normal(size=8)),
    )
    direction = (goal - baseline) / np.linalg.norm(goal - baseline)
    for alpha in (0.0, 0.3, 1.0):
        projection = alpha * np.outer(direction, direction) + (1 - alpha) * np.eye(8)
        expected = 1 - 0.5 * np.sum(((images - goal) @ projection) ** 2, axis=-1)
        np.testing.assert_allclose(goal_baseline_reward(images, goal, baseline, alpha), expected, atol=1e-12)


def test_alpha_zero_is_cosine_similarity_for_unit_vectors():
    rng = np.random.default_rng(1)
    images, goal, baseline = (
        _unit(rng.normal(size=(4, 8))),
        _unit(rng.normal(size=8)),
        _unit(rng.normal(size=8)),
    )
    np.testing.assert_allclose(goal_baseline_reward(images, goal, baseline, 0.0), images @ goal, atol=1e-12)


def test_goal_scores_one_and_alpha_one_ignores_what_goal_and_baseline_share():
    rng = np.random.default_rng(2)
    goal, baseline = _unit(rng.normal(size=8)), _unit(rng.normal(size=8))
    for alpha in (0.0, 0.5, 1.0):
        assert goal_baseline_reward(goal[None], goal, baseline, alpha)[0] == pytest.approx(1.0)
        assert goal_baseline_reward(baseline[None], goal, baseline, alpha)[0] < 1.0
    sideways = rng.normal(size=8)
    direction = goal - baseline
    sideways -= (sideways @ direction) / (direction @ direction) * direction  # orthogonal to g − b
    assert goal_baseline_reward((goal + sideways)[None], goal, baseline, 1.0)[0] == pytest.approx(1.0)


def test_rewards_stay_in_range_for_any_unit_vectors():
    rng = np.random.default_rng(3)
    images = _unit(rng.normal(size=(1000, 4)))
    goal = _unit(rng.normal(size=(3, 4))).mean(axis=0)  # a mean of unit vectors, shorter than 1
    baseline = _unit(rng.normal(size=4))
    for alpha in (0.0, 0.5, 1.0):
        rewards = goal_baseline_reward(images, goal, baseline, alpha)
        assert rewards.min() >= -1.0 and rewards.max() <= 1.0
    assert goal_baseline_reward(-_unit(goal)[None], _unit(goal), baseline, 0.0)[0] == pytest.approx(-1.0)


def test_coinciding_goal_and_baseline_needs_alpha_zero():
    vector = _unit(np.ones(4))
    with pytest.raises(ValueError, match="coincide"):
        goal_baseline_reward(vector[None], vector, vector, 0.5)
    assert goal_baseline_reward(vector[None], vector, vector, 0.0)[0] == pytest.approx(1.0)


# The reward with tiny random CLIP / SigLIP models.


def test_scores_clips_of_one_and_four_frames(model_folder):
    reward = _build(model_folder, goal_prompts=["an open drawer"], batch_size=3)
    requests = [RewardRequest(_frames(0, 1), GOAL), RewardRequest(_frames(1, 4), "push the block left")]
    results = reward.score(requests)
    assert [len(result.progress) for result in results] == [1, 4]
    low, high = reward.spec.value_range
    for result in results:
        assert np.all(np.isfinite(result.progress)) and np.all((low <= result.progress) & (result.progress <= high))
        assert result.reward == result.progress[-1]
        assert -1.0 <= result.info["goal_similarity"] <= 1.0
    assert reward.spec.dense and reward.spec.frame_size is None


def test_alpha_zero_is_the_models_cosine_similarity(clip_folder):
    reward = _build(clip_folder, alpha=0.0)
    frames = _frames(4, 3)
    inputs = reward.processor(images=list(frames), return_tensors="pt")
    with torch.no_grad():
        images = reward.encoder.get_image_features(**inputs).pooler_output
        goal = reward.encoder.get_text_features(**reward.processor(text=[GOAL], return_tensors="pt")).pooler_output
    cosine = torch.nn.functional.cosine_similarity(images, goal).numpy()
    result = reward.score([RewardRequest(frames, GOAL)])[0]
    np.testing.assert_allclose(result.progress, cosine, atol=1e-5)
    assert result.info["goal_similarity"] == pytest.approx(cosine[-1], abs=1e-5)


def test_same_frame_scores_the_same_alone_and_in_a_batch(model_folder):
    reward = _build(model_folder, batch_size=2)
    frame = _frames(5, 1)
    alone = reward.score([RewardRequest(frame, GOAL)])[0].reward
    batch = [
        RewardRequest(_frames(6, 3), "close the lid"),
        RewardRequest(frame, GOAL),
        RewardRequest(_frames(7, 2), GOAL),
    ]
    assert reward.score(batch)[1].reward == pytest.approx(alone, abs=1e-6)


def test_frame_embedded_exactly_at_the_goal_scores_one(clip_folder, monkeypatch):
    reward = _build(clip_folder, alpha=1.0)
    goal = reward.goal_embeddings([GOAL])[0]
    monkeypatch.setattr(reward, "embed_images", lambda frames: np.repeat(goal[None], len(frames), axis=0))
    result = reward.score([RewardRequest(_frames(8, 2), GOAL)])[0]
    np.testing.assert_allclose(result.progress, 1.0)


def test_text_embeddings_are_encoded_once_per_distinct_text(clip_folder, monkeypatch):
    reward = _build(clip_folder, goal_prompts=["an open drawer"])
    encoded: list[str] = []
    encode = reward._encode_texts
    monkeypatch.setattr(reward, "_encode_texts", lambda texts: encoded.extend(texts) or encode(texts))
    requests = [RewardRequest(_frames(9, 1), GOAL), RewardRequest(_frames(10, 1), GOAL)]
    reward.score(requests)
    reward.score(requests)
    assert encoded == [GOAL, "an open drawer"]  # the baseline was encoded when the reward was built


def test_bad_inputs_raise(clip_folder):
    reward = _build(clip_folder)
    with pytest.raises(ValueError, match="uint8"):
        reward.score([RewardRequest(_frames(0, 1).astype(np.float32), GOAL)])
    with pytest.raises(ValueError, match="text"):
        reward.score([RewardRequest(_frames(0, 1), "  ")])


def test_goal_equal_to_baseline_names_the_request(clip_folder):
    with pytest.raises(ValueError, match=r"requests\[0\]\.text 'a robot arm'.*coincide"):
        _build(clip_folder).score([RewardRequest(_frames(0, 1), BASELINE)])


def test_missing_or_corrupt_model_folder_raises(tmp_path, clip_folder):
    missing = tmp_path / "missing"
    with pytest.raises(ValueError, match=f"{missing}.*CLIP or SigLIP"):
        _build(missing)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for file in clip_folder.iterdir():
        (corrupt / file.name).write_bytes(file.read_bytes())
    (corrupt / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match=f"{corrupt}.*expected"):
        _build(corrupt)


def test_version_tracks_model_alpha_and_prompts(clip_folder):
    base = _build(clip_folder).spec.version
    assert _build(clip_folder).spec.version == base
    assert _build(clip_folder, alpha=0.25).spec.version != base
    assert _build(clip_folder, baseline_prompts=["a gripper"]).spec.version != base


def test_version_changes_when_the_weights_change(tmp_path):
    folder = _save_tiny_clip(tmp_path / "clip")
    before = _build(folder).spec.version
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one flipped bit in the last weight
    weights.write_bytes(bytes(data))
    assert _build(folder).spec.version != before


def test_shipped_config_shows_every_parameter():
    config = yaml.safe_load((REWARDS_DIR / "embedding_goal.yaml").read_text())
    assert config.pop("kind") == "embedding_goal"
    assert set(config) == set(EmbeddingGoalReward.Params.model_fields)
    EmbeddingGoalReward.Params.model_validate(config)
