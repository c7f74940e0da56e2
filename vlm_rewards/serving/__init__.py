"""Serving rewards over HTTP: `vlmr serve` (Ray Serve, `server.py`) and `RemoteReward` (`client.py`).

Only the client is imported here; it needs numpy, pydantic and httpx, never ray or torch. The server
side (`vlm_rewards.serving.server`) imports ray and fastapi and is loaded by `vlmr serve` only.
"""

from vlm_rewards.serving.client import RemoteReward, RemoteRewardError, RewardVersionError

__all__ = ["RemoteReward", "RemoteRewardError", "RewardVersionError"]
