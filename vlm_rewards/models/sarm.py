"""SARM (Stage-Aware Reward Modeling, Chen et al. 2025, arXiv:2509.25358) checkpoints trained with LeRobot.

Ported by hand from huggingface/lerobot `policies/sarm` (later `rewards/sarm`): modeling_sarm.py
(`StageTransformer`, `SubtaskTransformer`, `SARMRewardModel.calculate_rewards`), sarm_utils.py
(`normalize_stage_tau`, `temporal_proportions_to_breakpoints`) and processor_sarm.py (the CLIP encoding).

- Inputs per frame: the CLIP image features (`get_image_features`: projected, not normalised), the
  instruction's CLIP text features, and the robot's joint state (zero-padded to `max_state_dim`).
- Two transformers of one layout. Each projects its streams to `hidden_dim`: the frames (plus a learned
  bias on frame 0), the text repeated at every frame, the state and, for the subtask model, the one-hot
  stage zero-padded to `hidden_dim`. The streams are laid out one after the other (all frames, then all
  texts, ...) under a causal mask over that order; frame t's outputs of every stream are concatenated
  and fused (LayerNorm, Linear, ReLU) before a head per annotation scheme (`sparse`, `dense`).
- The stage model gives per frame the logits over the scheme's stages. The subtask model, conditioned
  on the one-hot argmax stage k, gives τ = σ(head) ∈ [0, 1], the progress within stage k.
- progress = start[k] + τ · share[k]: share[k] is stage k's temporal proportion (its prior share of an
  episode, stored in the checkpoint's config; uniform without one) and start[k] the summed shares of the
  stages before k, i.e. the prior of the completed stages plus the progress within the current one.

Not causal: in the stream-after-stream order, frame t's text and state tokens come after every frame's
visual token, so progress[t] also reads later frames.

Joint state: `RewardRequest` carries none, so the state stream is zero, as in LeRobot's
`calculate_rewards` when it is given no state. LeRobot normalises the state by the dataset's mean and
std first, so zero stands for the dataset's mean state, whatever the robot actually does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pydantic
import torch
import torch.nn.functional as F
from huggingface_hub import snapshot_download
from safetensors.torch import load_file
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from transformers import CLIPModel, CLIPProcessor

from vlm_rewards.config import Settings
from vlm_rewards.fingerprint import fingerprint, weights_fingerprint
from vlm_rewards.interface import BaseReward, RewardRequest, RewardResult, RewardSpec
from vlm_rewards.models.device import resolve_device
from vlm_rewards.models.hub import resolve_checkpoint
from vlm_rewards.models.image_scores import DType, clip_image_features, clip_text_features, load_clip
from vlm_rewards.registry import register

Scheme = Literal["sparse", "dense"]
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"  # LeRobot's PreTrainedPolicy.save_pretrained


class SarmCheckpointConfig(pydantic.BaseModel):
    """The fields of the checkpoint's config.json (LeRobot's `SARMConfig`, with its defaults) that scoring reads."""

    model_config = pydantic.ConfigDict(extra="ignore", use_attribute_docstrings=True)

    type: Literal["sarm"] = "sarm"
    """LeRobot's model type."""
    annotation_mode: Literal["single_stage", "dense_only", "dual"] = "single_stage"
    """single_stage: one sparse stage; dense_only: dense stages and one sparse stage; dual: both trained."""
    image_dim: int = pydantic.Field(512, gt=0)
    """Width of the CLIP image features."""
    text_dim: int = pydantic.Field(512, gt=0)
    """Width of the CLIP text features."""
    hidden_dim: int = pydantic.Field(768, gt=0)
    """Width of both transformers."""
    num_heads: int = pydantic.Field(12, gt=0)
    """Attention heads per layer."""
    num_layers: int = pydantic.Field(8, gt=0)
    """Encoder layers per transformer."""
    max_state_dim: int = pydantic.Field(32, gt=0)
    """Width of the (zero-padded) joint state."""
    n_obs_steps: int = pydantic.Field(8, ge=0)
    """Frames of context around the scored one; a training clip has 1 + n_obs_steps frames."""
    num_sparse_stages: int = pydantic.Field(1, ge=1)
    """Stages of the sparse (high-level) scheme."""
    sparse_subtask_names: list[str] | None = None
    """Their names, in order."""
    sparse_temporal_proportions: list[float] | None = None
    """Their shares of an episode's duration, in order."""
    num_dense_stages: int | None = pydantic.Field(None, ge=1)
    """Stages of the dense (fine-grained) scheme; None: no dense annotations."""
    dense_subtask_names: list[str] | None = None
    """Their names, in order."""
    dense_temporal_proportions: list[float] | None = None
    """Their shares of an episode's duration, in order."""

    def head_sizes(self) -> dict[str, int]:
        """Outputs of the stage model's heads (LeRobot sizes the dense one like the sparse one without dense stages)."""
        return {"sparse": self.num_sparse_stages, "dense": self.num_dense_stages or self.num_sparse_stages}


