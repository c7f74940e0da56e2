"""Reward-model throughput: one-pass clip scoring vs per-frame loops, FLOPs, MFU, memory, training steps.

Scoring a clip of T frames, `RewardNetwork.predict` runs one forward over the instruction and all T
frames and reads the head at each frame's readout token. Without that design a user would loop:

- prefix loop: for each t, a forward on frames[:t+1] reading the last frame. T forwards per clip;
  in a causal model it gives the one-pass outputs up to rounding, which this benchmark checks on the
  readout hidden states (before the head: a random head squashes everything near 0.5), for a batch
  of clips of different lengths (padding must change nothing), relative to each hidden state's norm.
  In float32: within 1e-4 of one pass. In 16-bit types the two round differently, so both are
  compared with a float32 copy of the model run in one pass on the same inputs: the prefix loop
  passes when its error is at most 2x the one pass's own error + 1e-4 (the float32 run's; see
  `readout_check`).
- independent: for each t, a forward on frame t alone with the instruction. T forwards of
  single-frame clips; different (context-free) outputs, timed for reference only.

Every scoring forward (one pass, both loops, the check's 16-bit runs) is `RewardNetwork`'s, which in
inference takes the image features from the batched vision path (`vlm_rewards.models.fast_vision`:
one SDPA call per window length, not the tower's per-window loop), where it applies (Qwen2.5-VL with
sdpa/eager attention) and agreed with the tower on its check; the JSON's `scoring_vision` says which
path ran and the check's figures.

Inputs are built once before timing, so every figure is model time (input building is timed on its
own). Model FLOPs per forward: 2·N_lm·tokens + 2·N_vis·patches + 2·N_merger·patches/4, with N_lm the
language-model parameters without embeddings, N_vis the vision tower's without its patch merger
(which runs once per 2x2 patches), tokens the unpadded sequence tokens and patches the 14x14 vision
patches; attention-score FLOPs are left out, so MFU is slightly understated. Training steps, both
with gradient checkpointing (its recomputation not counted): full fine-tuning counts 3x the forward
(6·N·tokens); LoRA (the project's `Lora` settings) counts the forward plus a backward through the
language model's activations only (2·N_lm·tokens: no weight gradients, and the frozen vision tower
gets no backward). MFU divides by a dense matmul rate measured in the same run and dtype.

    .venv/bin/python bench/rm_throughput.py                                   # tiny model, CPU
    python bench/rm_throughput.py --preset qwen2_5_vl_3b --device cuda --dtype bfloat16
"""

from __future__ import annotations

import copy
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import transformers
import typer
from rich.console import Console
from rich.table import Table

from vlm_rewards.data.synthetic import ShapesWorld
from vlm_rewards.interface import RewardRequest
from vlm_rewards.models.device import resolve_device, resolve_dtype
from vlm_rewards.models.fast_vision import fast_vision
from vlm_rewards.models.inputs import ClipBatch
from vlm_rewards.models.reward_network import RewardNetwork
from vlm_rewards.training.config import Lora
from vlm_rewards.training.train import apply_lora

try:  # run as a script: bench/ is on sys.path
    from _common import Preset, build_model, finish, machine
except ModuleNotFoundError:  # imported as `bench.rm_throughput` (the tests)
    from bench._common import Preset, build_model, finish, machine

FRAME_SIZES: dict[str, int] = {"tiny": 112, "qwen2_5_vl_3b": 224}
# Largest per-frame ‖h − h_reference‖ / ‖h_reference‖ of readout hidden states that float32 rounding gives
# (the prefix loop agrees with one pass to ~1e-7 on the tiny model): the float32 check's tolerance, and the
# float32 reference's own error in the 16-bit check.
FLOAT32_TOLERANCE = 1e-4
# In 16-bit types the prefix loop may be this many times as far from the float32 one pass as the 16-bit one
# pass is: two roundings of one function, whose worst-frame errors differ by less than 2x; a context or
# padding fault moves a readout by O(1), far beyond.
ERROR_FACTOR = 2.0
MATMUL_SIZES = {"cuda": 8192, "cpu": 2048}
CPU_16BIT_MATMUL_SIZE = 256  # 16-bit CPU matmuls can run at ~1 GFLOP/s (a 2048² one: ~15 s)
MATMULS_PER_REPEAT = 4
MERGE_TOKENS = 4  # the patch merger maps 2x2 vision patches to one LLM token


