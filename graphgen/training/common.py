"""What every part of training shares: the target's mask token and name, what the corpus keeps, the
error."""

from __future__ import annotations

from ..errors import GraphgenError

# a control token SmolLM2 never emits in text: the mask filling every drafted block
SMOLLM2_MASK_TOKEN = 16  # <empty_output>
# the target's own name, which a speculators draft's config gives as its verifier
SMOLLM2_VERIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"


# the target's best tokens kept per decoded row: enough of its distribution to distil (the rest of
# the mass is small after 16 for a 135M model's greedy text)
TOP_KEPT = 16


class TrainError(GraphgenError):
    """Bad training settings or inputs; the message names them."""


def _clock(seconds: float) -> str:
    """m:ss, for progress lines."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"
