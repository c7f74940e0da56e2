"""Published reward checkpoints as reward kinds (issue #38, item 1).

Each kind loads a tiny random model written in the published checkpoint's architecture and file
layout, passes `check_reward`, and scores what the reference implementation's formula gives on the
same weights (each reference is ported by hand below, from the file named in its docstring).
"""

import math
import shutil
import string
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

from tests.test_conformance import SMALL_FRAMES
from tests.test_embedding_goal import IMAGE_SIZE, _save_tiny_clip
from tests.test_sarm_reward import save_tiny_sarm_and_clip
from vlm_rewards.interface import RewardRequest
from vlm_rewards.models.backbones import build_tiny_backbone, load_backbone
from vlm_rewards.models.image_scores import openclip_to_clip
from vlm_rewards.models.inputs import ClipInputBuilder
from vlm_rewards.registry import build_reward
from vlm_rewards.testing import check_reward

RNG = np.random.default_rng(0)
FRAMES = RNG.integers(0, 256, (3, 56, 56, 3), dtype=np.uint8)
TEXTS = ("push the red circle", "open the drawer")
TINY_OPENCLIP = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": IMAGE_SIZE, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 24, "vocab_size": 0, "width": 32, "heads": 2, "layers": 2},
}
PUBLISHED_FAMILIES = {"Qwen/Qwen3-VL-8B-Instruct": "qwen3_vl", "aliangdw/Robometer-4B": "qwen3_vl"}


# ----------------------------------------------------------------------------- tiny checkpoints


def _openclip_tokenizer() -> CLIPTokenizer:
    """Characters as the vocabulary with the special tokens last, as in CLIP's BPE vocabulary, so the
    end-of-text token has the highest id (open_clip pools at argmax of the token ids)."""
    tokens = [*string.ascii_lowercase, *(char + "</w>" for char in string.ascii_lowercase)]
    vocab = {token: i for i, token in enumerate([*tokens, "<|startoftext|>", "<|endoftext|>"])}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=24, pad_token="<|endoftext|>")


class OpenClipBlock(nn.Module):
    """open_clip transformer.py ResidualAttentionBlock (no layer scale), GELU MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            OrderedDict(c_fc=nn.Linear(width, 4 * width), gelu=nn.GELU(), c_proj=nn.Linear(4 * width, width))
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False, attn_mask=mask)[0]
        return x + self.mlp(self.ln_2(x))


class OpenClipTransformer(nn.Module):
    def __init__(self, width: int, heads: int, layers: int):
        super().__init__()
        self.resblocks = nn.ModuleList(OpenClipBlock(width, heads) for _ in range(layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.resblocks:
            x = block(x, mask)
        return x


class OpenClipVisual(nn.Module):
    """open_clip transformer.py VisionTransformer (class-token pooling, ln_post, proj)."""

    def __init__(self, cfg: dict, embed_dim: int):
        super().__init__()
        width, patch = cfg["width"], cfg["patch_size"]
        grid = cfg["image_size"] // patch
        self.conv1 = nn.Conv2d(3, width, kernel_size=patch, stride=patch, bias=False)
        self.class_embedding = nn.Parameter(0.02 * torch.randn(width))
        self.positional_embedding = nn.Parameter(0.02 * torch.randn(grid * grid + 1, width))
        self.ln_pre = nn.LayerNorm(width)
        self.transformer = OpenClipTransformer(width, width // cfg["head_width"], cfg["layers"])
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Parameter(width**-0.5 * torch.randn(width, embed_dim))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.conv1(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1) + self.positional_embedding
        x = self.transformer(self.ln_pre(x))
        return self.ln_post(x[:, 0]) @ self.proj


class OpenClipReference(nn.Module):
    """open_clip model.py CLIP: `encode_image`, `encode_text` (causal mask, pooled at argmax of the ids)."""

    def __init__(self, architecture: dict):
        super().__init__()
        text, embed_dim = architecture["text_cfg"], architecture["embed_dim"]
        self.visual = OpenClipVisual(architecture["vision_cfg"], embed_dim)
        self.token_embedding = nn.Embedding(text["vocab_size"], text["width"])
        self.positional_embedding = nn.Parameter(0.01 * torch.randn(text["context_length"], text["width"]))
        self.transformer = OpenClipTransformer(text["width"], text["heads"], text["layers"])
        self.ln_final = nn.LayerNorm(text["width"])
        self.text_projection = nn.Parameter(text["width"] ** -0.5 * torch.randn(text["width"], embed_dim))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def encode_text(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = self.token_embedding(ids) + self.positional_embedding[:length]
        mask = torch.full((length, length), float("-inf")).triu(1)
        x = self.ln_final(self.transformer(x, mask))
        return x[torch.arange(len(ids)), ids.argmax(-1)] @ self.text_projection


def save_tiny_hpsv2(folder: Path) -> tuple[dict, dict]:
    """An HPSv2-layout checkpoint ({"state_dict": open_clip keys} in a .pt) and a CLIP processor folder."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _openclip_tokenizer()
    architecture = {**TINY_OPENCLIP, "text_cfg": {**TINY_OPENCLIP["text_cfg"], "vocab_size": len(tokenizer)}}
    torch.manual_seed(0)
    reference = OpenClipReference(architecture)
    torch.save({"epoch": 1, "state_dict": reference.state_dict()}, folder / "HPS_v2_compressed.pt")
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder / "processor")
    return {"model": str(folder / "HPS_v2_compressed.pt"), "processor": str(folder / "processor")}, architecture


