"""The run config's ``early_stop`` section (its defaults live here, once), read by server/engine/goals.py."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EarlyStopParams(BaseModel):
    """``early_stop``: stop a run whose primary metric stopped improving, keeping its best model."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    patience: int | None = Field(
        default=None, ge=1, description="Evaluations in a row without improvement of the run's primary metric (the "
        "target's, else accuracy) after which the run stops; its best model becomes the final model. None: off.")
    min_delta: float = Field(
        default=0.0, ge=0.0, description="An evaluation improves on the best only by more than this much.")
