"""Image-generation consumers of the reward interface: GRPO for diffusion and flow-matching models.

- `sde`: stochastic sampler steps with Gaussian log-probs (Flow-SDE, CPS, DDIM η > 0).
- `models`: the generators (SD3 transformer + flow-matching scheduler, UNet + DDIM), tiny or pretrained.
- `sampling`: rollouts recording the SDE window's latents and log-probs.
- `grpo`: group advantages (one or several rewards), PPO-clip loss, diagnostics.
- `rewards`: scoring through `vlm_rewards.interface`, overlapped with sampling; gold rewards.
- `config`: the settings of every generation job (`vlmr grpo`, `rwr`, `pretrain-generator`), torch-free.
- `train`: the `vlmr grpo` loop (LoRA, accelerate, checkpoints); `rwr` and `pretrain` the other two jobs.
"""

if __name__ == "generation":  # the folder imported from a checkout by its old top-level name
    raise ImportError("`generation` is installed as `vlm_rewards.generation`: import vlm_rewards.generation")
