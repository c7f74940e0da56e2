"""The `vlmr` console script: runs `vlm_rewards.cli:app`, and names the extra to install when a job
needs a dependency that the light core install (`pip install vlm-rewards`) leaves out."""

from __future__ import annotations

import sys

# Top-level module -> the extra of pyproject.toml that installs it.
EXTRA_FOR_MODULE = {
    "typer": "cli",
    "rich": "cli",
    "torch": "models",
    "transformers": "models",
    "tokenizers": "models",
    "safetensors": "models",
    "PIL": "models",
    "av": "models",
    "accelerate": "training",
    "peft": "training",
    "tensorboard": "training",
    "tqdm": "training",
    "matplotlib": "training",
    "scipy": "training",
    "sklearn": "training",
    "pyarrow": "training",
    "mujoco": "robotics",
    "gymnasium": "robotics",
    "stable_baselines3": "robotics",
    "cv2": "robotics",
    "diffusers": "generation",
    "ray": "serve",
}


def missing_extra_message(error: ModuleNotFoundError) -> str | None:
    """'vlmr needs ...' for a missing optional dependency, None for any other missing module."""
    top = (error.name or "").partition(".")[0]
    extra = EXTRA_FOR_MODULE.get(top)
    if extra is None:
        return None
    return (
        f"vlmr: this needs `{top}`, which the light core install leaves out; "
        f"install the `{extra}` extra: pip install 'vlm-rewards[{extra}]' (or 'vlm-rewards[all]')"
    )


def main() -> None:
    try:
        from vlm_rewards.cli import app

        app()
    except ModuleNotFoundError as error:
        message = missing_extra_message(error)
        if message is None:
            raise
        print(message, file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