AESTHETIC_LAYERS = ("layers.0", "layers.2", "layers.4", "layers.6", "layers.7")  # its Linear layers, in order
AESTHETIC_WIDTHS = (1024, 128, 64, 16, 1)


def aesthetic_state_dict(input_size: int) -> dict[str, torch.Tensor]:
    """Random weights in the key layout of improved-aesthetic-predictor's .pth (simple_inference.py `MLP`:
    Linear-Dropout-Linear-Dropout-Linear-Dropout-Linear-Linear, so the Linears are layers 0, 2, 4, 6, 7)."""
    generator, state, width = torch.Generator().manual_seed(0), {}, input_size
    for name, out in zip(AESTHETIC_LAYERS, AESTHETIC_WIDTHS):
        state[f"{name}.weight"] = torch.randn(out, width, generator=generator) / width**0.5
        state[f"{name}.bias"] = torch.randn(out, generator=generator) * 0.1
        width = out
    return state


def aesthetic_reference(state: dict[str, torch.Tensor], embeddings: torch.Tensor) -> torch.Tensor:
    """The MLP at inference (dropout off, no activations): the Linear layers applied in turn."""
    for name in AESTHETIC_LAYERS:
        embeddings = nn.functional.linear(embeddings, state[f"{name}.weight"], state[f"{name}.bias"])
    return embeddings


def save_tiny_aesthetic(folder: Path) -> dict:
    clip = _save_tiny_clip(folder / "clip")
    torch.manual_seed(1)
    torch.save(aesthetic_state_dict(16), folder / "sac+logos+ava1-l14-linearMSE.pth")
    return {"model": str(clip), "head": str(folder / "sac+logos+ava1-l14-linearMSE.pth")}


class RobometerLayout(nn.Module):
    """The module tree of Robometer's RFM (rfm/models/rfm.py, heads from rfm/models/heads.py)."""

    def __init__(self, base: nn.Module, hidden: int):
        super().__init__()
        self.model = base
        self.progress_head = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, 1), nn.Sigmoid())
        self.preference_head = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, 1))
        self.similarity_head = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, 1))
        self.success_head = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, 1))


def save_tiny_robometer(backbone_dir: Path, folder: Path) -> RobometerLayout:
    """A Robometer-layout folder: the backbone's config and processor files, one safetensors holding
    `model.*` (the Qwen-VL base model) and the four heads."""
    base, _ = load_backbone(backbone_dir)
    torch.manual_seed(2)
    rfm = RobometerLayout(base, base.config.get_text_config().hidden_size)
    for module in rfm.modules():
        if isinstance(module, nn.LayerNorm):  # non-trivial affine parameters
            nn.init.normal_(module.weight, 1.0, 0.1), nn.init.normal_(module.bias, 0.0, 0.1)
    folder.mkdir(parents=True)
    for path in backbone_dir.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, folder / path.name)
    save_file({k: v.contiguous() for k, v in rfm.state_dict().items()}, folder / "model.safetensors")
    return rfm.eval()


def published_stand_in(config: dict, folder: Path, backbone) -> dict | None:
    """Overrides giving a shipped config of a published kind tiny weights of the same layout (None:
    not a published kind)."""
    kind = config["kind"]
    if kind in ("pickscore", "clip_score"):
        return {"model": str(_save_tiny_clip(folder)), "processor": None}
    if kind == "aesthetic":
        return save_tiny_aesthetic(folder)
    if kind == "hpsv2":
        paths, architecture = save_tiny_hpsv2(folder)
        return {**paths, "architecture": architecture}
    if kind == "topreward":
        return {"model": str(backbone(PUBLISHED_FAMILIES[config["model"]])), "answer": "yes", **SMALL_FRAMES}
    if kind == "robometer":
        save_tiny_robometer(backbone(PUBLISHED_FAMILIES[config["model"]]), folder)
        return {"model": str(folder), "device": "cpu", **SMALL_FRAMES}
    if kind == "sarm":
        return {**save_tiny_sarm_and_clip(folder), "device": "cpu"}
    return None


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    return build_tiny_backbone("qwen2_5_vl", tmp_path_factory.mktemp("published") / "qwen", num_layers=1)