@dataclass
class BenchConfig:
    preset: Preset = "tiny"
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 4
    num_frames: int = 16
    frame_size: int | None = None  # None: the preset's (112 tiny, 224 for 3B)
    warmup: int = 1
    repeats: int = 5
    train_repeats: int = 3  # timed steps per training mode (a 3B step takes seconds; GPU step times are steady)
    train: bool = True
    attn_implementation: str | None = None  # None: transformers' default (sdpa)
    threads: int | None = None  # CPU threads; None: torch's default
    seed: int = 0


def make_clips(
    batch_size: int, num_frames: int, frame_size: int, seed: int
) -> tuple[list[RewardRequest], torch.Tensor]:
    """ShapesWorld expert clips and their (B, T) progress labels."""
    world, rng = ShapesWorld(size=frame_size), np.random.default_rng(seed)
    episodes = [world.rollout(rng, num_frames, "expert") for _ in range(batch_size)]
    labels = torch.as_tensor(np.stack([episode.progress for episode in episodes]))
    return [RewardRequest(episode.frames, episode.instruction) for episode in episodes], labels


def per_step_batches(model: RewardNetwork, requests: list[RewardRequest], prefix: bool) -> list[ClipBatch]:
    """Batch t holds frames[:t+1] (prefix) or frames[t:t+1] of every clip, so its last frame is frame t."""
    num_frames = requests[0].num_frames
    return [
        model.encode([RewardRequest(r.frames[0 if prefix else t : t + 1], r.text) for r in requests])
        for t in range(num_frames)
    ]


def variable_length(requests: list[RewardRequest]) -> list[RewardRequest]:
    """The clips cut to different lengths (T, T−1, …, at least 1), so one batch holds padding."""
    return [RewardRequest(r.frames[: max(1, r.num_frames - i)], r.text) for i, r in enumerate(requests)]


def scoring_vision(model: RewardNetwork) -> dict[str, Any]:
    """Which vision path the scoring forwards used, and its check's figures."""
    vision = fast_vision(model.backbone)
    if vision is None:
        return {"path": "tower (the batched path applies to Qwen2.5-VL with sdpa/eager attention only)"}
    path = (
        "batched (one SDPA call per window length)" if vision.enabled else "tower (the batched path failed its check)"
    )
    return {"path": path, **vision.summary()}


def readout_hidden(model: RewardNetwork, batch: ClipBatch, batched_vision: bool = True) -> torch.Tensor:
    """(B, T_max, hidden) backbone hidden states at each frame's readout token: what the head reads."""
    inputs = model.backbone_inputs(batch) if batched_vision else batch.model_inputs
    return batch.gather(model.backbone(**inputs).last_hidden_state).float()


def loop_readouts(model: RewardNetwork, requests: list[RewardRequest], context: bool) -> torch.Tensor:
    """(B, T_max, hidden) readout hidden states of frame t from a forward on frames[:t+1] (context) or frame t
    alone, one forward per t over the clips that have frame t."""
    lengths = [r.num_frames for r in requests]
    readouts = None
    for t in range(max(lengths)):
        rows = [i for i, length in enumerate(lengths) if length > t]
        batch = model.encode(
            [RewardRequest(requests[i].frames[0 if context else t : t + 1], requests[i].text) for i in rows]
        )
        last = batch.frame_mask.sum(1) - 1
        hidden = readout_hidden(model, batch)[torch.arange(len(rows)), last]  # (rows, H): the frame-t readouts
        if readouts is None:
            readouts = hidden.new_zeros(len(requests), max(lengths), hidden.shape[-1])
        readouts[rows, t] = hidden
    return readouts


