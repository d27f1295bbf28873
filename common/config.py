"""Run configuration: one validated, frozen model shared by server and agents.

A run is a preset (a named bundle of policy choices) plus overrides. Config is
validated when built; errors name the offending field.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hermes.common.sync import SYNC_STRATEGIES

AGGREGATIONS = ("mean", "samples", "loss")

# Preset -> policy choices. Later issues add omnilearn-*, etc.
PRESETS: dict[str, dict[str, Any]] = {
    # Hermes (paper 004, Sec. IV): gated async pushes, loss-weighted
    # aggregation, IQR straggler detection + dual binary search. Table I: CNN
    # trained with plain SGD, w=10, alpha=-1.3, beta=0.1, lambda=5.
    "hermes": {
        "sync": "hermes", "aggregation": "loss", "gate": "zscore", "allocation": "dual-search",
        "momentum": 0.0, "lr": 0.1,
    },
    # Local momentum on top of asynchronous, stale updates diverged on the
    # testbed (digits, HL4: accuracy back to chance within 10 s); plain SGD
    # converges, so ASP runs without it.
    "asp": {"sync": "asp", "aggregation": "mean", "momentum": 0.0},
    "bsp": {"sync": "bsp", "aggregation": "samples"},
    # Bounded staleness: a worker runs at most ssp_staleness pushes ahead of
    # the slowest (Hermes Table III runs SSP with s = 125 on 12 workers).
    "ssp": {"sync": "ssp", "aggregation": "mean", "momentum": 0.0},
    # Elastic BSP (Zipline-style): the barrier falls where predicted waiting
    # is least within ebsp_lookahead pushes of the fastest worker.
    "ebsp": {"sync": "ebsp", "aggregation": "samples"},
}
DEFAULT_PRESET = "hermes"


class ConfigError(ValueError):
    """A run configuration that cannot be built; the message names the field."""


class RunConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: str = DEFAULT_PRESET
    sync: str = "asp"
    aggregation: Literal["mean", "samples", "loss"] = "mean"
    # ASP only: refuse updates computed from a model more than this many versions old.
    max_staleness: int | None = Field(default=None, ge=0)
    # SSP: pushes a worker may run ahead of the slowest active worker.
    ssp_staleness: int = Field(default=3, ge=0)
    # EBSP: lookahead R (pushes of the fastest worker) and push-interval history per worker.
    ebsp_lookahead: int = Field(default=3, ge=1)
    ebsp_history: int = Field(default=10, ge=2)

    model: str = "cnn"
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    dataset: str = "digits"
    dataset_root: str | None = None
    num_samples: int | None = Field(default=None, gt=0)
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    seed: int = 0

    lr: float = Field(default=0.05, gt=0.0)
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    batch_size: int = Field(default=32, gt=0)
    # Samples an agent trains on between two pushes (Hermes' dataset size, DSS).
    cycle_samples: int = Field(default=128, gt=0)
    shard_size: int = Field(default=64, gt=0)

    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    wire_dtype: Literal["float32", "float16", "bfloat16"] = "float32"

    # Held out of the training set: the agents' gate and the server's loss
    # weighting decide on it, never on the test set.
    validation_fraction: float = Field(default=0.1, gt=0.0, lt=1.0)

    # Update gate (Hermes Alg. 1); defaults from Hermes Table I.
    gate: Literal["always", "zscore"] = "always"
    gate_window: int = Field(default=10, ge=2)
    gate_alpha: float = Field(default=-1.3, allow_inf_nan=False)
    gate_beta: float = Field(default=0.1, ge=0.0)
    gate_lambda: int = Field(default=5, ge=1)
    gate_validation_samples: int = Field(default=256, gt=0)
    # Loss-weighted aggregation (Hermes Alg. 2): candidate models are scored on this many validation samples.
    loss_eval_samples: int = Field(default=512, gt=0)

    # Work sizing: uniform, or Hermes' IQR straggler detection + dual binary search (Sec. IV-A).
    allocation: Literal["uniform", "dual-search"] = "uniform"
    mbs_min: int = Field(default=8, gt=0)
    mbs_max: int = Field(default=256, gt=0)
    search_tolerance: float = Field(default=0.1, gt=0.0, lt=1.0)
    cost_fit: Literal["linear", "constant"] = "linear"
    rebalance_min_observations: int = Field(default=2, ge=1)
    # Beyond Hermes' IQR rule: also resize workers further than this share
    # from the median cycle time (0 = the paper's rule); see common/sizing.py.
    balance_band: float = Field(default=0.2, ge=0.0)
    rebalance_warmup_cycles: int = Field(default=1, ge=0)

    eval_interval_seconds: float = Field(default=1.0, gt=0.0)
    eval_max_samples: int = Field(default=2000, gt=0)
    stats_interval_seconds: float = Field(default=2.0, gt=0.0)

    @field_validator("sync")
    @classmethod
    def _known_sync(cls, v: str) -> str:
        if v not in SYNC_STRATEGIES:
            raise ValueError(f"unknown sync strategy {v!r}; known: {sorted(SYNC_STRATEGIES)}")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        from hermes.common.models import MODEL_NAMES

        if v not in MODEL_NAMES:
            raise ValueError(f"unknown model {v!r}; known: {list(MODEL_NAMES)}")
        return v

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, v: str) -> str:
        from hermes.common.datasets import DATASET_NAMES

        if v not in DATASET_NAMES:
            raise ValueError(f"unknown dataset {v!r}; known: {list(DATASET_NAMES)}")
        return v

    @model_validator(mode="after")
    def _coherent(self) -> "RunConfig":
        if self.max_staleness is not None and self.sync != "asp":
            raise ValueError(f"max_staleness applies to sync 'asp' only, not {self.sync!r}")
        if self.aggregation == "loss" and self.sync not in ("hermes", "asp"):
            raise ValueError(
                f"aggregation 'loss' folds one update at a time against the global model (Hermes Alg. 2); "
                f"it needs sync 'hermes' or 'asp', not {self.sync!r}"
            )
        if self.gate == "zscore" and self.sync in ("bsp", "ssp", "ebsp"):
            raise ValueError(
                f"gate 'zscore' lets workers skip pushes, so a {self.sync!r} barrier would wait forever; "
                f"use an asynchronous sync strategy"
            )
        if self.allocation == "dual-search":
            for name in ("mbs_min", "mbs_max", "batch_size"):
                v = getattr(self, name)
                if v & (v - 1):
                    raise ValueError(f"{name}={v}: dual-search mini-batch sizes are powers of two")
            if not self.mbs_min <= self.batch_size <= self.mbs_max:
                raise ValueError(f"batch_size={self.batch_size} outside [mbs_min, mbs_max]=[{self.mbs_min}, {self.mbs_max}]")
        if self.dataset in ("mnist", "cifar10") and not self.dataset_root:
            raise ValueError(f"dataset {self.dataset!r} is read from local files: set dataset_root")
        return self


def build_config(preset: str | None = None, **overrides: Any) -> RunConfig:
    """Preset defaults, then overrides; ConfigError names every bad field."""
    name = preset or overrides.pop("preset", None) or DEFAULT_PRESET
    if name not in PRESETS:
        raise ConfigError(f"preset: unknown preset {name!r}; known: {sorted(PRESETS)}")
    values = {**PRESETS[name], **{k: v for k, v in overrides.items() if v is not None}, "preset": name}
    try:
        return RunConfig(**values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(problems) from None


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read run-config overrides from a JSON or TOML file."""
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {p}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text.decode()) if p.suffix == ".toml" else json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {p}: not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p}: top level must be a table/object")
    return data
