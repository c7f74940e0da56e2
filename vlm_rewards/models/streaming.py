"""Incremental scoring of growing clips with a KV cache: one forward over the new frames per step.

An RL env adds a frame per step. Scoring the whole prefix each step costs O(T) forwards' worth of
tokens per step, O(T²) per episode. A progress RM is causal (frame t reads the instruction, the
reference and frames <= t, see `vlm_rewards.models.inputs`), so the hidden states of the prefix never
change once computed: `KVCacheSession` keeps each stream's key/value cache and runs only the tokens of
the new frames, giving the values `RewardNetwork.predict` gives for the same frames as part of the
whole clip (up to float rounding).

Per stream the token sequence is exactly `ClipInputBuilder`'s layout, cut in pieces:

    open / reset:  <|im_start|>user\\n [Goal: IMAGE...\\n] {text}\\n        -> cache
    append(k):     IMAGE IMAGE ... (k steps x (main view, extra views by name)) -> cache, k readouts

(the trailing `<|im_end|>\\n` of a full clip comes after every frame, so no frame's value sees it).
Each piece is built by the model's processor (the builder's resizing, then `do_resize=False`), so
pixels and token counts are the builder's.

Positions: Qwen-VL models use multimodal RoPE. Text tokens advance one position each; an image block
of h x w merged tokens takes positions (t, row, col) offset by the position where it starts, and the
next token starts at that offset + max(h, w). `get_rope_index` (the same for Qwen2-VL, Qwen2.5-VL and
Qwen3-VL on still images: Qwen2.5-VL's time scaling applies to videos only, Qwen3-VL's timestamp
splitting too) computes this for a sequence starting at 0, and every later position is relative to
where the piece starts; so a piece's positions are `get_rope_index(piece) + offset`, with offset =
(largest position so far) + 1. They are passed as explicit (3, B, L) `position_ids` (for all three
families the language model takes 3 rows as (t, h, w); a 4-row form would prepend text positions
for packed sequences, which this does not use) so the model's own `rope_deltas` bookkeeping is never
involved.

Batching: one `append` runs every stream's new frames in one forward. Streams have caches of
different lengths (resets, uneven appends), so each step the per-stream caches are left-padded to the
longest and the new pieces right-padded, with a 2D attention mask hiding both paddings; afterwards
each stream's real keys/values are sliced back out. Positions are explicit, so padding never shifts
them. Copying the caches into the batch costs O(total cache size) memory traffic per step, small next
to attention over the same cache, which any cached step pays.

Only full-attention caches are supported (all Qwen-VL text models here); sliding-window layers would
need the padding to move with the window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache

from vlm_rewards.interface import RewardSession, RewardSpec, validate_clip
from vlm_rewards.models.inputs import IMAGE_PLACEHOLDER
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.models.tokenizer import IM_START

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each (1, kv_heads, L, head_dim)


@dataclass
class _StreamState:
    """What one stream keeps between appends."""

    text: str
    cache: KV
    next_position: int  # the M-RoPE position the next token starts at (largest so far + 1)
    num_frames: int = 0
    frame_size: tuple[int, int] | None = None  # (H, W) of the first append; later appends must match
    view_sizes: dict[str, tuple[int, int]] | None = None  # name -> (H, W), fixed by the first append
    input_ids: list[torch.Tensor] = field(default_factory=list)  # the pieces run so far, for checks

    @property
    def cache_length(self) -> int:
        return int(self.cache[0][0].shape[-2]) if self.cache else 0


@dataclass
class _Piece:
    """The tokens (and images) to run for one stream in one forward."""

    text: str
    images: list[np.ndarray]
    views_per_step: int  # readouts: every `views_per_step`-th <|vision_end|>; 0 for a prefix (none)


class KVCacheSession(RewardSession):
    """B streams (one per env) scored incrementally by a progress `RewardNetwork` with a KV cache.

    network: a `RewardNetwork` with `config.task == "progress"`; put in eval mode here.
    texts: the instruction of each stream.
    references: per stream the (R, H, W, 3) uint8 goal frames or None; used only when the network's
        `config.use_reference` is set, and then required.
    spec: optional, the adapter's `RewardSpec`; its `frame_size` bounds are then checked as `score`
        checks them (the network's own minimum side is checked always).

    `append(frames, views)` returns per stream the progress of its new frames, equal to
    `network.predict` on the whole clip so far; it refuses (ValueError naming `frames[i]` / stream i)
    a stream going past `config.max_frames`, frames too small or not (k, H, W, 3) uint8, a frame size
    or view set other than the stream's first append, before running anything, so a refused call
    leaves the session unchanged.
    """

    def __init__(
        self,
        network: RewardNetwork,
        texts: Sequence[str],
        references: Sequence[np.ndarray | None] | None = None,
        *,
        spec: RewardSpec | None = None,
    ):
        if network.config.task != "progress":
            raise ValueError(f"KVCacheSession: needs a progress network, this one is a {network.config.task!r} model")
        text_config = network.backbone.config.get_text_config()
        layer_types = getattr(text_config, "layer_types", None) or ["full_attention"]
        if any(kind != "full_attention" for kind in layer_types):
            raise ValueError(
                f"KVCacheSession: only full-attention models are supported, got layer types {set(layer_types)}"
            )
        if isinstance(texts, str) or len(texts) == 0:
            raise ValueError("open_session: texts: expected a non-empty sequence of instructions, one per stream")
        references = [None] * len(texts) if references is None else list(references)
        if len(references) != len(texts):
            raise ValueError(f"open_session: {len(texts)} texts but {len(references)} references")
        self.network = network.eval()
        self.spec = spec
        self._builder = network.builder
        self._vision_end_id = self._builder.vision_end_id
        self._closed = False
        for i, (text, reference) in enumerate(zip(texts, references)):
            self._check_start(text, reference, f"texts[{i}]", f"references[{i}]")
        self._streams: list[_StreamState] = [None] * len(texts)  # type: ignore[list-item]
        self._start(list(range(len(texts))), list(texts), references)

    # ------------------------------------------------------------------------------------ interface

    @property
    def num_frames(self) -> list[int]:
        return [stream.num_frames for stream in self._streams]

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def reset(self, index: int, text: str, reference: np.ndarray | None = None) -> None:
        self._check_open()
        if not isinstance(index, int) or not 0 <= index < len(self._streams):
            raise ValueError(f"reset: stream index {index!r}; expected 0..{len(self._streams) - 1}")
        self._check_start(text, reference, "text", "reference")
        self._start([index], [text], [reference])

    def append(
        self, frames: Sequence[np.ndarray], views: Sequence[Mapping[str, np.ndarray]] | None = None
    ) -> list[np.ndarray]:
        self._check_open()
        if isinstance(frames, np.ndarray) or not isinstance(frames, Sequence):
            raise ValueError(
                f"append: frames: expected a sequence of one (k, H, W, 3) array per stream, got {type(frames).__name__}"
            )
        views = [{}] * len(frames) if views is None else list(views)
        if not len(frames) == len(views) == len(self._streams):
            raise ValueError(
                f"append: {len(frames)} frame arrays and {len(views)} view dicts for {len(self._streams)} streams"
            )
        pieces = []
        for i, (stream, new, new_views) in enumerate(zip(self._streams, frames, views)):
            pieces.append(self._check_append(i, stream, new, new_views))
        # Everything checked: from here on the session changes.
        for stream, new, new_views in zip(self._streams, frames, views):
            if stream.frame_size is None:
                stream.frame_size = tuple(new.shape[1:3])
                stream.view_sizes = {name: tuple(view.shape[1:3]) for name, view in new_views.items()}
        values = self._run(list(range(len(self._streams))), pieces)
        for stream, new in zip(self._streams, frames):
            stream.num_frames += len(new)
        return values

    def close(self) -> None:
        """Drop every stream's cache; the session cannot be used afterwards."""
        self._closed = True
        for stream in self._streams:
            stream.cache = []

    def input_ids(self, index: int) -> torch.Tensor:
        """(L,) the token ids stream `index` has run so far (its prefix and every appended frame)."""
        return torch.cat(self._streams[index].input_ids)

    # ----------------------------------------------------------------------------------- checks

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("KVCacheSession: the session is closed")

    def _check_start(self, text: str, reference: np.ndarray | None, text_name: str, reference_name: str) -> None:
        self._builder._check_text(text, text_name)
        if not self.network.config.use_reference:
            return
        if reference is None:
            raise ValueError(f"{reference_name}: this model needs reference/goal frames (use_reference), got None")
        self._check_frames(reference, reference_name)

    def _check_frames(self, frames: np.ndarray, name: str) -> None:
        validate_clip(frames, name, self.spec)
        self._builder.vision.frame_size(frames.shape[1], frames.shape[2], name)  # raises if too small

    def _check_append(
        self, index: int, stream: _StreamState, frames: np.ndarray, views: Mapping[str, np.ndarray]
    ) -> _Piece:
        name = f"frames[{index}]"
        self._check_frames(frames, name)
        count = len(frames)
        max_frames = self.network.config.max_frames
        if stream.num_frames + count > max_frames:
            raise ValueError(
                f"{name}: stream {index} has {stream.num_frames} frames; {count} more would exceed the model's "
                f"max_frames={max_frames} (reset the stream, or subsample the episode)"
            )
        if stream.frame_size is not None and tuple(frames.shape[1:3]) != stream.frame_size:
            raise ValueError(
                f"{name}: frames of {frames.shape[1]}x{frames.shape[2]}, stream {index} began with "
                f"{stream.frame_size[0]}x{stream.frame_size[1]}"
            )
        if not isinstance(views, Mapping):
            raise ValueError(f"views[{index}]: expected a mapping of view name -> frames, got {type(views).__name__}")
        if stream.view_sizes is not None and set(views) != set(stream.view_sizes):
            raise ValueError(
                f"views[{index}]: views {sorted(views)}, stream {index} began with {sorted(stream.view_sizes)}"
            )
        for view_name, view in views.items():
            where = f"views[{index}][{view_name!r}]"
            self._check_frames(view, where)
            if len(view) != count:
                raise ValueError(f"{where}: {len(view)} frames, expected {count} (as frames[{index}])")
            if stream.view_sizes is not None and tuple(view.shape[1:3]) != stream.view_sizes[view_name]:
                raise ValueError(
                    f"{where}: frames of {view.shape[1]}x{view.shape[2]}, stream {index} began with "
                    f"{stream.view_sizes[view_name][0]}x{stream.view_sizes[view_name][1]}"
                )
        resize = self._builder.vision.resize
        resized = [resize(frames, name)]
        resized += [resize(views[view_name], f"views[{index}][{view_name!r}]") for view_name in sorted(views)]
        images = [view[t] for t in range(count) for view in resized]  # per step: main view, then views by name
        return _Piece(IMAGE_PLACEHOLDER * len(images), images, views_per_step=len(resized))

    # ------------------------------------------------------------------------------------ model

    def _start(self, indices: list[int], texts: list[str], references: list[np.ndarray | None]) -> None:
        """Run the prefixes of `indices` (one forward) and make them fresh streams."""
        pieces = []
        for index, text, reference in zip(indices, texts, references):
            parts, images = [f"{IM_START}user\n"], []
            if self.network.config.use_reference:
                images = list(self._builder.vision.resize(reference, f"references[{index}]"))
                parts.append("Goal: " + IMAGE_PLACEHOLDER * len(images) + "\n")
            parts.append(text + "\n")
            pieces.append(_Piece("".join(parts), images, views_per_step=0))
        for index, text in zip(indices, texts):
            self._streams[index] = _StreamState(text=text, cache=[], next_position=0)
        self._run(indices, pieces)

    @torch.inference_mode()
    def _run(self, indices: list[int], pieces: list[_Piece]) -> list[np.ndarray]:
        """One forward of `pieces[j]` on top of stream `indices[j]`'s cache; updates the streams and
        returns per stream the progress at the readouts of its piece."""
        network, device = self.network, self.network.device
        streams = [self._streams[i] for i in indices]
        images = [image for piece in pieces for image in piece.images]
        inputs = network.processor(
            text=[piece.text for piece in pieces],
            images=images or None,
            do_resize=False,
            padding=True,
            padding_side="right",
            return_tensors="pt",
        ).to(device)
        input_ids, new_mask = inputs["input_ids"], inputs["attention_mask"]
        image_grid_thw = inputs.get("image_grid_thw")
        lengths = new_mask.sum(1).tolist()

        # M-RoPE positions of each piece as if it started the sequence, shifted to where it starts.
        positions, _ = network.backbone.get_rope_index(
            input_ids,
            mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=image_grid_thw,
            attention_mask=new_mask,
        )
        offsets = torch.tensor([stream.next_position for stream in streams], device=device)
        positions = positions + offsets.view(1, -1, 1)

        # Caches left-padded to the longest, pieces right-padded: one mask hides both.
        past_lengths = [stream.cache_length for stream in streams]
        longest = max(past_lengths)
        past_mask = torch.zeros(len(streams), longest, dtype=new_mask.dtype, device=device)
        cache = DynamicCache()
        if longest:
            for b, length in enumerate(past_lengths):
                past_mask[b, longest - length :] = 1
            layers = []
            for layer in range(len(streams[0].cache)):
                keys = [F.pad(s.cache[layer][0], (0, 0, longest - n, 0)) for s, n in zip(streams, past_lengths)]
                values = [F.pad(s.cache[layer][1], (0, 0, longest - n, 0)) for s, n in zip(streams, past_lengths)]
                layers.append((torch.cat(keys), torch.cat(values)))
            cache = DynamicCache(ddp_cache_data=layers)
        attention_mask = torch.cat([past_mask, new_mask], dim=1)

        model_inputs = {
            key: inputs[key] for key in ("pixel_values", "image_grid_thw", "mm_token_type_ids") if key in inputs
        }
        hidden = network.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **model_inputs,
        ).last_hidden_state

        results = []
        for b, (stream, piece, past_length, length) in enumerate(zip(streams, pieces, past_lengths, lengths)):
            start, end = longest - past_length, longest + length
            stream.cache = [
                (layer.keys[b : b + 1, :, start:end], layer.values[b : b + 1, :, start:end]) for layer in cache.layers
            ]
            stream.next_position = int(positions[:, b, :length].max()) + 1
            ids = input_ids[b, :length]
            stream.input_ids.append(ids.cpu())
            if piece.views_per_step:
                vision_ends = (ids == self._vision_end_id).nonzero().squeeze(-1)
                readouts = vision_ends[piece.views_per_step - 1 :: piece.views_per_step]
                values = network.head.predict(network.head(hidden[b, readouts]))
                results.append(values.float().cpu().numpy().astype(np.float64))
        return results