def max_relative_error(hidden: torch.Tensor, reference: torch.Tensor, frame_mask: torch.Tensor) -> float:
    """Largest per-frame ‖hidden − reference‖ / ‖reference‖ over the real frames."""
    relative = (hidden - reference).norm(dim=-1) / reference.norm(dim=-1).clamp(min=1e-12)
    return float(relative[frame_mask].max())


@torch.inference_mode()
def float32_readouts(model: RewardNetwork, batch: ClipBatch) -> torch.Tensor:
    """Readout hidden states of a float32 copy of `model` (the tower's own vision forward), freed on return."""
    reference = copy.deepcopy(model).float()
    try:
        return readout_hidden(reference, batch, batched_vision=False)
    finally:
        del reference
        gc.collect()
        if batch.frame_mask.device.type == "cuda":
            torch.cuda.empty_cache()


@torch.inference_mode()
def readout_check(model: RewardNetwork, requests: list[RewardRequest]) -> dict[str, Any]:
    """Compare the prefix loop's readout hidden states with one pass's, frame by frame (and report the
    independent frames', which a context-aware model must not match).

    float32: an error is the largest per-frame relative difference to one pass; the loop passes within
    FLOAT32_TOLERANCE. 16-bit: one pass and the loop are the same causal function rounded in different
    orders, so neither is the exact value; both are compared with a float32 copy of the model run in one pass
    on the same inputs, and the loop passes when its error <= ERROR_FACTOR x the 16-bit one pass's error +
    FLOAT32_TOLERANCE (the float32 run's own error): as accurate as one pass.
    """
    batch = model.encode(requests)
    one_pass = readout_hidden(model, batch)
    prefix, independent = loop_readouts(model, requests, context=True), loop_readouts(model, requests, context=False)
    mask = batch.frame_mask
    check: dict[str, Any] = {
        "clip_lengths": [r.num_frames for r in requests],
        "prefix_loop_vs_one_pass": max_relative_error(prefix, one_pass, mask),
        "independent_vs_one_pass": max_relative_error(independent, one_pass, mask),
    }
    if next(model.parameters()).dtype == torch.float32:
        check |= {
            "rule": "prefix_loop_vs_one_pass <= bound (float32 rounding)",
            "prefix_loop_error": check["prefix_loop_vs_one_pass"],
            "independent_error": check["independent_vs_one_pass"],
            "bound": FLOAT32_TOLERANCE,
        }
    else:
        exact = float32_readouts(model, batch)
        one_pass_error = max_relative_error(one_pass, exact, mask)
        check |= {
            "rule": f"prefix_loop_error <= bound = {ERROR_FACTOR:g} x one_pass_error + {FLOAT32_TOLERANCE:g}, "
            "errors vs a float32 copy's one pass",
            "one_pass_error": one_pass_error,
            "prefix_loop_error": max_relative_error(prefix, exact, mask),
            "independent_error": max_relative_error(independent, exact, mask),
            "bound": ERROR_FACTOR * one_pass_error + FLOAT32_TOLERANCE,
        }
    return check | {
        "prefix_loop_matches": check["prefix_loop_error"] <= check["bound"],
        "independent_matches": check["independent_error"] <= check["bound"],
    }


