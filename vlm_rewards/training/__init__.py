"""Reward-model training: configs, deterministic batch samplers, the accelerate training loop."""
