"""Fixed-size key/value buffers for a streaming session, and `GraphedCall`, which replays its steps as CUDA graphs.

`StreamCache` holds one row per stream: row b keeps stream b's tokens in columns [0, length_b). A step
writes each stream's new tokens right after its cached ones and attends over the whole row under a
mask that hides the columns beyond each query, so nothing is copied, padded or concatenated between
steps and the tensors keep their addresses until the buffers must grow. That is what lets `GraphedCall`
record a step as a CUDA graph and replay it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import Cache


class StreamCache(Cache):
    """Per layer (streams, kv_heads, capacity, head_dim) keys and values; `lengths[b]` real tokens in row b.

    Before a forward of `new_tokens` tokens per stream, `prepare(lengths)` sets where they go (stream b's
    at columns lengths[b] .. lengths[b] + new_tokens - 1; a shorter real piece leaves padding after it,
    overwritten by the stream's next piece) and returns the (streams, 1, new_tokens, capacity) mask.
    The language model's attention layers call `update`, which writes the new keys and values in place
    and hands back the whole buffers.
    """

    def __init__(self, config, streams: int, dtype: torch.dtype, device: torch.device | str, capacity: int = 256):
        """config: the language model's config (layers, key/value heads, head size, attention implementation)."""
        super().__init__(layers=[])
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.shape = (streams, config.num_key_value_heads, head_dim)
        self.num_layers, self.dtype, self.device = config.num_hidden_layers, dtype, torch.device(device)
        # SDPA takes a boolean mask (True: attend); eager attention adds the mask to its scores
        self.additive_mask = config._attn_implementation == "eager"
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._allocate(capacity)
        self.write_index: torch.Tensor | None = None  # set by `prepare`, read by `update`

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def _allocate(self, capacity: int) -> None:
        streams, heads, head_dim = self.shape
        old = list(zip(self.keys, self.values))
        size = (streams, heads, capacity, head_dim)
        self.keys = [torch.zeros(size, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.values = [torch.zeros(size, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        for (keys, values), (old_keys, old_values) in zip(zip(self.keys, self.values), old):
            keys[:, :, : old_keys.shape[2]] = old_keys
            values[:, :, : old_values.shape[2]] = old_values

    def reserve(self, columns: int) -> bool:
        """Make room for `columns` columns per row (doubling); True if the buffers moved."""
        if columns <= self.capacity:
            return False
        self._allocate(max(columns, 2 * self.capacity))
        return True

    def prepare(self, lengths: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Set the write columns for `new_tokens` tokens after each row's `lengths` (a (streams,) long tensor on
        the cache's device) and return that step's attention mask: boolean for SDPA (True: attend), additive for
        eager attention."""
        streams, heads, head_dim = self.shape
        steps = torch.arange(new_tokens, device=self.device)
        columns = lengths[:, None] + steps[None, :]  # (streams, new_tokens)
        self.write_index = columns[:, None, :, None].expand(streams, heads, new_tokens, head_dim)
        visible = (torch.arange(self.capacity, device=self.device)[None, None, :] <= columns[:, :, None])[:, None]
        if self.additive_mask:
            return torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill(
                ~visible, torch.finfo(self.dtype).min
            )
        return visible

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys[layer_idx].scatter_(2, self.write_index, key_states)
        self.values[layer_idx].scatter_(2, self.write_index, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.capacity


class GraphedCall:
    """`function(*tensors, *constants) -> tensor`, replayed as a CUDA graph per input shapes and `key`.

    A streaming step runs the same shapes again and again (every env one frame), and a 3B model's step
    is otherwise bound by the CPU launching its kernels one by one. The first call of a shape runs
    eagerly (it also warms the kernels up); the second runs eagerly too, is then recorded and replayed,
    and the replay must give the eager result to the bit (the same kernels on the same inputs), or
    graphs are switched off for good. Later calls only copy their inputs into the graph's and replay.
    `function` must not sync with the host; whatever it writes in place (a cache) it writes again, the
    same, at the check. `constants` (non-tensor or fixed arguments) must be the same for equal keys.
    On the CPU, or with `enabled` False, every call runs eagerly.
    """

    def __init__(self, function: Callable[..., torch.Tensor], device: torch.device | str, enabled: bool = True):
        self.function = function
        self.enabled = enabled and torch.device(device).type == "cuda"
        self._seen: set[tuple] = set()
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.enabled else None
        self.replays = 0
        self.error: str | None = None  # why graphs were switched off

    def clear(self) -> None:
        """Drop the recorded graphs (what they read or write has moved)."""
        self._graphs.clear()
        self._seen.clear()

    def __call__(self, *inputs: torch.Tensor, key: tuple = (), constants: tuple = ()) -> torch.Tensor:
        if not self.enabled:
            return self.function(*inputs, *constants)
        key = (*(tuple(tensor.shape) for tensor in inputs), *key)
        if key in self._graphs:
            graph, static_inputs, output = self._graphs[key]
            for static, value in zip(static_inputs, inputs):
                static.copy_(value)
            graph.replay()
            self.replays += 1
            return output.clone()
        eager = self.function(*inputs, *constants)
        if key in self._seen:
            self._record(key, eager, inputs, constants)
        self._seen.add(key)
        return eager

    def _record(self, key: tuple, eager: torch.Tensor, inputs: Sequence[torch.Tensor], constants: tuple) -> None:
        static_inputs = [tensor.clone() for tensor in inputs]
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                output = self.function(*static_inputs, *constants)
        except RuntimeError as error:  # a call that cannot be recorded (a host sync in the model's code)
            self.enabled, self.error = False, str(error)
            return
        graph.replay()
        if torch.equal(output, eager):
            self._graphs[key] = (graph, static_inputs, output)
        else:
            self.enabled, self.error = False, "the replay differs from the eager call"