class SarmTransformer(nn.Module):
    """SARM's `StageTransformer` (`stage_conditioned=False`) or `SubtaskTransformer` (True), one camera,
    with LeRobot's parameter names so its checkpoints load as they are."""

    def __init__(self, config: SarmCheckpointConfig, head_sizes: dict[str, int], stage_conditioned: bool):
        super().__init__()
        width = config.hidden_dim
        self.lang_proj = nn.Linear(config.text_dim, width)
        self.visual_proj = nn.Linear(config.image_dim, width)
        self.state_proj = nn.Linear(config.max_state_dim, width)
        layer = nn.TransformerEncoderLayer(width, config.num_heads, 4 * width, dropout=0.0, batch_first=True)
        self.transformer = nn.TransformerEncoder(layer, config.num_layers)
        self.first_pos = nn.Parameter(torch.zeros(1, width))
        fused = width * (4 if stage_conditioned else 3)  # frames, text, state (+ stage)
        self.fusion_backbone = nn.Sequential(nn.LayerNorm(fused), nn.Linear(fused, width), nn.ReLU())
        self.heads = nn.ModuleDict({scheme: nn.Linear(width, size) for scheme, size in head_sizes.items()})

    def forward(
        self,
        frames: torch.Tensor,
        text: torch.Tensor,
        state: torch.Tensor,
        padding: torch.Tensor,
        scheme: str,
        stage: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T, outputs) of the scheme's head from frames (B, T, image_dim), text (B, text_dim), state
        (B, T, max_state_dim), padding (B, T), True past a clip's end, and a one-hot stage (B, T, C)."""
        length, width = frames.shape[1], self.first_pos.shape[-1]
        visual = self.visual_proj(frames)
        visual = torch.cat([visual[:, :1] + self.first_pos, visual[:, 1:]], dim=1)
        streams = [visual, self.lang_proj(text)[:, None].expand(-1, length, -1), self.state_proj(state)]
        if stage is not None:
            stage = stage[..., :width]
            streams.append(F.pad(stage, (0, width - stage.shape[-1])))
        tokens = torch.cat(streams, dim=1)  # (B, S·T, D): stream after stream
        causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool, device=tokens.device).triu(1)
        hidden = self.transformer(
            tokens, mask=causal, src_key_padding_mask=padding.repeat(1, len(streams)), is_causal=True
        )
        per_frame = hidden.unflatten(1, (len(streams), length)).transpose(1, 2).flatten(2)  # (B, T, S·D)
        return self.heads[scheme](self.fusion_backbone(per_frame))


def sarm_folder(name: str) -> Path:
    """The local folder of a SARM checkpoint: `name` itself, its cached snapshot, or its files downloaded."""
    folder = resolve_checkpoint(name, f"sarm: a LeRobot SARM checkpoint folder ({CONFIG_FILE}, {WEIGHTS_FILE})")
    if not Path(folder).exists():  # a hub id, not cached, and the hub is reachable
        folder = snapshot_download(folder, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE])
    return Path(folder)


