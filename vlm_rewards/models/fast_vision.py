"""Qwen2.5-VL's vision tower for inference, without its per-window Python loop.

The tower's own forward runs attention once per window (and once per frame in its full-attention
layers): thousands of small SDPA calls for a batch of clips. `Qwen25Vision` runs the same modules
with one SDPA call per distinct window length, and is checked against the tower on the first call
with each image grid (in 16-bit types by a bound derived from the tower's own rounding error). Used
wherever no gradient flows into the tower: scoring (`RewardNetwork.forward` in inference), streaming
sessions, and training with a frozen tower (LoRA on the language model).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MAX_GRIDS = 1024  # cached grid geometries (shapes seen; a job sees a handful)


_VISIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fast_vision(backbone: torch.nn.Module) -> Qwen25Vision | None:
    """The backbone's fast vision path (shared by its sessions), or None where there is none."""
    visual = getattr(backbone, "visual", None)
    if visual is None or not Qwen25Vision.supports(visual):
        return None
    if visual not in _VISIONS:
        _VISIONS[visual] = Qwen25Vision(visual)
    return _VISIONS[visual]


class Qwen25Vision:
    """Qwen2.5-VL's vision tower for the frames of one step, with its per-call overhead cut.

    The same modules and float steps as the tower's `forward`, but: the grid-only tensors (rotary
    cos/sin, window order, chunk bounds) are computed once per grid list with the tower's own
    functions and cached; and attention runs as one batched SDPA call per distinct chunk length
    (windows, or whole frames) instead of one call per chunk. Used only for SDPA or eager attention,
    and only where no gradient flows into the tower (its own forward keeps its gradient checkpointing);
    the patch embedding (a Conv3d with stride = kernel) runs as the equal matrix
    product.

    The first call with an image grid (t, h, w) not seen before is checked against the tower's
    `forward` (and returns the tower's output); a failed check turns this path off for good:

    - float32 tower: max |fast − tower| <= 1e-5 × (max |tower| + 1), float rounding.
    - 16-bit tower: the two paths are the same function with operations grouped differently, so
      each differs from the exact result by its own rounding error. Both are compared with the
      tower run in float32 (a float32 copy made for the check, freed after) on the same 16-bit
      pixels, by `_token_error`; the fast path passes when its error is at most
      `BF16_ERROR_FACTOR` (2) x the tower's own 16-bit error, plus 1e-5 for the float32 run's
      error: it is as accurate as the tower. The factor 2 leaves room for the ratio of two errors
      of one size drawn from different roundings (the worst token of each); a real fault (a window
      dropped, a wrong weight) moves its tokens by O(1) of the output's scale, far beyond it.

    `check` holds the figures of the check that came closest to its bound (`summary()` for a bench).
    """

    def __init__(self, visual: torch.nn.Module):
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen2_5

        self.visual = visual
        self._rotary = qwen2_5.apply_rotary_pos_emb_vision
        self._vision_utils = importlib.import_module("transformers.vision_utils")
        self._geometry: dict[tuple, tuple] = {}
        self._checked: set[tuple[int, int, int]] = set()  # image grids whose first call was checked
        self.enabled = True
        self.max_abs_diff = 0.0  # the largest gap to the tower's forward seen in the checks
        self.check: dict[str, float | bool | None] | None = None

    @staticmethod
    def supports(visual: torch.nn.Module) -> bool:
        """Only the tower this was written against: another transformers version falls back to the tower."""
        if importlib.util.find_spec("transformers.vision_utils") is None:
            return False
        utils = importlib.import_module("transformers.vision_utils")
        helpers = ("get_vision_position_ids", "get_vision_cu_seqlens", "get_vision_window_index")
        return (
            all(hasattr(utils, name) for name in helpers)
            and hasattr(visual, "permute_input_for_window_attn")
            and type(visual).__name__ == "Qwen2_5_VisionTransformerPretrainedModel"
            and visual.config._attn_implementation in ("sdpa", "eager")
            and all(hasattr(visual, name) for name in ("patch_embed", "rotary_pos_emb", "blocks", "merger"))
        )

    def summary(self) -> dict:
        """Whether the path is on, and its checks' figures."""
        return {"enabled": self.enabled, "max_abs_diff": self.max_abs_diff, "check": self.check}

    def __call__(
        self, pixel_values: torch.Tensor, grid_thw: torch.Tensor, run: Callable | None = None
    ) -> torch.Tensor | None:
        """(tokens, hidden) merged image embeddings in the tower's order, or None (use the tower).

        run: what runs the checked fast path, `run(pixel_values, grid_thw, key)` (default `forward`; a
        streaming session passes it as a CUDA graph); the check itself always runs `forward`."""
        if not self.enabled or (torch.is_grad_enabled() and any(p.requires_grad for p in self.visual.parameters())):
            return None  # gradients must flow into the tower: its own forward (and its gradient checkpointing)
        with torch.no_grad():
            return self._features(pixel_values, grid_thw, run or self.forward)

    def _features(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor, run: Callable) -> torch.Tensor:
        key = tuple(map(tuple, grid_thw.tolist()))
        pixel_values = pixel_values.to(self.visual.dtype)
        if set(key) <= self._checked:
            return run(pixel_values, grid_thw, key)
        fast = self.forward(pixel_values, grid_thw, key)
        reference = self.visual(pixel_values, grid_thw=grid_thw).pooler_output
        figures = self._compare(fast, reference, pixel_values, grid_thw)
        self._checked.update(key)
        self.max_abs_diff = max(self.max_abs_diff, figures["max_abs_diff"])
        if self.check is None or figures["ratio"] > self.check["ratio"]:
            self.check = figures
        if not figures["agrees"]:
            self.enabled = False
        return reference

    def _compare(
        self, fast: torch.Tensor, reference: torch.Tensor, pixel_values: torch.Tensor, grid_thw: torch.Tensor
    ) -> dict[str, float | bool | None]:
        """The check's figures (see the class docstring); ratio = fast_error / bound, above 1 fails."""
        if fast.shape != reference.shape:
            return {"max_abs_diff": math.inf, "fast_error": math.inf, "reference_error": None, "bound": 0.0,
                    "ratio": math.inf, "agrees": False}  # fmt: skip
        max_abs_diff = float((fast.float() - reference.float()).abs().max())
        if reference.dtype.itemsize >= 4:
            bound = FLOAT32_RTOL * (float(reference.float().abs().max()) + 1.0)
            fast_error, reference_error = max_abs_diff, None
        else:
            exact = self._float32_forward(pixel_values, grid_thw)
            fast_error, reference_error = _token_error(fast, exact), _token_error(reference, exact)
            bound = BF16_ERROR_FACTOR * reference_error + FLOAT32_RTOL
        return {
            "max_abs_diff": max_abs_diff,
            "fast_error": fast_error,
            "reference_error": reference_error,
            "bound": bound,
            "ratio": fast_error / bound,
            "agrees": fast_error <= bound,
        }

    def _float32_forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """The tower's forward in float32 on the same (16-bit) pixels, by a float32 copy freed on return."""
        tower = copy.deepcopy(self.visual).float()
        try:
            return tower(pixel_values.float(), grid_thw=grid_thw).pooler_output
        finally:
            del tower

    def _grid(self, grid_thw: torch.Tensor, key: tuple) -> tuple:
        geometry = self._geometry.get(key)
        if geometry is not None:
            return geometry
        visual, utils = self.visual, self._vision_utils
        position_ids = utils.get_vision_position_ids(grid_thw, visual.spatial_merge_size)
        cu_seqlens = utils.get_vision_cu_seqlens(grid_thw)
        window_index, cu_window_seqlens = utils.get_vision_window_index(
            grid_thw, spatial_merge_size=visual.spatial_merge_size, window_size=visual.window_size,
            patch_size=visual.patch_size,
        )  # fmt: skip
        seq_len = int(cu_seqlens[-1])
        probe = torch.zeros(seq_len, 1, dtype=visual.dtype, device=grid_thw.device)
        cos, sin = visual.rotary_pos_emb(probe, position_ids)
        cos, sin = (visual.permute_input_for_window_attn(f, window_index, seq_len=seq_len) for f in (cos, sin))
        full, windows = (
            _buckets(torch.unique_consecutive(torch.as_tensor(bounds)).tolist(), grid_thw.device)
            for bounds in (cu_seqlens, cu_window_seqlens)
        )
        geometry = (window_index, torch.argsort(window_index), cos, sin, full, windows, seq_len)
        if len(self._geometry) >= MAX_GRIDS:
            self._geometry.clear()
        self._geometry[key] = geometry
        return geometry

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor, key: tuple) -> torch.Tensor:
        """The fast path, unchecked: `key` is `grid_thw` as a tuple of (t, h, w) tuples."""
        visual = self.visual
        window_index, reverse, cos, sin, full, windows, seq_len = self._grid(grid_thw, key)
        # patch_embed is a Conv3d whose stride is its kernel: one matrix product per patch (CPU conv3d is slow here)
        proj = visual.patch_embed.proj
        hidden = F.linear(pixel_values.reshape(len(pixel_values), -1).to(proj.weight.dtype),
                          proj.weight.reshape(len(proj.weight), -1), proj.bias)  # fmt: skip
        hidden = visual.permute_input_for_window_attn(hidden, window_index, seq_len=seq_len)
        for number, block in enumerate(visual.blocks):
            buckets = full if number in visual.fullatt_block_indexes else windows
            attn = block.attn
            query, key_, value = (
                attn.qkv(block.norm1(hidden)).reshape(seq_len, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
            )
            query, key_ = self._rotary(query, key_, cos, sin)
            out = _chunked_attention(query, key_, value, buckets, attn.scaling)
            hidden = hidden + attn.proj(out.reshape(seq_len, -1).contiguous())
            hidden = hidden + block.mlp(block.norm2(hidden))
        return visual.merger(hidden)[reverse, :]


FLOAT32_RTOL = 1e-5  # float32 rounding relative to the output's scale: the float32 check, the float32 run's error
BF16_ERROR_FACTOR = 2.0  # a 16-bit fast path may be this many times as far from float32 as the tower is


def _token_error(output: torch.Tensor, exact: torch.Tensor) -> float:
    """Largest per-token ‖output − exact‖ over the RMS token norm of `exact`: the worst token's error,
    relative to the output's scale (a norm over the hidden size, so two roundings of one function give
    close figures, while a fault confined to a few tokens still shows in full)."""
    exact = exact.float()
    scale = exact.norm(dim=-1).square().mean().sqrt().clamp(min=torch.finfo(torch.float32).tiny)
    return float((output.float() - exact).norm(dim=-1).max() / scale)


@dataclass(frozen=True)
class _Bucket:
    """The chunks of one length: their tokens, chunk after chunk (None: every token, in order)."""

    length: int
    index: torch.Tensor | None


def _buckets(bounds: list[int], device: torch.device) -> list[_Bucket]:
    """Chunks [bounds[i], bounds[i + 1]) grouped by length: attention takes one call per distinct length."""
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    if len(set(lengths)) == 1:
        return [_Bucket(lengths[0], None)]
    starts: dict[int, list[int]] = {}
    for start, length in zip(bounds[:-1], lengths):
        starts.setdefault(length, []).append(start)
    return [
        _Bucket(length, (torch.tensor(firsts)[:, None] + torch.arange(length)).flatten().to(device))
        for length, firsts in starts.items()
    ]


def _chunked_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, buckets: list[_Bucket], scale: float
) -> torch.Tensor:
    """Bidirectional attention within chunks of (S, heads, d) tensors -> (S, heads, d): one SDPA call per bucket."""
    if buckets[0].index is None:
        return _batched_attention(query, key, value, buckets[0].length, scale)
    output = torch.empty_like(query)
    for bucket in buckets:
        output[bucket.index] = _batched_attention(
            query[bucket.index], key[bucket.index], value[bucket.index], bucket.length, scale
        )
    return output


def _batched_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, length: int, scale: float
) -> torch.Tensor:
    """Attention within consecutive chunks of `length` tokens of (S, heads, d) tensors, as one batch."""
    q, k, v = (t.unflatten(0, (-1, length)).transpose(1, 2) for t in (query, key, value))  # (S / length, H, length, d)
    return F.scaled_dot_product_attention(q, k, v, scale=scale).transpose(1, 2).flatten(0, 1)
