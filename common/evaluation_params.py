"""The run config's ``early_stop`` and ``federated_eval`` sections (their defaults live here, once).

Read by the server's goals (server/engine/goals.py) and its federated
evaluation (server/engine/federated_eval.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EarlyStopParams(BaseModel):
    """``early_stop``: stop a run whose primary metric stopped improving, keeping its best model."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    patience: int | None = Field(
        default=None, ge=1, description="Evaluations in a row without improvement of the run's primary metric (the "
        "target's, else accuracy) after which the run stops; its best model becomes the final model. None: off.")
    min_delta: float = Field(
        default=0.0, ge=0.0, description="An evaluation improves on the best only by more than this much.")
    metric: Literal["primary", "loss"] = Field(
        default="primary", description="What must improve: the run's primary metric, or the test loss (Hermes "
        "Table I's patience, read as Keras' EarlyStopping on the loss: preset hermes-paper, patience 25).")


class FederatedEvalParams(BaseModel):
    """``federated_eval``: every agent scores the global model on its own held-out data (task.local_eval_data)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    every: int = Field(
        default=0, ge=0, description="Ask the agents for a federated evaluation every this many server evaluations "
        "(0: never). Reported as federated_<metric>, the devices' values weighted by their samples.")