def requests_for(texts=TEXTS) -> list[RewardRequest]:
    return [RewardRequest(FRAMES[: 1 + i], text) for i, text in enumerate(texts)]


def clip_reference(folder: Path, texts, frames) -> tuple[CLIPModel, torch.Tensor, torch.Tensor]:
    """Unit image and text embeddings as the PickScore README computes them (get_*_features, L2 norm)."""
    model, processor = CLIPModel.from_pretrained(folder).eval(), CLIPProcessor.from_pretrained(folder)
    with torch.no_grad():
        images = model.get_image_features(**processor(images=list(frames), return_tensors="pt")).pooler_output
        tokens = processor(text=list(texts), padding=True, truncation=True, return_tensors="pt")
        text = model.get_text_features(**tokens).pooler_output
    return model, images / images.norm(dim=-1, keepdim=True), text / text.norm(dim=-1, keepdim=True)


# ----------------------------------------------------------------------------- image rewards


def test_pickscore_is_scaled_cosine_and_prefers_by_softmax(tmp_path, one_torch_thread):
    folder = _save_tiny_clip(tmp_path / "pickscore")
    reward = build_reward({"kind": "pickscore", "model": str(folder)})
    check_reward(reward)
    model, images, texts = clip_reference(folder, [TEXTS[0]], FRAMES)
    expected = (model.logit_scale.exp() * (texts @ images.T))[0].detach().numpy()  # PickScore README
    result = reward.score([RewardRequest(FRAMES, TEXTS[0])])[0]
    np.testing.assert_allclose(result.progress, expected, rtol=1e-5, atol=1e-5)
    assert result.reward == pytest.approx(expected[-1], abs=1e-5)
    scale = float(model.logit_scale.detach().exp())
    assert reward.spec.value_range == pytest.approx((-scale, scale))
    pair = [RewardRequest(FRAMES[:1], TEXTS[0])], [RewardRequest(FRAMES[1:2], TEXTS[0])]
    probabilities = torch.softmax(torch.tensor(expected[:2]), 0).numpy()  # PickScore's preference over 2 images
    assert reward.prefer(*pair)[0] == pytest.approx(probabilities[0], abs=1e-6)


def test_clip_score_is_2_5_times_positive_cosine(tmp_path, one_torch_thread):
    folder = _save_tiny_clip(tmp_path / "clip")
    reward = build_reward({"kind": "clip_score", "model": str(folder)})
    check_reward(reward)
    assert reward.spec.value_range == (0.0, 2.5)
    signs = set()
    for text in TEXTS:
        _, images, texts = clip_reference(folder, [text], FRAMES)
        cosines = (texts @ images.T)[0].numpy()
        signs.update(np.sign(cosines))
        result = reward.score([RewardRequest(FRAMES, text)])[0]
        np.testing.assert_allclose(result.progress, 2.5 * np.maximum(cosines, 0.0), atol=1e-6)  # Hessel et al., eq. 1
    assert signs == {-1.0, 1.0}  # both sides of the max(cos, 0) were exercised


def test_hpsv2_maps_openclip_keys_and_scores_the_cosine(tmp_path, one_torch_thread):
    paths, architecture = save_tiny_hpsv2(tmp_path)
    reward = build_reward({"kind": "hpsv2", **paths, "architecture": architecture})
    check_reward(reward)
    reference = OpenClipReference(architecture)
    reference.load_state_dict(torch.load(paths["model"], weights_only=True)["state_dict"])
    processor = CLIPProcessor.from_pretrained(paths["processor"])
    for text in TEXTS:
        with torch.no_grad():  # tgxs002/HPSv2 score.py: diagonal of normalised image @ text features
            images = reference.visual(processor(images=list(FRAMES), return_tensors="pt")["pixel_values"])
            texts = reference.encode_text(processor(text=[text], return_tensors="pt")["input_ids"])
            expected = torch.nn.functional.cosine_similarity(images, texts).numpy()
        np.testing.assert_allclose(reward.score([RewardRequest(FRAMES, text)])[0].progress, expected, atol=1e-5)


def test_openclip_mapping_refuses_foreign_keys():
    with pytest.raises(ValueError, match="unexpected keys"):
        openclip_to_clip({"visual.trunk.stem.weight": torch.zeros(1)})


