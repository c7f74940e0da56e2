"""Image-generation consumers of the reward interface: GRPO for diffusion and flow-matching models."""