def score_per_step(model: RewardNetwork, batches: list[ClipBatch]) -> torch.Tensor:
    """One forward per batch, each read at its last frame: (B, len(batches))."""
    return torch.stack([model.last_frame(model.predict(batch), batch.frame_mask) for batch in batches], dim=1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fns: dict[str, Callable[[], Any]], warmup: int, repeats: int, device: torch.device
) -> dict[str, tuple[float, Any]]:
    """Per name: median wall time over `repeats` rounds after `warmup` untimed ones, and the last output.

    Each round calls every function once, so a background load slows them alike and their ratios hold.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    outputs: dict[str, Any] = {}
    for round_index in range(warmup + repeats):
        for name, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            outputs[name] = fn()
            synchronize(device)
            if round_index >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), outputs[name]) for name in fns}


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def matmul_flops_per_s(device: torch.device, dtype: torch.dtype, warmup: int, repeats: int) -> float:
    """Measured dense matmul rate: the denominator of MFU."""
    size = CPU_16BIT_MATMUL_SIZE if device.type == "cpu" and dtype != torch.float32 else MATMUL_SIZES[device.type]
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))

    def matmuls() -> None:
        for _ in range(MATMULS_PER_REPEAT):
            torch.matmul(a, b)

    seconds, _ = median_seconds({"matmuls": matmuls}, max(warmup, 1), repeats, device)["matmuls"]
    return 2 * size**3 * MATMULS_PER_REPEAT / seconds


def parameter_counts(model: RewardNetwork) -> dict[str, int]:
    backbone = model.backbone
    merger = sum(p.numel() for p in backbone.visual.merger.parameters())
    return {
        "lm_without_embeddings": sum(
            p.numel() for name, p in backbone.language_model.named_parameters() if not name.startswith("embed_tokens")
        ),
        "embeddings": backbone.language_model.embed_tokens.weight.numel(),
        "vision_without_merger": sum(p.numel() for p in backbone.visual.parameters()) - merger,
        "vision_merger": merger,
        "head": sum(p.numel() for p in model.head.parameters()),
    }


def forward_flops(params: dict[str, int], batch: ClipBatch) -> float:
    """Model FLOPs of one forward on `batch` (formula in the module docstring)."""
    tokens = int(batch.model_inputs["attention_mask"].sum())
    patches = batch.model_inputs["pixel_values"].shape[0]
    return 2.0 * (
        params["lm_without_embeddings"] * tokens
        + params["vision_without_merger"] * patches
        + params["vision_merger"] * patches / MERGE_TOKENS
    )


def measure_scoring(model: RewardNetwork, requests: list[RewardRequest], warmup: int, repeats: int) -> dict[str, Any]:
    """Frames/s of one-pass scoring, the prefix loop and independent frames, and the prefix-loop check."""
    device, num_frames = model.device, sum(r.num_frames for r in requests)
    one_pass = model.encode(requests)
    prefix = per_step_batches(model, requests, prefix=True)
    independent = per_step_batches(model, requests, prefix=False)
    reset_peak_memory(device)
    with torch.inference_mode():
        timings = median_seconds(
            {
                "input_building": lambda: model.encode(requests),
                "one_pass": lambda: model.predict(one_pass),
                "prefix_loop": lambda: score_per_step(model, prefix),
                "independent": lambda: score_per_step(model, independent),
            },
            warmup,
            repeats,
            device,
        )
    forwards = {"input_building": 0, "one_pass": 1, "prefix_loop": len(prefix), "independent": len(independent)}
    result: dict[str, Any] = {
        name: {"seconds": seconds, "frames_per_s": num_frames / seconds, "forwards": forwards[name]}
        for name, (seconds, _) in timings.items()
    }
    peak_memory = peak_memory_gib(device)
    one_pass_seconds = result["one_pass"]["seconds"]
    return {
        **result,
        "frames": num_frames,
        "speedup_vs_prefix_loop": result["prefix_loop"]["seconds"] / one_pass_seconds,
        "speedup_vs_independent": result["independent"]["seconds"] / one_pass_seconds,
        "peak_memory_gib": peak_memory,
        # The check runs on readout hidden states of variable-length clips, not on the timed outputs.
        "check": readout_check(model, variable_length(requests)),
    }


FLOPS_FORMULAS = {
    "full": "3 x forward (6*N*tokens)",
    "lora": "forward + 2*N_lm*tokens (activation gradients through the LM only)",
}


def training_flops(params: dict[str, int], batch: ClipBatch, lora: bool) -> float:
    """Model FLOPs of one training step on `batch`: full fine-tuning 3x the forward (6·N·tokens); LoRA the
    forward plus 2·N_lm·tokens, a backward through the language model's activations (no weight gradients;
    the frozen vision tower gets none). Adapter FLOPs and checkpointing recomputation are not counted."""
    forward = forward_flops(params, batch)
    if not lora:
        return 3 * forward
    return forward + 2.0 * params["lm_without_embeddings"] * int(batch.model_inputs["attention_mask"].sum())


def measure_training(
    model: RewardNetwork,
    requests: list[RewardRequest],
    labels: torch.Tensor,
    warmup: int,
    repeats: int,
    lora: bool,
) -> dict[str, Any]:
    """Forward + backward + AdamW step of the progress loss with gradient checkpointing, in the model's dtype:
    every weight (full), or LoRA adapters and the head (`apply_lora` with the project's default `Lora`
    settings, as `vlmr train-rm` applies them). Samples/s, peak memory; MFU is set by the caller.

    Leaves the model in training mode with changed weights (LoRA: model.backbone wrapped by peft): run it last.
    """
    device, batch = model.device, model.encode(requests)
    labels = labels.to(device)
    model.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    settings = Lora(enabled=True)
    if lora:
        apply_lora(model, settings, freeze_vision=False)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-6)

    def step() -> None:
        loss = model.head.progress_loss(model(batch).progress, labels, batch.frame_mask)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    reset_peak_memory(device)
    seconds, _ = median_seconds({"step": step}, warmup, repeats, device)["step"]
    return {
        "seconds": seconds,
        "samples_per_s": len(requests) / seconds,
        "frames_per_s": sum(r.num_frames for r in requests) / seconds,
        "trainable_parameters": sum(p.numel() for p in trainable),
        "lora": settings.model_dump() if lora else None,
        "gradient_checkpointing": True,
        "peak_memory_gib": peak_memory_gib(device),
    }


def run_benchmark(config: BenchConfig, workdir: Path) -> dict[str, Any]:
    if config.threads:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    machine_info = machine(device)  # before this run adds to the load average
    frame_size = config.frame_size or FRAME_SIZES[config.preset]
    model = build_model(
        config.preset, workdir, device, dtype, config.num_frames, config.attn_implementation, seed=config.seed
    )
    requests, labels = make_clips(config.batch_size, config.num_frames, frame_size, config.seed)

    params = parameter_counts(model)
    batch = model.encode(requests)
    flops_per_frame = forward_flops(params, batch) / int(batch.frame_mask.sum())
    with torch.inference_mode():
        model.backbone_inputs(batch.to(device))  # the batched vision path's check, before any timing
    matmul_rate = matmul_flops_per_s(device, dtype, config.warmup, config.repeats)
    scoring = measure_scoring(model, requests, config.warmup, config.repeats)
    result: dict[str, Any] = {
        "config": {**asdict(config), "frame_size": frame_size, "device": str(device), "dtype": str(dtype)},
        "machine": machine_info,
        "parameters": params,
        "tokens_per_clip": batch.model_inputs["attention_mask"].sum(1).tolist(),
        "flops_per_frame": flops_per_frame,
        "matmul_flops_per_s": matmul_rate,
        "scoring": scoring,
        "scoring_vision": scoring_vision(model),
        "scoring_mfu": flops_per_frame * scoring["one_pass"]["frames_per_s"] / matmul_rate,
    }
    if config.train:
        result["training"] = {}
        for mode in ("full", "lora"):  # LoRA last: it wraps the backbone
            training = measure_training(
                model, requests, labels, config.warmup, config.train_repeats, lora=mode == "lora"
            )
            flops = training_flops(params, batch, lora=mode == "lora")  # params counted without adapters
            training |= {"flops_per_step": flops, "flops_formula": FLOPS_FORMULAS[mode]}
            training["mfu"] = flops / training["seconds"] / matmul_rate
            result["training"][mode] = training
    return result


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"


def print_result(result: dict[str, Any], console: Console) -> None:
    scoring, config, params = result["scoring"], result["config"], result["parameters"]
    table = Table(
        title=f"{config['preset']} (random weights): {config['batch_size']} clips x {config['num_frames']} frames "
        f"of {config['frame_size']}px, {config['device']} {config['dtype']}, median of {config['repeats']}"
    )
    for column in ("", "forwards", "seconds", "frames/s", "one pass ×"):
        table.add_column(column, justify="right" if column else "left")
    rows = {
        "one_pass": "one pass",
        "prefix_loop": "prefix loop (same outputs)",
        "independent": "independent (context-free)",
        "input_building": "input building (not above)",
    }
    for key, label in rows.items():
        row = scoring[key]
        speedup = f"{row['seconds'] / scoring['one_pass']['seconds']:.2f}" if row["forwards"] else "-"
        table.add_row(label, str(row["forwards"]), _number(row["seconds"]), _number(row["frames_per_s"]), speedup)
    console.print(table)
    check = scoring["check"]
    verdict = "matches" if check["prefix_loop_matches"] else "[bold red]DOES NOT MATCH[/]"
    console.print(
        f"prefix loop {verdict} one pass (readout hidden states, clips of {check['clip_lengths']} frames): "
        f"error {check['prefix_loop_error']:.1e}, bound {check['bound']:.1e} ({check['rule']}); "
        f"independent frames: error {check['independent_error']:.1e}"
    )
    console.print(f"scoring vision path: {result['scoring_vision']['path']}")
    compute = Table(title="compute")
    compute.add_column("")
    compute.add_column("value", justify="right")
    vision = params["vision_without_merger"] + params["vision_merger"]
    compute.add_row(
        "params: LM w/o embeddings, embeddings, vision",
        f"{params['lm_without_embeddings'] / 1e6:,.1f}M, {params['embeddings'] / 1e6:,.1f}M, {vision / 1e6:,.1f}M",
    )
    compute.add_row("model GFLOPs per frame (forward)", _number(result["flops_per_frame"] / 1e9))
    compute.add_row("measured matmul TFLOP/s", _number(result["matmul_flops_per_s"] / 1e12))
    compute.add_row("one-pass scoring MFU", f"{100 * result['scoring_mfu']:.1f}%")
    compute.add_row("scoring peak memory GiB", _number(scoring["peak_memory_gib"]))
    for mode, training in result.get("training", {}).items():
        compute.add_row(f"training ({mode}) samples/s", _number(training["samples_per_s"]))
        compute.add_row(f"training ({mode}) MFU", f"{100 * training['mfu']:.1f}%")
        compute.add_row(f"training ({mode}) peak memory GiB", _number(training["peak_memory_gib"]))
    console.print(compute)


def main(
    preset: Annotated[str, typer.Option(help="tiny | qwen2_5_vl_3b (random weights either way)")] = "tiny",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16")] = "auto",
    batch_size: Annotated[int, typer.Option(min=1)] = 4,
    num_frames: Annotated[int, typer.Option(min=1)] = 16,
    frame_size: Annotated[int | None, typer.Option(help="frame side in pixels; default: 112 tiny, 224 3B")] = None,
    warmup: Annotated[int, typer.Option(min=0)] = 1,
    repeats: Annotated[int, typer.Option(min=1, help="timed scoring rounds")] = 5,
    train_repeats: Annotated[int, typer.Option(min=1, help="timed steps per training mode")] = 3,
    train: Annotated[bool, typer.Option(help="also time training steps (full and LoRA)")] = True,
    attn_implementation: Annotated[str | None, typer.Option(help="e.g. sdpa, flash_attention_2")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads; 1 is steadier on a shared machine")] = None,
    seed: int = 0,
    output: Annotated[Path, typer.Option(help="where to write the JSON result")] = Path(
        "outputs/bench/rm_throughput.json"
    ),
) -> None:
    """Time one-pass clip scoring against per-frame loops, plus FLOPs, MFU, memory and a training step."""
    if preset not in FRAME_SIZES:
        raise typer.BadParameter(f"expected one of {', '.join(FRAME_SIZES)}", param_hint="--preset")
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    config = BenchConfig(
        preset=preset,
        device=device,
        dtype=dtype,
        batch_size=batch_size,
        num_frames=num_frames,
        frame_size=frame_size,
        warmup=warmup,
        repeats=repeats,
        train_repeats=train_repeats,
        train=train,
        attn_implementation=attn_implementation,
        threads=threads,
        seed=seed,
    )
    with tempfile.TemporaryDirectory() as workdir:
        result = run_benchmark(config, Path(workdir))
    finish(result, output, print_result, passed=result["scoring"]["check"]["prefix_loop_matches"])


if __name__ == "__main__":
    typer.run(main)
