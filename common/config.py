"""Run configuration: one validated, frozen model shared by server and agents.

A run is a preset (a named bundle of policy choices) plus overrides. Config is
validated when built; errors name the offending field.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hermes.common.policies import base as policies
from hermes.common.policies.base import UnknownPolicy

# Strategies whose steps aggregate one update from every worker together (declared by each: provides 'barrier').
BARRIER_SYNCS = ("bsp", "ebsp")

AGGREGATIONS = ("mean", "samples", "loss", "power")

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
    # OmniLearn (paper 000) BSP: proportional control of each worker's batch
    # once per epoch (Eq. 6-7), global batch kept at K*b (Eq. 8), gradients
    # weighted by lambda_k = b_k / sum(b) (Eq. 4b); bounds and dead-band of
    # Fig. 11. OmniLearn bounds batches by fixed bounds and memory (Eq. 9)
    # only: the throughput-drop cap is ACSOS's, so it is off here.
    "omnilearn-bsp": {
        "sync": "bsp", "aggregation": "samples", "allocation": "pcontrol", "control_interval": "epoch",
        "b_min": 4, "b_max": 96, "pcontrol_deadband": 0.1, "pcontrol_throughput_cap": False,
    },
    # OmniLearn ASP (Alg. 2): the same controller without a global batch,
    # learning rate scaled by b_k / B instead of gradient weighting (Eq. 5b).
    # lr 0.2 so that a worker at the initial b = B/K steps at 0.05.
    "omnilearn-asp": {
        "sync": "asp", "aggregation": "mean", "allocation": "pcontrol", "control_interval": "epoch",
        "lr_scaling": "batch-scaled", "lr": 0.2, "momentum": 0.0, "b_min": 4, "b_max": 96,
        "pcontrol_deadband": 0.1, "pcontrol_throughput_cap": False,
    },
    # ACSOS dynamic batching (paper 001): the same proportional law adjusted
    # at any iteration with EWMA-smoothed times, global batch fixed (Eq. 4-5).
    "dynamic-batching": {
        "sync": "bsp", "aggregation": "samples", "allocation": "pcontrol", "control_interval": "round",
        "b_min": 4, "b_max": 96, "pcontrol_deadband": 0.1,
    },
    # OmniLearn's variable batching (Sec. III-A): batches from declared
    # cores, never re-measured.
    "variable-batching": {"sync": "bsp", "aggregation": "samples", "allocation": "static", "b_min": 4, "b_max": 96},
    # Chao et al. (paper 002): w_i micro-batches accumulated per step (Eq. 10),
    # aggregation weighted by each worker's share of the step's samples.
    "task-allocation": {"sync": "bsp", "aggregation": "samples", "allocation": "adaptive", "lr": 0.1},
    # DP-SGD / EDP-SGD (paper 003): per-epoch partitions by compute power
    # (Alg. 1); EDP-SGD also weighs gradients by normalised compute power (Sec. 4.2).
    "dp-sgd": {"sync": "bsp", "aggregation": "mean", "allocation": "partition"},
    "edp-sgd": {"sync": "bsp", "aggregation": "power", "allocation": "partition"},
}
DEFAULT_PRESET = "hermes"

PRESET_SOURCES: dict[str, str] = {
    "hermes": "Hermes (When Less is More): gated pushes, loss-weighted blend, dual binary search",
    "asp": "asynchronous parallel baseline",
    "bsp": "bulk-synchronous baseline, uniform batches",
    "ssp": "stale-synchronous parallel baseline (bounded staleness)",
    "ebsp": "elastic BSP baseline (Zipline-style predicted barrier)",
    "omnilearn-bsp": "OmniLearn BSP: proportional-control dynamic batching per epoch, fixed global batch",
    "omnilearn-asp": "OmniLearn ASP: proportional-control dynamic batching, batch-scaled learning rate",
    "dynamic-batching": "ACSOS dynamic batching: proportional control at every round, fixed global batch",
    "variable-batching": "OmniLearn/ACSOS static variable batching from declared cores",
    "task-allocation": "Chao et al.: self-adaptive gradient-accumulation counts per worker",
    "dp-sgd": "DP-SGD: per-epoch data partitions by measured compute power",
    "edp-sgd": "EDP-SGD: DP-SGD plus gradients weighted by compute power",
}
POLICY_FIELDS = ("sync", "allocation", "aggregation", "gate", "lr_scaling")


def preset_policies(name: str) -> dict[str, Any]:
    """The policies a preset selects, as the run would build them."""
    cfg = build_config(name)
    return {f: getattr(cfg, f) for f in POLICY_FIELDS}


class ConfigError(ValueError):
    """A run configuration that cannot be built; the message names the field."""


class RunConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: str = DEFAULT_PRESET
    sync: str = "asp"
    aggregation: Literal["mean", "samples", "loss", "power"] = "mean"
    # "batch-scaled": eta_k = eta * b_k / sum(b) for asynchronous pushes (OmniLearn Eq. 5b).
    lr_scaling: Literal["none", "batch-scaled"] = "none"
    # ASP only: refuse updates computed from a model more than this many versions old.
    max_staleness: int | None = Field(default=None, ge=0)
    # SSP: pushes a worker may run ahead of the slowest active worker.
    ssp_staleness: int = Field(default=3, ge=0)
    # EBSP: lookahead R (pushes of the fastest worker) and push-interval history per worker.
    ebsp_lookahead: int = Field(default=3, ge=1)
    ebsp_history: int = Field(default=10, ge=2)

    # "ps": the server holds the model and folds pushed updates. "collective":
    # workers all-reduce weighted gradients among themselves (torch.distributed,
    # gloo on CPU, nccl on CUDA); the server only coordinates (ranks, the
    # rendezvous store, work sizes), evaluates copies rank 0 sends and reports.
    topology: Literal["ps", "collective"] = "ps"
    # Collective: the group's size (every rank must join before the first step)
    # and how long a collective may wait on a peer before failing.
    world_size: int | None = Field(default=None, ge=1)
    collective_timeout_seconds: float = Field(default=60.0, gt=0.0)
    # Collective: when a rank dies the survivors re-form the group (a new
    # generation, ranks 0..n-1) instead of exiting; false keeps the fail-fast
    # behaviour (every rank exits with code 5).
    collective_regroup: bool = True
    # How long the server waits, after the first survivor reports the failure,
    # for the others: longer than the slowest rank's step plus the time its
    # all-reduce takes to fail, or a slow survivor is left out.
    collective_regroup_seconds: float = Field(default=5.0, gt=0.0)
    # Fewer survivors than this end the run with an error. 1 by default: the
    # weighted all-reduce is exact for any group size and the replicas hold
    # the model, so a lone survivor still makes progress rather than losing it.
    collective_min_world_size: int = Field(default=1, ge=1)

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
    # How alpha relaxes while silent: "step" (ours), "paper" (Hermes Alg. 1 literally), "multiplicative".
    gate_relaxation: Literal["step", "paper", "multiplicative"] = "step"
    gate_validation_samples: int = Field(default=256, gt=0)
    # Loss-weighted aggregation (Hermes Alg. 2): candidate models are scored on this many validation samples.
    loss_eval_samples: int = Field(default=512, gt=0)

    # Work sizing: uniform, or Hermes' IQR straggler detection + dual binary search (Sec. IV-A).
    allocation: Literal["uniform", "dual-search", "static", "pcontrol", "adaptive", "partition"] = "uniform"
    # Per-step batch bounds of static/pcontrol/partition (OmniLearn Fig. 11: 4..96).
    b_min: int = Field(default=4, gt=0)
    b_max: int = Field(default=96, gt=0)
    # pcontrol: dead-band (OmniLearn Eq. 7), EWMA weight of the newest cycle,
    # when to step ("epoch": after each data epoch; "round": whenever every
    # worker has new measurements), and the global batch rule (Eq. 8): None
    # = fixed under a barrier, free for asynchronous pushes.
    pcontrol_deadband: float = Field(default=0.1, ge=0.0, lt=1.0)
    pcontrol_alpha: float = Field(default=0.3, gt=0.0, le=1.0)
    control_interval: Literal["epoch", "round"] = "epoch"
    # ACSOS throughput-drop rule (b_max <- b0 when throughput fell after b0 -> b):
    # a fall within this margin is noise (cycle times on a shared CPU jitter by
    # 10-30%; ACSOS Fig. 5's memory cliff is far steeper), and a cap is lifted
    # after this many control steps (0 = never, the paper's rule).
    # Keep the smoothed time across a batch change, rescaled by the batch ratio
    # (see controllers.ProportionalController); False restarts it (ACSOS).
    pcontrol_carry_smoothing: bool = True
    pcontrol_throughput_cap: bool = True
    pcontrol_drop_margin: float = Field(default=0.25, ge=0.0, lt=1.0)
    pcontrol_drop_cap_updates: int = Field(default=10, ge=0)
    global_batch: Literal["fixed", "free"] | None = None
    # adaptive (Chao et al. Alg. 1): stop re-allocating once every share moved
    # less than epsilon (relative) this many epochs in a row.
    adaptive_epsilon: float = Field(default=0.05, gt=0.0)
    adaptive_patience: int = Field(default=2, ge=1)
    # partition (DP-SGD Sec. 4.1): epochs of compute-power history per estimate.
    partition_window: int = Field(default=1, ge=1)
    # Share of a worker's free memory its per-step batch may plan for (OmniLearn Eq. 9 b_max).
    memory_fraction: float = Field(default=0.5, gt=0.0, le=1.0)
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
    # The server stops the run itself once an evaluation reaches this test
    # accuracy (the same stop as POST /v1/stop); None trains until stopped.
    target_accuracy: float | None = None
    eval_max_samples: int = Field(default=2000, gt=0)
    stats_interval_seconds: float = Field(default=2.0, gt=0.0)

    @field_validator("sync")
    @classmethod
    def _known_sync(cls, v: str) -> str:
        try:
            return policies.canonical("sync", v)
        except UnknownPolicy:
            raise ValueError(f"unknown sync strategy {v!r}; known: {sorted(policies.names('sync'))}") from None

    @field_validator("target_accuracy")
    @classmethod
    def _target_in_range(cls, v: float | None) -> float | None:
        # Checked here rather than with Field(gt=, le=) so the message says what
        # the number is: a fraction of the test set, not a percentage.
        if v is not None and not (math.isfinite(v) and 0.0 < v <= 1.0):
            raise ValueError(f"target_accuracy={v}: must be a test accuracy in (0, 1], e.g. 0.9 (not 90)")
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
    def _coherent(self) -> RunConfig:
        # Parameters of a policy the run did not choose (max_staleness, global_batch) would be silently ignored.
        for kind in policies.KINDS:
            chosen = policies.selected_name(self, kind)
            for name in policies.names(kind):
                # Declared on the class itself: a subclass (hermes of asp) does not inherit the parameter.
                for field in vars(policies.get(kind, name)).get("exclusive_params", ()):
                    if name != chosen and getattr(self, field) is not None:
                        raise ValueError(f"{field} applies to {kind} {name!r} only, not {chosen!r}")
        # Each policy declares what it needs (policies.base); this checks every declaration.
        policies.check_compatible(self)
        if self.dataset in ("mnist", "cifar10") and not self.dataset_root:
            raise ValueError(f"dataset {self.dataset!r} is read from local files: set dataset_root")
        return self

    @property
    def barrier_sync(self) -> bool:
        """The sync policy aggregates one step's updates together (BSP, EBSP)."""
        return "barrier" in policies.get("sync", self.sync).provides

    @property
    def fixed_global_batch(self) -> bool:
        if self.global_batch is not None:
            return self.global_batch == "fixed"
        return self.barrier_sync


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
