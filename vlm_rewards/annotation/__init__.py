"""Reward annotation of video datasets (`vlmr annotate`): resumable, fault-tolerant, local or on Ray Data.

See docs/annotation.md. Sources (`sources`), decoding (`decode`), batched scoring through the reward
interface (`scoring`), the output folder (`outputs`), the engines (`runner`, `ray_engine`), the report
(`report`).
"""

from vlm_rewards.annotation.config import AnnotateConfig
from vlm_rewards.annotation.runner import AnnotationSummary, run_annotation

__all__ = ["AnnotateConfig", "AnnotationSummary", "run_annotation"]
