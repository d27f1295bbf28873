"""How quarantine weighs evidence, a section of the screening settings (torch-free, like screening_params)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class QuarantineSettings(BaseModel):
    """``screening.quarantine``: how refusals become evidence, and how a worker earns its way out.

    The threshold itself is ``screening.quarantine_after`` (0: never quarantine).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Evidence halves over this many seconds: an old refusal weighs less than a new one.
    half_life_seconds: float = Field(default=60.0, gt=0.0)
    # A refusal counts only this long after the last counted one of the same worker, and only
    # at another global model version: a burst (5 refusals in 70 ms under fedasync, issue 29)
    # is one piece of evidence, not five.
    min_gap_seconds: float = Field(default=1.0, ge=0.0)
    # Each accepted update of the worker multiplies its score by this: honest work outweighs
    # the odd refusal (an honest worker refused 1 push in 10 stays near a score of 1).
    accepted_factor: float = Field(default=0.5, ge=0.0, le=1.0)
    # Quarantined updates are still screened (not folded); this many accepted in a row release
    # the worker (0: only the operator releases it).
    probation: int = Field(default=3, ge=0)
