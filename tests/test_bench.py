"""Smoke tests of bench/rm_throughput.py: correctness of what it times, not the timings."""

import torch
from transformers import AutoConfig, AutoModel

from bench._common import qwen2_5_vl_3b_config
from bench.rm_throughput import BenchConfig, run_benchmark
from vlm_rewards.models.backbones import build_tiny_backbone


def test_tiny_benchmark_prefix_loop_matches_one_pass(tmp_path):
    config = BenchConfig(batch_size=2, num_frames=3, frame_size=56, warmup=0, repeats=1, device="cpu")
    result = run_benchmark(config, tmp_path)

    scoring = result["scoring"]
    assert scoring["prefix_loop_matches"], scoring["prefix_loop_max_rel_diff"]
    assert scoring["check_clip_lengths"] == [3, 2]  # the check batches clips of different lengths
    assert not scoring["independent_matches"], scoring["independent_max_rel_diff"]  # context-free fails it
    assert scoring["frames"] == 6
    for name, forwards in {"one_pass": 1, "prefix_loop": 3, "independent": 3, "input_building": 0}.items():
        assert scoring[name]["forwards"] == forwards
        assert set(scoring[name]) == {"seconds", "frames_per_s", "forwards"}
    assert {"speedup_vs_prefix_loop", "speedup_vs_independent", "independent_max_rel_diff"} <= set(scoring)
    assert {"config", "machine", "parameters", "flops_per_frame", "matmul_flops_per_s", "scoring_mfu"} <= set(result)
    assert {"samples_per_s", "frames_per_s", "mfu", "peak_memory_gib"} <= set(result["training"])
    assert result["flops_per_frame"] > 0


def test_3b_preset_has_the_real_parameter_count(tmp_path):
    tiny_config = AutoConfig.from_pretrained(build_tiny_backbone("qwen2_5_vl", tmp_path))
    config = qwen2_5_vl_3b_config(tiny_config)
    assert config.image_token_id == tiny_config.image_token_id
    assert config.vision_end_token_id == tiny_config.vision_end_token_id
    with torch.device("meta"):
        backbone = AutoModel.from_config(config, dtype=torch.bfloat16)
    # Qwen/Qwen2.5-VL-3B-Instruct: 3,754,622,976 parameters (LM head tied to the embeddings).
    assert sum(p.numel() for p in backbone.parameters()) == 3_754_622_976