def read_sarm_config(folder: Path) -> SarmCheckpointConfig:
    """The checkpoint's config.json, validated."""
    path = folder / CONFIG_FILE
    try:
        return SarmCheckpointConfig.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as error:  # pydantic.ValidationError and JSONDecodeError are ValueErrors
        raise ValueError(f"sarm: {path} is not the config.json of a LeRobot SARM checkpoint: {error}") from None


def load_sarm_models(folder: Path, config: SarmCheckpointConfig) -> nn.ModuleDict:
    """The stage and subtask transformers with the weights of the checkpoint's model.safetensors."""
    path = folder / WEIGHTS_FILE
    try:
        weights = load_file(path)
    except (OSError, ValueError) as error:  # SafetensorError is an OSError
        raise ValueError(
            f"sarm: could not read {path}; expected the weights of a LeRobot SARM checkpoint: {error}"
        ) from None
    models = nn.ModuleDict(
        {
            "stage_model": SarmTransformer(config, config.head_sizes(), stage_conditioned=False),
            "subtask_model": SarmTransformer(config, {"sparse": 1, "dense": 1}, stage_conditioned=True),
        }
    )
    for name, model in models.items():
        state = {key.removeprefix(f"{name}."): value for key, value in weights.items() if key.startswith(f"{name}.")}
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as error:
            raise ValueError(
                f"sarm: {path} {name} does not fit {path.with_name(CONFIG_FILE)}; expected LeRobot's SARM layout "
                f"(stage_model.*, subtask_model.*) in the sizes the config gives: {error}"
            ) from None
    return models.eval()


