"""The `sarm` kind (issue #38, item 1): LeRobot's SARM checkpoints as a reward.

LeRobot cannot share this venv (it needs torchvision, which this project does not install, and pins its
own torch and transformers ranges), so the reference below is a hand port of huggingface/lerobot
policies/sarm: modeling_sarm.py (`StageTransformer`, `SubtaskTransformer`,
`SARMRewardModel.calculate_rewards`), sarm_utils.py (`normalize_stage_tau`,
`temporal_proportions_to_breakpoints`) and processor_sarm.py (`_encode_images_batch`, `_encode_text_clip`).
A tiny checkpoint in LeRobot's layout (config.json + model.safetensors with `stage_model.*` and
`subtask_model.*`) is written from the ported modules and scored both ways.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file
from torch import nn
from transformers import CLIPModel, CLIPProcessor

from tests.test_embedding_goal import _save_tiny_clip
from vlm_rewards.interface import RewardRequest
from vlm_rewards.registry import build_reward
from vlm_rewards.testing import check_reward

RNG = np.random.default_rng(3)
FRAMES = RNG.integers(0, 256, (5, 40, 40, 3), dtype=np.uint8)
TEXTS = ("stack the red block on the blue one", "open the drawer")
TINY_SARM = {  # a LeRobot SARMConfig as save_pretrained writes it (the fields scoring reads, and a few more)
    "type": "sarm",
    "annotation_mode": "dual",
    "n_obs_steps": 4,
    "frame_gap": 30,
    "max_rewind_steps": 2,
    "image_dim": 16,
    "text_dim": 16,
    "hidden_dim": 16,
    "num_heads": 2,
    "num_layers": 2,
    "max_state_dim": 6,
    "dropout": 0.1,
    "num_sparse_stages": 3,
    "sparse_subtask_names": ["reach", "grasp", "place"],
    "sparse_temporal_proportions": [0.2, 0.5, 0.3],
    "num_dense_stages": 4,
    "dense_subtask_names": ["approach", "close gripper", "lift", "lower"],
    "dense_temporal_proportions": [1.0, 2.0, 3.0, 2.0],  # not normalised: LeRobot divides by the sum
    "image_key": "observation.images.top",
    "state_key": "observation.state",
    "device": None,
}


# ----------------------------------------------------------------------------- the reference, ported by hand


class StageTransformer(nn.Module):
    """modeling_sarm.py StageTransformer (and SubtaskTransformer with `subtask=True`: a fourth stream, the
    one-hot stage padded to d_model, and heads of one output behind a sigmoid)."""

    def __init__(self, config: dict, subtask: bool = False, num_cameras: int = 1):
        super().__init__()
        d_model, self.subtask = config["hidden_dim"], subtask
        self.d_model = d_model
        self.lang_proj = nn.Linear(config["text_dim"], d_model)
        self.visual_proj = nn.Linear(config["image_dim"], d_model)
        self.state_proj = nn.Linear(config["max_state_dim"], d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, config["num_heads"], 4 * d_model, config["dropout"], batch_first=True
        )
        self.transformer = nn.TransformerEncoder(layer, config["num_layers"])
        self.first_pos = nn.Parameter(torch.zeros(1, d_model))
        fused_in = d_model * (num_cameras + (3 if subtask else 2))
        self.fusion_backbone = nn.Sequential(nn.LayerNorm(fused_in), nn.Linear(fused_in, d_model), nn.ReLU())
        sparse = config["num_sparse_stages"]
        sparse, dense = (1, 1) if subtask else (sparse, config["num_dense_stages"] or sparse)
        self.heads = nn.ModuleDict({"sparse": nn.Linear(d_model, sparse), "dense": nn.Linear(d_model, dense)})

    def forward(self, img_seq, lang_emb, state, lengths, scheme, stage_prior=None):
        B, N, T, _ = img_seq.shape  # noqa: N806 - the source's names
        D = self.d_model  # noqa: N806
        vis_proj = self.visual_proj(img_seq)  # (B, N, T, D)
        state_proj = self.state_proj(state).unsqueeze(1)  # (B, 1, T, D)
        lang_proj = self.lang_proj(lang_emb).unsqueeze(1).unsqueeze(2).expand(B, 1, T, D)
        streams = [vis_proj, lang_proj, state_proj]
        if self.subtask:  # _stage_to_dmodel: pad (or cut) the one-hot to D
            C = stage_prior.shape[-1]  # noqa: N806
            pad = torch.zeros(B, 1, T, max(D - C, 0), dtype=stage_prior.dtype)
            streams.append(torch.cat([stage_prior, pad], dim=-1)[..., :D])
        x = torch.cat(streams, dim=1)  # (B, S, T, D)
        x[:, :N, 0, :] = x[:, :N, 0, :] + self.first_pos
        S = x.shape[1]  # noqa: N806
        x_tokens = x.view(B, S * T, D)
        L = x_tokens.size(1)  # noqa: N806
        base_mask = torch.arange(T).expand(B, T) >= lengths.unsqueeze(1)
        mask = base_mask.unsqueeze(1).expand(B, S, T).reshape(B, S * T)
        causal_mask = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)
        h = self.transformer(x_tokens, mask=causal_mask, src_key_padding_mask=mask, is_causal=True)
        h = h.view(B, S, T, D).permute(0, 2, 1, 3).reshape(B, T, S * D)
        out = self.heads[scheme](self.fusion_backbone(h))
        return torch.sigmoid(out).squeeze(-1) if self.subtask else out


class SARMLayout(nn.Module):
    """The module tree of SARMRewardModel (its state dict is the checkpoint's model.safetensors)."""

    def __init__(self, config: dict):
        super().__init__()
        self.stage_model = StageTransformer(config)
        self.subtask_model = StageTransformer(config, subtask=True)


def normalize_stage_tau(x: torch.Tensor, proportions: list[float]) -> torch.Tensor:
    """sarm_utils.py: breakpoints from the temporal proportions, then each stage's [i, i + 1) mapped linearly."""
    total = sum(proportions)
    proportions = [p / total for p in proportions] if abs(total - 1.0) > 1e-6 else proportions
    breakpoints = [0.0, *np.cumsum(proportions).tolist()]
    breakpoints[-1] = 1.0
    result = torch.zeros_like(x)
    for i in range(len(proportions)):
        mask = (x >= i) & (x < i + 1)
        result[mask] = breakpoints[i] + (x - i)[mask] * (breakpoints[i + 1] - breakpoints[i])
    result[x >= len(proportions)] = 1.0
    return result.clamp(0.0, 1.0)


def calculate_rewards(sarm: SARMLayout, config: dict, text_embeddings, video_embeddings, scheme: str):
    """SARMRewardModel.calculate_rewards(return_all_frames=True, return_stages=True), no state (zeros), one
    sample; also returns tau."""
    num_classes = config[f"num_{scheme}_stages"]
    img_seq, lang_emb = video_embeddings[None, None], text_embeddings[None]
    T = img_seq.shape[2]  # noqa: N806
    state = torch.zeros(1, T, config["max_state_dim"])
    lens = torch.full((1,), T, dtype=torch.int32)
    stage_probs = torch.softmax(sarm.stage_model(img_seq, lang_emb, state, lens, scheme), dim=-1)
    stage_idx = stage_probs.argmax(dim=-1)
    stage_emb = nn.functional.one_hot(stage_idx, num_classes=num_classes).float().unsqueeze(1)
    tau_pred = sarm.subtask_model(img_seq, lang_emb, state, lens, scheme, stage_emb)
    raw_reward = stage_idx.float() + tau_pred
    progress = normalize_stage_tau(raw_reward, config[f"{scheme}_temporal_proportions"])
    return progress[0].numpy(), stage_probs[0].numpy(), tau_pred[0].numpy()


def clip_features(folder: Path, frames: np.ndarray, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """processor_sarm.py: CLIP image features of PIL frames, CLIP text features of the tokenized task."""
    model, processor = CLIPModel.from_pretrained(folder).eval(), CLIPProcessor.from_pretrained(folder)
    with torch.no_grad():
        images = processor(images=[Image.fromarray(frame) for frame in frames], return_tensors="pt")
        video = model.get_image_features(**images).pooler_output  # transformers 5: an output, not a tensor
        tokens = processor.tokenizer([text], return_tensors="pt", padding=True, truncation=True)
        text_embedding = model.get_text_features(**tokens).pooler_output[0]
    return video, text_embedding


# ----------------------------------------------------------------------------- tiny checkpoints


def save_tiny_sarm(folder: Path, config: dict = TINY_SARM) -> SARMLayout:
    """A SARM checkpoint folder in LeRobot's layout, with random weights: non-trivial LayerNorms and a
    strong first-frame bias (seed 3 makes the argmax stage change within the test clips)."""
    torch.manual_seed(3)
    sarm = SARMLayout(config)
    with torch.no_grad():
        for module in sarm.modules():
            if isinstance(module, nn.LayerNorm):
                nn.init.normal_(module.weight, 1.0, 0.2), nn.init.normal_(module.bias, 0.0, 0.2)
        for model in (sarm.stage_model, sarm.subtask_model):
            nn.init.normal_(model.first_pos, 0.0, 3.0)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({key: value.contiguous() for key, value in sarm.state_dict().items()}, folder / "model.safetensors")
    return sarm.eval()


def save_tiny_sarm_and_clip(folder: Path) -> dict:
    """The `model` and `clip` params of a tiny SARM checkpoint and the tiny CLIP its features come from."""
    save_tiny_sarm(folder / "sarm")
    return {"model": str(folder / "sarm"), "clip": str(_save_tiny_clip(folder / "clip"))}


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("scheme", ["sparse", "dense"])
def test_sarm_matches_lerobot_calculate_rewards(scheme, tmp_path, one_torch_thread):
    sarm = save_tiny_sarm(tmp_path / "sarm")
    clip = _save_tiny_clip(tmp_path / "clip")
    reward = build_reward({"kind": "sarm", "model": str(tmp_path / "sarm"), "clip": str(clip), "scheme": scheme})
    assert reward.spec.max_frames == 1 + TINY_SARM["n_obs_steps"] and not reward.spec.causal
    check_reward(reward)
    requests = [RewardRequest(FRAMES, TEXTS[0]), RewardRequest(FRAMES[:2], TEXTS[1])]  # padded in one batch
    stage_changes = []
    for request, result in zip(requests, reward.score(requests)):
        video, text = clip_features(clip, request.frames, request.text)
        with torch.no_grad():
            progress, stage_probs, tau = calculate_rewards(sarm, TINY_SARM, text, video, scheme)
        np.testing.assert_allclose(result.progress, progress, atol=1e-5)
        np.testing.assert_allclose(result.info["stage_probabilities"], stage_probs, atol=1e-5)
        np.testing.assert_allclose(result.info["stage_progress_per_frame"], tau, atol=1e-5)
        assert result.info["stage_per_frame"] == stage_probs.argmax(-1).tolist()
        assert result.components == pytest.approx({"stage": stage_probs[-1].argmax(), "stage_progress": tau[-1]})
        assert result.reward == pytest.approx(progress[-1], abs=1e-5)
        stage_changes.append(len(set(result.info["stage_per_frame"])) > 1)
    assert any(stage_changes)  # the stage changes within a clip: each frame reads its own stage's prior


def test_sarm_without_temporal_proportions_weighs_stages_alike(tmp_path, one_torch_thread):
    paths = save_tiny_sarm_and_clip(tmp_path)
    (Path(paths["model"]) / "config.json").write_text(json.dumps({**TINY_SARM, "sparse_temporal_proportions": None}))
    reward = build_reward({"kind": "sarm", **paths, "max_frames": 3})
    assert reward.spec.max_frames == 3 and reward.stage_names == TINY_SARM["sparse_subtask_names"]
    result = reward.score([RewardRequest(FRAMES[:3], TEXTS[0])])[0]
    stage, tau = np.array(result.info["stage_per_frame"]), np.array(result.info["stage_progress_per_frame"])
    np.testing.assert_allclose(result.progress, (stage + tau) / 3)  # normalize_stage_tau's linear fallback


def test_sarm_dense_scheme_of_a_single_stage_checkpoint_is_refused(tmp_path):
    config = {**TINY_SARM, "annotation_mode": "single_stage", "num_sparse_stages": 1, "num_dense_stages": None}
    config |= {"sparse_subtask_names": ["task"], "sparse_temporal_proportions": [1.0]}
    save_tiny_sarm(tmp_path / "sarm", config)
    clip = _save_tiny_clip(tmp_path / "clip")
    params = {"kind": "sarm", "model": str(tmp_path / "sarm"), "clip": str(clip)}
    assert build_reward(params).stage_names == ["task"]
    with pytest.raises(ValueError, match="no trained dense head"):
        build_reward(params | {"scheme": "dense"})


def test_sarm_weights_that_do_not_fit_the_config_are_refused(tmp_path):
    paths = save_tiny_sarm_and_clip(tmp_path)
    config_file = Path(paths["model"]) / "config.json"
    config_file.write_text(json.dumps({**TINY_SARM, "num_sparse_stages": 5}))
    with pytest.raises(ValueError, match="stage_model does not fit"):
        build_reward({"kind": "sarm", **paths})
    config_file.write_text(json.dumps({**TINY_SARM, "type": "act"}))
    with pytest.raises(ValueError, match="not the config.json of a LeRobot SARM checkpoint"):
        build_reward({"kind": "sarm", **paths})
