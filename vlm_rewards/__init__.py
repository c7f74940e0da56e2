"""vlm-rewards: VLM progress and preference reward models behind one reward interface.

The names below load on first use (PEP 562), so processes that import one submodule, such as the
annotation job's decode workers, do not pay for the interface and the registry.
"""

import importlib

_EXPORTS = {
    "BaseReward": "vlm_rewards.interface",
    "RewardModel": "vlm_rewards.interface",
    "RewardRequest": "vlm_rewards.interface",
    "RewardResult": "vlm_rewards.interface",
    "RewardSession": "vlm_rewards.interface",
    "RewardSpec": "vlm_rewards.interface",
    "SampleKey": "vlm_rewards.interface",
    "build_reward": "vlm_rewards.registry",
    "register": "vlm_rewards.registry",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'vlm_rewards' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
