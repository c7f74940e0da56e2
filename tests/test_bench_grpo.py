"""Smoke tests of bench/grpo_step.py: what it times runs and adds up, not the timings."""

from accelerate import init_empty_weights

from bench.grpo_step import run_benchmark, sd3_5_medium_transformer


def test_tiny_grpo_step_benchmark_reports_sampling_training_and_the_hidden_reward_wait():
    result = run_benchmark(
        batch_size=4, group_size=2, num_steps=2, window_size=1, batches=2, reward_latency=0.2, repeats=1, threads=1
    )
    assert result["config"]["image_shape"] == [32, 32, 3] and result["lora_parameters"] > 0
    assert result["sampling"]["images_per_s"] > 0 and result["train_step"]["step_s"] > 0
    serial, overlapped = result["reward"]["serial"], result["reward"]["overlapped"]
    assert serial["reward_wait_s"] >= 2 * 0.2  # every batch waits for its reward
    assert overlapped["reward_wait_s"] < serial["reward_wait_s"]  # all but the last wait hide behind sampling
    assert 0 < overlapped["reward_share"] < serial["reward_share"] < 1
    assert result["peak_memory_gib"] is None  # CUDA only


def test_sd3_5_medium_preset_has_the_released_transformer_shape():
    with init_empty_weights():
        model = sd3_5_medium_transformer()
    assert sum(p.numel() for p in model.parameters()) == 2_243_171_520
    assert len(model.transformer_blocks) == 24 and model.config.dual_attention_layers == tuple(range(13))