def stage_priors(config: SarmCheckpointConfig, scheme: Scheme) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The scheme's stage names and, per stage, start (the summed shares of the stages before it) and
    share (its temporal proportion, normalised to sum 1; uniform when the config has none)."""
    if scheme == "dense" and (config.annotation_mode == "single_stage" or config.num_dense_stages is None):
        raise ValueError(
            f"sarm: the checkpoint was trained in annotation_mode {config.annotation_mode} with "
            f"num_dense_stages {config.num_dense_stages}, so it has no trained dense head; use scheme: sparse"
        )
    count = config.num_sparse_stages if scheme == "sparse" else config.num_dense_stages
    names = getattr(config, f"{scheme}_subtask_names") or [f"stage {k}" for k in range(count)]
    proportions = getattr(config, f"{scheme}_temporal_proportions") or [1.0] * count
    shares = np.asarray(proportions, dtype=np.float64)
    if len(names) != count or len(shares) != count or (shares < 0).any() or shares.sum() <= 0:
        raise ValueError(
            f"sarm: the checkpoint's {scheme} stages are {count}, with names {names} and temporal proportions "
            f"{proportions}; expected one name and one non-negative proportion per stage"
        )
    bounds = np.concatenate([[0.0], np.cumsum(shares / shares.sum())])
    bounds[-1] = 1.0  # as LeRobot's breakpoints: the last stage ends at exactly 1
    return names, bounds[:-1], np.diff(bounds)


@register("sarm")
class SARMReward(BaseReward):
    """progress[t] = SARM's overall progress at frame t ∈ [0, 1]; reward = the last frame's progress;
    components: stage (the most likely stage at the last frame, as a float) and stage_progress (τ there);
    info: stage_per_frame, stage_probabilities (per frame, per stage), stage_progress_per_frame.

    Reference frames and extra views are not shown (SARM scores one camera); the joint state is zero."""

    class Params(Settings):
        name: str = "sarm"
        """The reward's name in results, logs and reports."""
        model: str = pydantic.Field(min_length=1)
        """Hub id or folder of a LeRobot SARM checkpoint: config.json (SARMConfig) and model.safetensors."""
        clip: str = "openai/clip-vit-base-patch32"
        """Hub id or folder of the CLIP model and processor SARM's features come from (LeRobot's is this one)."""
        scheme: Scheme = "sparse"
        """Which stages to read: sparse (high-level) or dense (fine-grained; dense_only or dual checkpoints)."""
        max_frames: int | None = pydantic.Field(None, ge=1)
        """Longest clip accepted; None: SARM's window, 1 + the checkpoint's n_obs_steps (9 by default)."""
        batch_size: int = pydantic.Field(32, gt=0)
        """Frames per CLIP forward pass, and clips per SARM forward pass."""
        device: str = "cpu"
        """auto (cuda when present, else cpu) or a torch device string."""
        dtype: DType = "float32"
        """The CLIP model's dtype (SARM's transformers run in float32)."""

    def __init__(
        self,
        clip: CLIPModel,
        processor: CLIPProcessor,
        models: nn.ModuleDict,
        config: SarmCheckpointConfig,
        params: Params,
        weights: object,
    ):
        """`weights`: what identifies the SARM and CLIP checkpoint files, folded into the version."""
        self.params = params
        self.device = resolve_device(params.device)
        self.clip, self.processor = clip.to(self.device).eval(), processor
        self.models = models.to(self.device).eval()
        self.state_dim = config.max_state_dim
        self.stage_names, start, share = stage_priors(config, params.scheme)
        self.stage_start, self.stage_share = (torch.as_tensor(x, device=self.device) for x in (start, share))
        self.spec = RewardSpec(
            name=params.name,
            version=fingerprint("sarm", params.model_dump(exclude={"device", "batch_size", "name"}), weights),
            value_range=(0.0, 1.0),
            dense=True,
            causal=False,  # frame t's text and state tokens attend to every frame (see the module docstring)
            components=("stage", "stage_progress"),
            frame_size=None,  # the CLIP processor resizes any frame
            max_frames=params.max_frames or 1 + config.n_obs_steps,
        )

    @classmethod
    def from_params(cls, params: Params) -> SARMReward:
        folder = sarm_folder(params.model)
        config = read_sarm_config(folder)
        models = load_sarm_models(folder, config)
        clip, processor, clip_weights = load_clip(params.clip, None, params.name, params.dtype)
        return cls(clip, processor, models, config, params, (weights_fingerprint(folder), clip_weights))

    @torch.inference_mode()
    def _score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        frames = [frame for request in requests for frame in request.frames]
        size = self.params.batch_size
        images = clip_image_features(self.clip, self.processor, frames, size)
        texts = clip_text_features(self.clip, self.processor, [request.text for request in requests])
        clips = images.split([request.num_frames for request in requests])
        return [
            result
            for i in range(0, len(requests), size)
            for result in self.clip_results(clips[i : i + size], texts[i : i + size])
        ]

    def clip_results(self, clips: Sequence[torch.Tensor], texts: torch.Tensor) -> list[RewardResult]:
        """Results for clips of CLIP image features (T_i, image_dim) and their texts' features (B, text_dim)."""
        lengths = [len(clip) for clip in clips]
        frames = pad_sequence(list(clips), batch_first=True)
        padding = (
            torch.arange(frames.shape[1], device=self.device) >= torch.tensor(lengths, device=self.device)[:, None]
        )
        state = frames.new_zeros(*frames.shape[:2], self.state_dim)
        scheme = self.params.scheme
        probabilities = self.models["stage_model"](frames, texts, state, padding, scheme).softmax(-1)
        stage = probabilities.argmax(-1)
        one_hot = F.one_hot(stage, probabilities.shape[-1]).float()
        tau = torch.sigmoid(self.models["subtask_model"](frames, texts, state, padding, scheme, one_hot)).squeeze(-1)
        progress = (self.stage_start[stage] + tau.double() * self.stage_share[stage]).clamp(0.0, 1.0)
        arrays = (x.cpu().numpy() for x in (progress, stage, tau.double(), probabilities.double()))
        results = []
        for length, progress, stage, tau, probabilities in zip(lengths, *arrays):
            progress, stage, tau = progress[:length], stage[:length], tau[:length]
            results.append(
                RewardResult(
                    reward=float(progress[-1]),
                    progress=progress,
                    components={"stage": float(stage[-1]), "stage_progress": float(tau[-1])},
                    info={
                        "stage_per_frame": stage.tolist(),
                        "stage_probabilities": probabilities[:length].tolist(),
                        "stage_progress_per_frame": tau.tolist(),
                    },
                )
            )
        return results
