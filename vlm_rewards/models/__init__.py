"""Qwen-VL backbones for the reward models: frame preprocessing, tiny test models, real loading, clip inputs."""
