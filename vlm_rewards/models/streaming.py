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
A reset (and opening the session) only checks and records the prefix: it runs in the same forward as
the stream's next frames, as one piece `prefix + frames`, so a reset costs no forward of its own.

Inputs skip the processor round trip (`vlm_rewards.models.inputs.PieceEncoder`): frames are resized
as the builder resizes them; each image block's token ids and each prefix's are the processor's own
output for that text and image size, computed once; pixels are rescaled, normalised and patchified
with numpy in the image processor's float steps, checked bit for bit against the image processor on
the first frames of each size (falling back to it otherwise). A piece's layout (ids, M-RoPE
positions, readout indices) is cached by its shape, so a step like an earlier one costs no
tokenizing and no `get_rope_index`.

Positions: Qwen-VL models use multimodal RoPE. Text tokens advance one position each; an image block
of h x w merged tokens takes positions (t, row, col) offset by the position where it starts, and the
next token starts at that offset + max(h, w). `get_rope_index` (the same for Qwen2-VL, Qwen2.5-VL and
Qwen3-VL on still images: Qwen2.5-VL's time scaling applies to videos only, Qwen3-VL's timestamp
splitting too) computes this for a sequence starting at 0, and every later position is relative to
where the piece starts; so a piece's positions are `get_rope_index(piece) + offset`, with offset =
(largest position so far) + 1. A piece's own positions are its blocks' (the prefix, each image
block) chained the same way, which is how they are computed, once per block shape. They are passed
as explicit (3, B, L) `position_ids` (for all three families the language model takes 3 rows as
(t, h, w); a 4-row form would prepend text positions for packed sequences, which this does not use)
so the model's own `rope_deltas` bookkeeping is never involved.

Batching: one `append` runs every stream's new frames in one forward, its readouts through the head
in one call. The streams' keys and values live in one `StreamCache` (fixed buffers, one row per
stream, grown by doubling when full): each stream's new piece is written right after its cached
tokens, right-padded to the longest piece (the padding is overwritten by the stream's next piece),
and a mask hides every column past each query. Nothing is copied between steps and positions are
explicit, so padding never shifts them. With the fast vision path below, the language model's step
and its vision tower's are `GraphedCall`s: on CUDA, a step of a shape seen before (every env one frame,
the usual RL step) replays as CUDA graphs instead of launching the model's kernels one by one.

Qwen2.5-VL (SDPA or eager attention) also gets the batched vision path (`vlm_rewards.models.fast_vision`,
checked against the tower on the first call with each image grid) whose features go into the model's
own steps (embed, place the image features, language model). Costs per call on the tiny RM on CPU are in
docs/benchmarks.md ("RL reward overhead").

Only full-attention caches are supported (all Qwen-VL text models here); sliding-window layers would
need the padding to move with the window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from vlm_rewards.interface import RewardSession, RewardSpec, stream_references, validate_clip
from vlm_rewards.models.fast_vision import fast_vision
from vlm_rewards.models.inputs import IMAGE_PLACEHOLDER, TokenBlock
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.models.stream_cache import GraphedCall, StreamCache
from vlm_rewards.models.tokenizer import IM_START
from vlm_rewards.models.vision import resize_frames

MAX_LAYOUTS = 1024  # cached layouts and positions (shapes seen; an RL run sees a handful)


@dataclass
class _Prefix:
    """A stream's opening text (and resized goal frames), run with its first frames."""

    text: str  # the piece's text, IMAGE_PLACEHOLDER once per goal frame
    images: list[np.ndarray]


@dataclass(eq=False)
class _StreamState:
    """What one stream keeps between appends."""

    text: str
    next_position: int  # the M-RoPE position the next token starts at (largest so far + 1)
    prefix: _Prefix | None = None  # not run yet: it runs with the stream's next frames
    num_frames: int = 0
    frame_size: tuple[int, int] | None = None  # (H, W) of the first append; later appends must match
    view_sizes: dict[str, tuple[int, int]] | None = None  # name -> (H, W), fixed by the first append
    input_ids: list[torch.Tensor] = field(default_factory=list)  # the pieces run so far, for checks
    cache_length: int = 0  # tokens of this stream in its row of the session's `StreamCache`


@dataclass
class _Piece:
    """The tokens (and images) to run for one stream in one forward: its prefix if it has not run, then frames."""

    prefix: _Prefix | None
    images: list[np.ndarray]  # the frames', resized: per step the main view, then the extra views by name
    views_per_step: int  # readouts: the last view of each step


@dataclass(frozen=True)
class _Layout:
    """A piece's tokens, relative M-RoPE positions and readout indices; cached by the piece's shape."""

    input_ids: torch.Tensor  # (L,)
    mm_token_type_ids: torch.Tensor  # (L,)
    positions: torch.Tensor  # (3, L), the piece starting at position 0
    extent: int  # largest position + 1: where the next piece starts, relative to this one
    readouts: torch.Tensor  # (n,) indices of the readout tokens (each step's last <|vision_end|>)


