"""Robotics consumers of the reward interface: MuJoCo envs, experts, reward wrappers and RL."""
