"""Smoke tests of bench/rm_throughput.py: correctness of what it times, not the timings."""

import pytest
import torch
from transformers import AutoConfig, AutoModel

from bench import rm_throughput
from bench._common import qwen2_5_vl_3b_config
from bench.rm_throughput import BenchConfig, run_benchmark
from vlm_rewards.models.backbones import build_tiny_backbone


def test_tiny_benchmark_prefix_loop_matches_one_pass(tmp_path):
    config = BenchConfig(batch_size=2, num_frames=3, frame_size=56, warmup=0, repeats=1, train_repeats=1, device="cpu")
    result = run_benchmark(config, tmp_path)

    scoring, check = result["scoring"], result["scoring"]["check"]
    assert check["prefix_loop_matches"], check
    assert check["bound"] == 1e-4 and check["prefix_loop_error"] == check["prefix_loop_vs_one_pass"] < 1e-5
    assert check["clip_lengths"] == [3, 2]  # the check batches clips of different lengths
    assert not check["independent_matches"], check  # context-free readouts fail it
    assert scoring["frames"] == 6
    for name, forwards in {"one_pass": 1, "prefix_loop": 3, "independent": 3, "input_building": 0}.items():
        assert scoring[name]["forwards"] == forwards
        assert set(scoring[name]) == {"seconds", "frames_per_s", "forwards"}
    assert {"speedup_vs_prefix_loop", "speedup_vs_independent"} <= set(scoring)
    assert {"config", "machine", "parameters", "flops_per_frame", "matmul_flops_per_s", "scoring_mfu"} <= set(result)
    assert result["flops_per_frame"] > 0
    # one-pass scoring ran the batched vision path (one SDPA call per window length), checked against the tower
    vision = result["scoring_vision"]
    assert vision["path"].startswith("batched") and vision["enabled"] and vision["check"]["agrees"]

    full, lora = result["training"]["full"], result["training"]["lora"]
    for training in (full, lora):
        assert {"samples_per_s", "frames_per_s", "mfu", "peak_memory_gib", "flops_formula"} <= set(training)
        assert training["gradient_checkpointing"] and training["mfu"] > 0
    params, tokens = result["parameters"], sum(result["tokens_per_clip"])
    forward = result["flops_per_frame"] * scoring["frames"]
    assert full["flops_per_step"] == pytest.approx(3 * forward)
    assert lora["flops_per_step"] == pytest.approx(forward + 2 * params["lm_without_embeddings"] * tokens)
    assert lora["lora"]["r"] == 16 and 0 < lora["trainable_parameters"] < full["trainable_parameters"] / 4


def test_bf16_prefix_loop_check_uses_the_derived_bound(tmp_path):
    """bfloat16: the prefix loop and one pass are both compared with a float32 copy's one pass; the loop passes
    within 2x the one pass's own error (+1e-4), while context-free readouts are far outside."""
    config = BenchConfig(
        batch_size=2, num_frames=3, frame_size=56, warmup=0, repeats=1, device="cpu", dtype="bfloat16", train=False
    )
    result = run_benchmark(config, tmp_path)

    check = result["scoring"]["check"]
    assert 0 < check["one_pass_error"] < 0.1
    assert check["bound"] == pytest.approx(2 * check["one_pass_error"] + 1e-4)
    assert check["prefix_loop_matches"] and check["prefix_loop_error"] <= check["bound"], check
    assert not check["independent_matches"], check
    vision = result["scoring_vision"]  # the batched vision path passed its bfloat16 check
    assert vision["enabled"] and vision["check"]["fast_error"] <= vision["check"]["bound"]
    assert vision["check"]["reference_error"] > 0
    assert "training" not in result


def test_readout_check_fails_a_prefix_loop_that_loses_its_context(tmp_path, monkeypatch):
    """The derived bound is not loose: a prefix loop reading each frame without its context fails it."""
    config = BenchConfig(
        batch_size=2, num_frames=3, frame_size=56, warmup=0, repeats=1, device="cpu", dtype="bfloat16", train=False
    )
    loop_readouts = rm_throughput.loop_readouts
    monkeypatch.setattr(
        rm_throughput, "loop_readouts", lambda model, requests, context: loop_readouts(model, requests, False)
    )
    check = run_benchmark(config, tmp_path)["scoring"]["check"]
    assert not check["prefix_loop_matches"] and check["prefix_loop_error"] > check["bound"], check


def test_3b_preset_has_the_real_parameter_count(tmp_path):
    tiny_config = AutoConfig.from_pretrained(build_tiny_backbone("qwen2_5_vl", tmp_path))
    config = qwen2_5_vl_3b_config(tiny_config)
    assert config.image_token_id == tiny_config.image_token_id
    assert config.vision_end_token_id == tiny_config.vision_end_token_id
    with torch.device("meta"):
        backbone = AutoModel.from_config(config, dtype=torch.bfloat16)
    # Qwen/Qwen2.5-VL-3B-Instruct: 3,754,622,976 parameters (LM head tied to the embeddings).
    assert sum(p.numel() for p in backbone.parameters()) == 3_754_622_976