class KVCacheSession(RewardSession):
    """B streams (one per env) scored incrementally by a progress `RewardNetwork` with a KV cache.

    network: a `RewardNetwork` with `config.task == "progress"`; put in eval mode here.
    texts: the instruction of each stream.
    references: per stream the (R, H, W, 3) uint8 goal frames or None; used only when the network's
        `config.use_reference` is set, and then required.
    spec: optional, the adapter's `RewardSpec`; its `frame_size` bounds are then checked as `score`
        checks them (the network's own minimum side is checked always).
    cuda_graphs: on CUDA, replay the vision tower's and the language model's steps as CUDA graphs
        (`GraphedCall`; with the fast vision path). False runs every step eagerly.

    `append(frames, views)` returns per stream the progress of its new frames, equal to
    `network.predict` on the whole clip so far, and sets `last_components` (a network with success or
    stage heads: per stream the `success` / `stage` components of its last new frame, as
    `TrainedRewardModel` gives them); it refuses (ValueError naming `frames[i]` / stream i)
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
        cuda_graphs: bool = True,
    ):
        if network.config.task != "progress":
            raise ValueError(f"KVCacheSession: needs a progress network, this one is a {network.config.task!r} model")
        text_config = network.backbone.config.get_text_config()
        layer_types = getattr(text_config, "layer_types", None) or ["full_attention"]
        if any(kind != "full_attention" for kind in layer_types):
            raise ValueError(
                f"KVCacheSession: only full-attention models are supported, got layer types {set(layer_types)}"
            )
        references = stream_references(texts, references)
        self.network = network.eval()
        self.spec = spec
        self._builder = network.builder
        self._encoder = network.builder.pieces  # shared by the network's sessions
        self._vision = fast_vision(network.backbone)
        self._vision_end_id = self._builder.vision_end_id
        pad_id = network.processor.tokenizer.pad_token_id
        self._pad_id = 0 if pad_id is None else int(pad_id)
        self._layouts: dict[tuple, _Layout] = {}
        self._frame_sizes: dict[tuple[int, int], tuple[int, int]] = {}  # (H, W) -> the size frames are resized to
        self._block_positions: dict[tuple, tuple[torch.Tensor, int]] = {}
        self._closed = False
        for i, (text, reference) in enumerate(zip(texts, references)):
            self._check_start(text, reference, f"texts[{i}]", f"references[{i}]")
        self._streams: list[_StreamState] = [
            self._fresh(text, reference, f"references[{i}]")
            for i, (text, reference) in enumerate(zip(texts, references))
        ]
        language_model = network.backbone.language_model
        self._cache = StreamCache(language_model.config, len(self._streams), network.backbone.dtype, network.device)
        self._language_step = GraphedCall(self._language_model_step, network.device, enabled=cuda_graphs)
        self._vision_step = GraphedCall(self._vision.forward, network.device, cuda_graphs) if self._vision else None

    # ------------------------------------------------------------------------------------ interface

    @property
    def num_frames(self) -> list[int]:
        return [stream.num_frames for stream in self._streams]

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    def reset(self, index: int, text: str, reference: np.ndarray | None = None) -> None:
        """Start stream `index` afresh; its prefix runs with its next frames, in the next `append`'s forward."""
        self._check_open()
        if not isinstance(index, int) or not 0 <= index < len(self._streams):
            raise ValueError(f"reset: stream index {index!r}; expected 0..{len(self._streams) - 1}")
        self._check_start(text, reference, "text", "reference")
        self._streams[index] = self._fresh(text, reference, "reference")

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
        values = self._run(pieces)
        for stream, new in zip(self._streams, frames):
            stream.num_frames += len(new)
        return values

    def close(self) -> None:
        """Drop the streams' cache; the session cannot be used afterwards."""
        self._closed = True
        self._cache = self._language_step = self._vision_step = None

    def input_ids(self, index: int) -> torch.Tensor:
        """(L,) the token ids stream `index` has run so far (its prefix and every appended frame)."""
        stream = self._streams[index]
        pieces = list(stream.input_ids)
        if stream.prefix is not None:  # recorded, not run yet
            pieces.append(self._prefix_tokens(stream.prefix).input_ids)
        return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)

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

    def _check_frames(self, frames: np.ndarray, name: str) -> tuple[int, int]:
        """Checks a clip; returns the (H, W) its frames are resized to."""
        validate_clip(frames, name, self.spec)
        size = self._frame_sizes.get(frames.shape[1:3])
        if size is None:  # raises if too small
            size = self._frame_sizes[frames.shape[1:3]] = self._builder.vision.frame_size(*frames.shape[1:3], name)
        return size

    def _check_append(
        self, index: int, stream: _StreamState, frames: np.ndarray, views: Mapping[str, np.ndarray]
    ) -> _Piece:
        name = f"frames[{index}]"
        size = self._check_frames(frames, name)
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
        resized = [resize_frames(frames, *size)]
        for view_name in sorted(views):
            view = views[view_name]
            where = f"views[{index}][{view_name!r}]"
            view_size = self._check_frames(view, where)
            if len(view) != count:
                raise ValueError(f"{where}: {len(view)} frames, expected {count} (as frames[{index}])")
            if stream.view_sizes is not None and tuple(view.shape[1:3]) != stream.view_sizes[view_name]:
                raise ValueError(
                    f"{where}: frames of {view.shape[1]}x{view.shape[2]}, stream {index} began with "
                    f"{stream.view_sizes[view_name][0]}x{stream.view_sizes[view_name][1]}"
                )
            resized.append(resize_frames(view, *view_size))
        images = [view[t] for t in range(count) for view in resized]  # per step: main view, then views by name
        return _Piece(stream.prefix, images, views_per_step=len(resized))

    # ------------------------------------------------------------------------------------ inputs

    def _fresh(self, text: str, reference: np.ndarray | None, name: str) -> _StreamState:
        """A stream at its start: the prefix recorded, to run with the first frames."""
        parts, images = [f"{IM_START}user\n"], []
        if self.network.config.use_reference:
            images = list(self._builder.vision.resize(reference, name))
            parts.append("Goal: " + IMAGE_PLACEHOLDER * len(images) + "\n")
        parts.append(text + "\n")
        return _StreamState(text=text, next_position=0, prefix=_Prefix("".join(parts), images))

    def _prefix_tokens(self, prefix: _Prefix) -> TokenBlock:
        return self._encoder.tokens(prefix.text, [image.shape[:2] for image in prefix.images])

    def _positions(self, key: tuple, block: TokenBlock) -> tuple[torch.Tensor, int]:
        """(3, L) M-RoPE positions of `block` as if it started the sequence, and its extent (largest + 1)."""
        cached = self._block_positions.get(key)
        if cached is None:
            grids = torch.tensor(block.grids, dtype=torch.long) if block.grids else None
            positions, _ = self.network.backbone.get_rope_index(
                block.input_ids[None],
                mm_token_type_ids=block.mm_token_type_ids[None],
                image_grid_thw=grids,
                attention_mask=torch.ones(1, len(block.input_ids), dtype=torch.long),
            )
            positions = positions[:, 0].cpu()
            cached = positions, int(positions.max()) + 1
            if len(self._block_positions) >= MAX_LAYOUTS:
                self._block_positions.clear()
            self._block_positions[key] = cached
        return cached

    def _layout(self, piece: _Piece) -> _Layout:
        """The piece's tokens, positions and readouts: its blocks' (prefix, then one per image), chained."""
        prefix_key = None
        if piece.prefix is not None:
            prefix_key = (piece.prefix.text, tuple(image.shape[:2] for image in piece.prefix.images))
        sizes = tuple(image.shape[:2] for image in piece.images)
        key = (prefix_key, sizes, piece.views_per_step)
        layout = self._layouts.get(key)
        if layout is not None:
            return layout
        blocks = []
        if piece.prefix is not None:
            blocks.append((("prefix", prefix_key), self._prefix_tokens(piece.prefix)))
        blocks += [(("image", size), self._encoder.image_tokens(*size)) for size in sizes]
        ids, types, positions, readouts = [], [], [], []
        offset = length = 0
        for number, (block_key, block) in enumerate(blocks):
            relative, extent = self._positions(block_key, block)
            ids.append(block.input_ids)
            types.append(block.mm_token_type_ids)
            positions.append(relative + offset)
            offset += extent
            length += len(block.input_ids)
            image = number - (piece.prefix is not None)  # index among the frame images
            if image >= 0 and (image + 1) % piece.views_per_step == 0:
                if block.input_ids[-1] != self._vision_end_id:
                    raise RuntimeError("KVCacheSession: an image block does not end with <|vision_end|>")
                readouts.append(length - 1)
        layout = _Layout(torch.cat(ids), torch.cat(types), torch.cat(positions, dim=1), offset, torch.tensor(readouts))
        if len(self._layouts) >= MAX_LAYOUTS:
            self._layouts.clear()
        self._layouts[key] = layout
        return layout

    # ------------------------------------------------------------------------------------ model

    def _graphed_vision(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor, key: tuple) -> torch.Tensor:
        """The checked fast vision path of one step's frames, as a CUDA graph per frame grid (`GraphedCall`)."""
        return self._vision_step(pixel_values, key=key, constants=(grid_thw, key))

    def _language_model_step(
        self, embeds: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """(B, L, D) input embeddings after each stream's `lengths` cached tokens -> (B, L, D) last hidden states."""
        return self.network.backbone.language_model(
            inputs_embeds=embeds,
            position_ids=positions,
            attention_mask=self._cache.prepare(lengths, embeds.shape[1]),
            past_key_values=self._cache,
            use_cache=True,
        ).last_hidden_state

    @torch.inference_mode()
    def _run(self, pieces: list[_Piece]) -> list[np.ndarray]:
        """One forward of `pieces[b]` on top of stream b's cache (every stream); updates the streams and
        returns per stream the progress at the readouts of its piece."""
        network, device = self.network, self.network.device
        streams = self._streams
        layouts = [self._layout(piece) for piece in pieces]
        lengths = [len(layout.input_ids) for layout in layouts]
        offsets = [0 if stream.prefix is not None else stream.next_position for stream in streams]
        offset_tensor = torch.tensor(offsets, dtype=torch.long)
        if all(layout is layouts[0] for layout in layouts):  # one shape for all: no padding
            layout = layouts[0]
            input_ids = layout.input_ids.expand(len(streams), -1)
            mm_token_type_ids = layout.mm_token_type_ids.expand(len(streams), -1)
            positions = layout.positions[:, None, :] + offset_tensor[None, :, None]
        else:  # right-padded to the longest piece
            longest = max(lengths)
            input_ids = torch.full((len(streams), longest), self._pad_id, dtype=torch.long)
            mm_token_type_ids = torch.zeros(len(streams), longest, dtype=torch.long)
            positions = torch.ones(3, len(streams), longest, dtype=torch.long)
            for b, (layout, length, offset) in enumerate(zip(layouts, lengths, offsets)):
                input_ids[b, :length] = layout.input_ids
                mm_token_type_ids[b, :length] = layout.mm_token_type_ids
                positions[:, b, :length] = layout.positions + offset
        images = [image for piece in pieces for image in (piece.prefix.images if piece.prefix else []) + piece.images]
        pixel_values, image_grid_thw = self._encoder.pixels(images, device)

        # Stream b's new tokens go right after its cached ones (none after a reset: its prefix runs now).
        cached = [0 if stream.prefix is not None else stream.cache_length for stream in streams]
        if self._cache.reserve(max(cached) + input_ids.shape[1]):
            self._language_step.clear()  # the graphs hold the old buffers
        cache_lengths = torch.tensor(cached, device=device)
        image_grid_thw = image_grid_thw.to(device)
        input_ids, positions = input_ids.to(device), positions.to(device)
        features = self._vision(pixel_values, image_grid_thw, self._graphed_vision) if self._vision else None
        backbone = network.backbone
        if features is None:
            hidden = backbone(
                input_ids=input_ids,
                pixel_values=pixel_values,
                image_grid_thw=image_grid_thw,
                mm_token_type_ids=mm_token_type_ids.to(device),
                attention_mask=self._cache.prepare(cache_lengths, input_ids.shape[1]),
                position_ids=positions,
                past_key_values=self._cache,
                use_cache=True,
            ).last_hidden_state
        else:  # the model's forward, its steps written out: embed, place the image features, run the LM
            embeds = backbone.get_input_embeddings()(input_ids)
            image_mask = (input_ids == backbone.config.image_token_id).unsqueeze(-1).expand_as(embeds)
            embeds = embeds.masked_scatter(image_mask, features.to(embeds.dtype))
            hidden = self._language_step(embeds, positions, cache_lengths)

        # Every readout of every stream through the heads in one call.
        rows = torch.cat([torch.full((len(layout.readouts),), b, dtype=torch.long) for b, layout in enumerate(layouts)])
        columns = torch.cat([layout.readouts for layout in layouts])
        logits = network.head.frame_logits(hidden[rows.to(device), columns.to(device)])
        values = network.head.predict(logits.progress).float().cpu().numpy().astype(np.float64)
        counts = [len(layout.readouts) for layout in layouts]
        last = torch.as_tensor(np.cumsum(counts) - 1)  # each stream's last readout
        self.last_components = [{} for _ in streams]
        if logits.success is not None:
            for b, value in enumerate(logits.success.sigmoid()[last].tolist()):
                self.last_components[b]["success"] = value
        if logits.stage is not None:
            for b, value in enumerate(logits.stage.argmax(-1)[last].tolist()):
                self.last_components[b]["stage"] = float(value)

        results, cursor = [], 0
        for b, (stream, layout, length, offset) in enumerate(zip(streams, layouts, lengths, offsets)):
            stream.cache_length = cached[b] + length
            stream.next_position = offset + layout.extent
            stream.input_ids.append(layout.input_ids)
            stream.prefix = None
            results.append(values[cursor : cursor + counts[b]])
            cursor += counts[b]
        return results