def test_aesthetic_is_the_mlp_of_the_normalised_image_embedding(tmp_path, one_torch_thread):
    paths = save_tiny_aesthetic(tmp_path)
    reward = build_reward({"kind": "aesthetic", **paths})
    check_reward(reward)
    state = torch.load(paths["head"], weights_only=True)
    _, images, _ = clip_reference(Path(paths["model"]), ["x"], FRAMES)
    with torch.no_grad():  # simple_inference.py: model(normalized(encode_image(image)))
        expected = aesthetic_reference(state, images).squeeze(-1).numpy()
    results = reward.score([RewardRequest(FRAMES, text) for text in TEXTS])
    for result in results:  # the text plays no part
        np.testing.assert_allclose(result.progress, expected, atol=1e-5)


def test_aesthetic_head_of_another_width_is_refused(tmp_path):
    paths = save_tiny_aesthetic(tmp_path)
    torch.save(aesthetic_state_dict(768), paths["head"])
    with pytest.raises(ValueError, match="16-d CLIP embeddings"):
        build_reward({"kind": "aesthetic", **paths})


def test_hub_file_offline_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="offline"):
        build_reward({"kind": "hpsv2", "model": "nobody/nothing/HPS.pt", "processor": "nobody/nothing"})


# ----------------------------------------------------------------------------- robot rewards


def test_topreward_is_normalised_log_p_true_over_prefixes(qwen_dir, one_torch_thread):
    params = {"kind": "topreward", "model": str(qwen_dir), "answer": "yes", "device": "cpu", **SMALL_FRAMES}
    reward = build_reward(params)
    assert reward.spec.dense and not reward.spec.causal
    check_reward(reward, atol=1e-4)
    model, processor = load_backbone(qwen_dir, with_lm_head=True)
    request = RewardRequest(FRAMES, TEXTS[1])
    question = reward.params.question.format(text=request.text)
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    log_p = []
    for t in range(1, 4):  # TOPReward qwen.py (add_chat_template): full prompt + answer, last token's log-prob
        text = f"<|im_start|>user\n{request.text}\n{image * t}\n{question}<|im_end|>\n<|im_start|>assistant\nyes"
        inputs = processor(text=[text], images=list(FRAMES[:t]), do_resize=False, return_tensors="pt")
        with torch.no_grad():
            logits = model(**inputs).logits[0, -2].float()
        log_p.append(float(logits.log_softmax(-1)[inputs["input_ids"][0, -1]]))
    result = reward.score([request])[0]
    np.testing.assert_allclose(result.info["log_p_prefixes"], log_p, atol=1e-4)
    curve = np.array(log_p)
    np.testing.assert_allclose(result.progress, (curve - curve.min()) / (curve.max() - curve.min()), atol=1e-3)
    assert result.reward == pytest.approx(math.exp(log_p[-1]), rel=1e-3)


def test_topreward_refuses_a_multi_token_answer(qwen_dir):
    with pytest.raises(ValueError, match="single token"):
        build_reward({"kind": "topreward", "model": str(qwen_dir), "device": "cpu", "answer": "True"})


def test_robometer_progress_and_success_heads(qwen_dir, tmp_path, one_torch_thread):
    rfm = save_tiny_robometer(qwen_dir, tmp_path / "robometer")
    reward = build_reward({"kind": "robometer", "model": str(tmp_path / "robometer"), "device": "cpu", **SMALL_FRAMES})
    assert reward.spec.components == ("success",) and reward.spec.causal
    check_reward(reward, atol=1e-4)
    builder = ClipInputBuilder(load_backbone(qwen_dir)[1], **SMALL_FRAMES)
    request = RewardRequest(FRAMES, TEXTS[0])
    inputs = builder.build([request]).model_inputs
    with torch.no_grad():  # rfm.py multi-image mode: mean of the hidden states between vision start/end
        hidden = rfm.model(**inputs).last_hidden_state[0]
        ids = inputs["input_ids"][0]
        starts = (ids == builder.processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")).nonzero()[:, 0]
        ends = (ids == builder.processor.tokenizer.convert_tokens_to_ids("<|vision_end|>")).nonzero()[:, 0]
        frames = torch.stack([hidden[s + 1 : e].mean(0) for s, e in zip(starts, ends)])
        progress = rfm.progress_head(frames)[:, 0].numpy()
        success = torch.sigmoid(rfm.success_head(frames))[:, 0].numpy()
    result = reward.score([request])[0]
    np.testing.assert_allclose(result.progress, progress, atol=1e-5)
    np.testing.assert_allclose(result.info["success_per_frame"], success, atol=1e-5)
    assert result.components["success"] == pytest.approx(success[-1], abs=1e-5)


def test_robometer_without_heads_is_refused(qwen_dir):
    with pytest.raises(ValueError, match="progress_head"):
        build_reward({"kind": "robometer", "model": str(qwen_dir), "device": "cpu"})
