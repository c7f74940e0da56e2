"""Rule rewards on image colour, for `kind: function` reward configs (tests and smoke runs).

Each takes a `RewardRequest` whose clip is one image and returns a float in [-1, 1] or [0, 1].
"""

from __future__ import annotations

import numpy as np

from vlm_rewards.interface import RewardRequest


def redness(request: RewardRequest) -> float:
    """Mean of R − (G + B)/2 over the last frame, in [-1, 1]."""
    pixels = request.frames[-1].astype(np.float64) / 255.0
    return float((pixels[..., 0] - (pixels[..., 1] + pixels[..., 2]) / 2).mean())


def brightness(request: RewardRequest) -> float:
    """Mean pixel value of the last frame, in [0, 1]."""
    return float(request.frames[-1].mean() / 255.0)
