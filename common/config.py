"""Run configuration: one validated, frozen model shared by server and agents.

A run is a preset (a named bundle of policy choices, ``presets.py``) plus
overrides. The config is a flat core (model, data, optimizer, evaluation),
the policy names (``sync``, ``gate`` ...), and one section per policy that
has parameters, whose model and defaults the policy's own module owns
(``config.zscore.alpha``, ``config.pcontrol.deadband``). Keys may be given
nested, dotted or by their old flat names (``config_keys.ALIASES``). The
config is validated when built; errors name the offending field.
"""

from __future__ import annotations

import json
import logging
import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hermes.common.config_keys import normalise
from hermes.common.evaluation_params import EarlyStopParams, FederatedEvalParams
from hermes.common.policies import base as policies
from hermes.common.policies.aggregation import LossParams
from hermes.common.policies.allocation._common import BatchBounds, RebalanceParams
from hermes.common.policies.allocation.dynamic_partitioning import PartitionParams
from hermes.common.policies.allocation.proportional_control import PControlParams
from hermes.common.policies.allocation.straggler import DualSearchParams
from hermes.common.policies.allocation.task_allocation import AdaptiveParams
from hermes.common.policies.base import UnknownPolicy
from hermes.common.policies.compression import (
    CompressionParams,
    Int8Params,
    PowerSgdParams,
    TopKParams,
    check_choice,
)
from hermes.common.policies.concurrency import ConcurrencyParams
from hermes.common.policies.federated import FedAsyncParams, FedBuffParams
from hermes.common.policies.gate import GateParams
from hermes.common.policies.robust import RobustParams
from hermes.common.policies.sync import AsyncParams, BarrierParams, EbspParams, SspParams
from hermes.common.policies.topology import CollectiveParams
from hermes.common.presets import DEFAULT_PRESET, PRESET_SOURCES, PRESETS, unknown_preset

log = logging.getLogger(__name__)

__all__ = ["PRESETS", "PRESET_SOURCES", "DEFAULT_PRESET", "POLICY_FIELDS",
           "ConfigError", "RunConfig", "build_config", "load_config_file", "preset_policies", "SECTIONS"]

POLICY_FIELDS = ("sync", "allocation", "aggregation", "gate", "lr_scaling")
# The deprecated pull_dtype's values as compression.pull codecs.
_PULL_DTYPE_CODECS = {"float16": "fp16", "bfloat16": "bf16", "float32": "none"}


def preset_policies(name: str) -> dict[str, Any]:
    """The policies a preset selects, as the run would build them."""
    cfg = build_config(name)
    return {f: getattr(cfg, f) for f in POLICY_FIELDS}


def parse_target(text: str) -> tuple[str, float]:
    """``"r2=0.8"`` -> ("r2", 0.8); ValueError says what is wrong."""
    metric, sep, raw = text.partition("=")
    metric = metric.strip()
    if not sep or not metric:
        raise ValueError(f"target {text!r}: expected METRIC=VALUE, e.g. accuracy=0.9 or r2=0.8")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"target {text!r}: {raw.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"target {text!r}: the value must be finite")
    return metric, value


class ConfigError(ValueError):
    """A run configuration that cannot be built; the message names the field."""


def _section(model: type[BaseModel], owner: str) -> Any:
    return Field(default_factory=model, description=owner)


class RunConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: str = Field(default=DEFAULT_PRESET, description="The preset the run starts from: its policy choices and parameters, then the "
                                    "overrides (see Presets).")

    # ---- policy names (one per kind; their parameters are the sections below). The registry
    # (policies.base) is the one table of names: each is checked there and an alias is
    # stored as the name it stands for.
    sync: str = Field(default="asp", description="Sync policy: hermes (gated async), asp, bsp, ssp, ebsp, "
                                                     "fedbuff (buffered async).")
    aggregation: str = Field(
        default="mean", description="How a step's updates count: mean, samples (OmniLearn Eq. 4b), loss (Hermes "
                                    "Alg. 2), power (EDP-SGD), fedasync (staleness-weighted mixing, Xie et al. "
                                    "2019), fedbuff (buffered mean with a server lr, Nguyen et al. 2022), or, "
                                    "robust (a round, a buffer or a staleness window), median / trimmed-mean (coordinate-wise, Yin et al. "
                                    "2018) and krum (Krum / Multi-Krum, Blanchard et al. 2017).")
    lr_scaling: str = Field(
        default="none", description="'batch-scaled': eta_k = eta * b_k / sum(b) for asynchronous pushes (OmniLearn Eq. 5b).")
    topology: str = Field(
        default="ps", description="'ps': the server folds pushed updates; 'collective': workers all-reduce "
                                  "(torch.distributed), the server only coordinates, evaluates and reports.")
    gate: str = Field(
        default="always", description="Update gate: 'always' pushes every cycle; 'zscore' is HermesGUP (Hermes Alg. 1).")
    allocation: str = Field(
        default="uniform", description="Who gets how much work: uniform, static (OmniLearn Eq. 4a), pcontrol "
                                       "(OmniLearn Eq. 6-8, ACSOS), adaptive (Chao Eq. 10), partition (DP-SGD), "
                                       "dual-search (Hermes Sec. IV-A).")

    # ---- policy sections: each model and its defaults live in the owning policy's module
    asp: AsyncParams = _section(AsyncParams, "sync 'asp'")
    ssp: SspParams = _section(SspParams, "sync 'ssp'")
    bsp: BarrierParams = _section(BarrierParams, "sync 'bsp'")
    ebsp: EbspParams = _section(EbspParams, "sync 'ebsp'")
    collective: CollectiveParams = _section(CollectiveParams, "topology 'collective'")
    zscore: GateParams = _section(GateParams, "gate 'zscore'")
    loss: LossParams = _section(LossParams, "aggregation 'loss'")
    fedasync: FedAsyncParams = _section(FedAsyncParams, "aggregation 'fedasync'")
    fedbuff: FedBuffParams = _section(FedBuffParams, "sync and aggregation 'fedbuff'")
    robust: RobustParams = _section(RobustParams, "aggregations 'median', 'trimmed-mean', 'krum'")
    batch_bounds: BatchBounds = _section(BatchBounds, "allocations 'static', 'pcontrol', 'partition'")
    rebalance: RebalanceParams = _section(RebalanceParams, "allocations 'pcontrol', 'adaptive', 'dual-search'")
    pcontrol: PControlParams = _section(PControlParams, "allocation 'pcontrol'")
    adaptive: AdaptiveParams = _section(AdaptiveParams, "allocation 'adaptive'")
    partition: PartitionParams = _section(PartitionParams, "allocation 'partition'")
    dual_search: DualSearchParams = _section(DualSearchParams, "allocation 'dual-search'")
    early_stop: EarlyStopParams = _section(EarlyStopParams, "early stopping (server)")
    federated_eval: FederatedEvalParams = _section(FederatedEvalParams, "federated evaluation (server and agents)")
    concurrency: ConcurrencyParams = _section(ConcurrencyParams, "workers training at once (server; FedBuff's C)")
    compression: CompressionParams = _section(CompressionParams, "the codecs of pushes and pulls")
    int8: Int8Params = _section(Int8Params, "compression 'int8'")
    topk: TopKParams = _section(TopKParams, "compression 'topk'")
    powersgd: PowerSgdParams = _section(PowerSgdParams, "compression 'powersgd'")

    # ---- the task: model, data, loss, metrics, optimizer (hermes.common.task)
    task: str = Field(default="builtin", min_length=1, description="The task to train: MODULE:ATTR, FILE.py:ATTR or a "
                      "name registered under the hermes.tasks entry points; 'builtin' trains the model and dataset "
                      "keys below.")

    # ---- model and data (the builtin task)
    model: str = Field(default="cnn", description="cnn (MNIST-style, ~110K params on 28x28), alexnet (~1M, 32x32 "
                       "colour), resnet18 (CIFAR), mlp (model_kwargs hidden), edge-resnet (1.21M, 32x32 colour; model_kwargs width).")
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the model's factory.")
    dataset: str = Field(default="digits", description="digits (scikit-learn, embedded), mnist1d (generated), synthetic "
                         "(any size: num_samples), mnist (IDX files), cifar10 (binary or python batches), synthetic-cifar (generated 3x32x32, 10 classes).")
    dataset_root: str | None = Field(default=None, description="Folder with MNIST IDX files or CIFAR-10 batches (required for those).")
    num_samples: int | None = Field(default=None, gt=0, description="Samples of a synthetic data set.")
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="Share of the data held out as the test set.")
    # Held out of the training set: the agents' gate and the server's loss
    # weighting decide on it, never on the test set.
    validation_fraction: float = Field(
        default=0.1, gt=0.0, lt=1.0, description="Share of the training data held out for the gate and loss weighting.")
    seed: int = Field(default=0, description="Seed of the model's initial weights and the data split.")

    # ---- optimizer and work
    lr: float = Field(default=0.05, gt=0.0, description="Learning rate of the agents' SGD.")
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0, description="SGD momentum (the asynchronous presets run without: 0).")
    # client/trainer.py: moments gathered around a point that far away describe another region of the loss surface.
    optimizer_reset_jump: float | None = Field(
        default=0.5, gt=0.0, description="An agent drops its optimizer state (momentum) when a pulled model lies "
        "further than this from its own, relative L2; unset: never (every paper keeps it).")
    weight_decay: float = Field(default=0.0, ge=0.0, description="SGD weight decay.")
    batch_size: int = Field(default=32, gt=0, description="Mini-batch size (MBS); the batch-sizing policies scale each "
                            "worker's batch b_k from it and keep cycle_samples // batch_size steps per cycle.")
    cycle_samples: int = Field(
        default=128, gt=0, description="Samples an agent trains on between two pushes (Hermes' dataset size, DSS).")
    shard_size: int = Field(default=64, gt=0, description="Samples per data shard (the unit of DSS and of Kafka records).")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        default="auto", description="'auto' = each agent times a few training steps of the model in every "
                                    "precision its device supports (fp32; bf16; fp16 with loss scaling on CUDA) and "
                                    "trains in fp32 unless another is > 5% faster; fp32, bf16, fp16 force one.")
    wire_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        default="float32", description="dtype of pushed updates (the server accumulates in fp32).")
    pull_dtype: Literal["float32", "float16", "bfloat16"] = Field(
        default="float32", description="dtype of the model agents receive (pulls, and push replies that bring it); "
        "the server keeps fp32. An agent measures its next change from the model it received, so the rounding "
        "does not accumulate in the server's model.")

    # ---- when the run starts
    min_workers: int = Field(
        default=1, ge=1, description="Hand out no work until this many workers have registered (Flower's "
                                     "min_available_clients, torchrun's --nnodes): slow starters are not left out "
                                     "of a run that fast ones finish first. hermes-testbed sets its --clients.")
    min_workers_timeout_seconds: float = Field(
        default=60.0, gt=0.0, description="Seconds to wait for min_workers; then the run starts with the workers "
                                          "it has, and a warning says so.")

    # ---- evaluation and stop
    eval_interval_seconds: float = Field(default=1.0, gt=0.0, description="Seconds between server evaluations.")
    # The same stop as POST /v1/stop.
    target_accuracy: float | None = Field(
        default=None, description="Stop once an evaluation reaches this test accuracy in (0, 1]; unset trains until stopped.")
    target: str | None = Field(
        default=None, description="Stop once an evaluation reaches METRIC=VALUE, e.g. r2=0.8 (the task says whether "
                                  "higher or lower is better); target_accuracy=V is accuracy=V.")
    max_epochs: float | None = Field(default=None, gt=0.0, description="Stop after this many passes over the "
                                     "training shards (fractions allowed).")
    max_updates: int | None = Field(default=None, gt=0, description="Stop after this many model updates (server steps).")
    max_seconds: float | None = Field(default=None, gt=0.0, description="Stop this many seconds after the server started "
                                      "the run.")
    eval_max_samples: int = Field(default=2000, gt=0, description="Held-out test samples per evaluation.")
    stats_interval_seconds: float = Field(default=2.0, gt=0.0, description="Seconds between status log lines.")

    # ---- the wire (docs/protocol.md)
    combine_messages: bool = Field(
        default=True, description="Parameter-server agents send what a cycle must say in as few requests as "
        "possible: the push asks for the newer model in its reply (no PULL_MODEL) and the work request gets its "
        "shards in its reply (no FETCH_SHARD); the stats and gate-skipped cycles ride on the next push or work "
        "request (no REPORT_STATS), and no heartbeat goes out in an interval whose data-plane request was "
        "answered. false: one request per purpose, as before.")
    assignments_per_request: int = Field(
        default=1, ge=1, le=16, description="Assignments an agent asks for in one work request (with their shards, "
        "under combine_messages): the work requests of k cycles in one. Each is sized when handed out, so a "
        "workload change (Hermes' dual search, straggler resizing) reaches the agent up to k cycles later; 1 "
        "sizes every cycle on request, as the papers do.")
    overlap_push: bool = Field(
        default=False, description="Under an asynchronous sync policy, a parameter-server agent pushes cycle k's "
        "change (and receives the newer model) in the background and trains on; at the end of the first cycle "
        "with the reply in it rebases: its model becomes the server's plus what it learned since the push "
        "(DaSGD's delayed averaging). One push in flight at a time; the exchange hides behind training, and "
        "updates are staler by the cycles it takes. Needs combine_messages.")
    # issue 31 (lte): while the gate holds, an agent trained on a model ever more versions old, so its next push
    # was folded stale against a global model that had moved on without it (docs/compression.md, "algorithm pass").
    overlap_pull: bool = Field(
        default=False, description="With overlap_push: a cycle the gate holds (no push in flight) asks for the "
        "newer model in the background, and the first cycle that ends with it in rebases on it, keeping every "
        "change not yet pushed (the model becomes the server's plus the change since the last base: DaSGD's "
        "delayed averaging applied to a pull), so the next push is folded less stale.")

    @model_validator(mode="before")
    @classmethod
    def _nested(cls, data: Any) -> Any:
        # Flat aliases and dotted keys -> sections; unknown keys refused with the closest known one.
        return normalise(data, SECTIONS) if isinstance(data, dict) else data

    @field_validator("sync")
    @classmethod
    def _known_sync(cls, v: str) -> str:
        try:
            return policies.canonical("sync", v)
        except UnknownPolicy:
            raise ValueError(f"unknown sync strategy {v!r}; known: {sorted(policies.names('sync'))}") from None

    @field_validator("topology", "gate", "aggregation", "lr_scaling", "allocation")
    @classmethod
    def _known_policy(cls, v: str, info: ValidationInfo) -> str:
        # UnknownPolicy is a ValueError whose one line lists the known names and aliases.
        assert info.field_name is not None
        return policies.canonical(info.field_name, v)

    @field_validator("compression")
    @classmethod
    def _known_codecs(cls, v: CompressionParams) -> CompressionParams:
        # Stored under their registered names, as the policy names are.
        return v.model_copy(update={"push": policies.canonical("compression", v.push),
                                    "pull": policies.canonical("compression", v.pull)})

    @field_validator("target_accuracy")
    @classmethod
    def _target_in_range(cls, v: float | None) -> float | None:
        # Checked here rather than with Field(gt=, le=) so the message says what
        # the number is: a fraction of the test set, not a percentage.
        if v is not None and not (math.isfinite(v) and 0.0 < v <= 1.0):
            raise ValueError(f"target_accuracy={v}: must be a test accuracy in (0, 1], e.g. 0.9 (not 90)")
        return v

    @field_validator("target")
    @classmethod
    def _target_form(cls, v: str | None) -> str | None:
        if v is None:
            return v
        metric, value = parse_target(v)
        return f"{metric}={value:g}"

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
            chosen = self.policy_name(kind)
            for name in policies.names(kind):
                for field in policies.get(kind, name).exclusive_params:
                    if name != chosen and self.get(field) is not None:
                        raise ValueError(f"{field} applies to {kind} {name!r} only, not {chosen!r}")
        if self.target is not None and self.target_accuracy is not None:
            raise ValueError(f"target ({self.target}) and target_accuracy ({self.target_accuracy}) both set: "
                             "give one (target_accuracy=V is target=accuracy=V)")
        # Each policy declares what it needs (policies.base); this checks every declaration.
        policies.check_compatible(self.chosen_policies(), self.core, self.sections())
        if self.overlap_push:
            self._check_overlap()
        elif self.overlap_pull:
            raise ValueError("overlap_pull rebases like overlap_push's reply: it needs overlap_push")
        if self.concurrency.limit:
            self._check_concurrency()
        check_choice(self.compression, topology=self.topology)
        self._check_pull_dtype()
        if self.dataset in ("mnist", "cifar10") and not self.dataset_root:
            raise ValueError(f"dataset {self.dataset!r} is read from local files: set dataset_root")
        return self

    def _check_overlap(self) -> None:
        if "asynchronous" not in policies.get("sync", self.sync).provides:
            allowed = policies.quoted_names(policies.providers("asynchronous", "sync"))
            raise ValueError(f"overlap_push trains the next cycle before the push's reply is in: it needs an "
                             f"asynchronous sync ({allowed}), "
                             f"not {self.sync!r}, whose next cycle starts from the barrier's model")
        if not self.combine_messages:
            raise ValueError("overlap_push needs combine_messages: the push's reply must bring the model")

    def _check_concurrency(self) -> None:
        provides = policies.get("sync", self.sync).provides
        if not provides & {"free_running", "buffered"}:
            allowed = policies.quoted_names(policies.providers("free_running", "sync")
                                            + policies.providers("buffered", "sync"))
            raise ValueError(f"concurrency.limit keeps workers beyond the limit idle: it needs a sync that never "
                             f"waits for a member ({allowed}), not {self.sync!r}, which would wait for the idle ones")

    def _check_pull_dtype(self) -> None:
        # pull_dtype is the old spelling of compression.pull fp16/bf16 (see pull_codec).
        if self.pull_dtype == "float32":
            return
        log.warning("pull_dtype=%s is deprecated: it means compression.pull=%s", self.pull_dtype,
                    _PULL_DTYPE_CODECS[self.pull_dtype])
        if self.compression.pull not in ("none", _PULL_DTYPE_CODECS[self.pull_dtype]):
            raise ValueError(f"pull_dtype={self.pull_dtype} (the old spelling of compression.pull="
                             f"{_PULL_DTYPE_CODECS[self.pull_dtype]}) and compression.pull={self.compression.pull} "
                             "disagree: give compression.pull only")

    @property
    def pull_codec(self) -> str:
        """The codec of the model agents receive: compression.pull, or what the deprecated pull_dtype means."""
        if self.compression.pull == "none" and self.pull_dtype != "float32":
            return _PULL_DTYPE_CODECS[self.pull_dtype]
        return self.compression.pull

    @property
    def barrier_sync(self) -> bool:
        """The sync policy aggregates one step's updates together (BSP, EBSP)."""
        return "barrier" in policies.get("sync", self.sync).provides

    @property
    def core(self) -> policies.Core:
        """The run-wide values a policy is built from besides its own sections."""
        return policies.Core(lr=self.lr, batch_size=self.batch_size, cycle_samples=self.cycle_samples,
                             shard_size=self.shard_size, seed=self.seed, sync=self.sync, barrier=self.barrier_sync)

    def policy_name(self, kind: str) -> str:
        """The name of the policy this run chose for ``kind`` (canonical: validation stored it so)."""
        return str(getattr(self, kind))

    def policy(self, kind: str) -> type[policies.Policy]:
        """The class of the policy this run chose for ``kind``."""
        return policies.get(kind, self.policy_name(kind))

    def chosen_policies(self) -> dict[str, type[policies.Policy]]:
        """The run's policy class of every kind."""
        return {kind: self.policy(kind) for kind in policies.KINDS}

    def sections(self) -> dict[str, BaseModel]:
        """Every parameter section, by name (what ``policies.build`` hands each policy the ones it declares of)."""
        return {name: getattr(self, name) for name, model in SECTIONS.items() if model is not None}

    def section_args(self, cls: type[policies.Policy]) -> dict[str, Any]:
        """The sections ``cls`` declares, by name: the keyword arguments of its classmethods."""
        return {name: getattr(self, name) for name in cls.sections}

    def build_policy(self, kind: str, name: str | None = None, **context: Any) -> Any:
        """The run's policy of ``kind`` (or policy ``name`` of it), built from the core and its own sections."""
        return policies.build(kind, name or self.policy_name(kind), self.core, self.sections(), **context)

    def pushes_from_baseline(self) -> bool:
        """Whether this run's agents push w - w0 (the aggregation rule decides, from its own section)."""
        rule = self.policy("aggregation")
        return rule.pushes_from_baseline(**self.section_args(rule))

    def proximal_rho(self) -> float:
        """rho of the agent's proximal term rho/2 ||x - x_tau||^2 (0: none); the aggregation rule declares it."""
        rule = self.policy("aggregation")
        return rule.proximal_rho(**self.section_args(rule))

    def get(self, key: str) -> Any:
        """The value at a dotted key (``"zscore.alpha"``) or a top-level one."""
        obj: Any = self
        for part in key.split("."):
            obj = getattr(obj, part)
        return obj


# Top-level field -> its section model, or None for a plain field.
SECTIONS: dict[str, type[BaseModel] | None] = {
    name: (f.annotation if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel) else None)
    for name, f in RunConfig.model_fields.items()
}


def build_config(preset: str | None = None, **overrides: Any) -> RunConfig:
    """Preset defaults, then overrides; ConfigError names every bad field."""
    name = preset or overrides.pop("preset", None) or DEFAULT_PRESET
    if name not in PRESETS:
        raise ConfigError(f"preset: {unknown_preset(name)}")
    problems: list[str] = []
    spelled: dict[str, str] = {}
    # Normalised here (not only in RunConfig) so that an override's section merges with the preset's
    # leaf by leaf, every unknown key is reported with the others, and messages use the caller's spelling.
    values = normalise({**PRESETS[name], **{k: v for k, v in overrides.items() if v is not None}, "preset": name},
                       SECTIONS, problems=problems, spelled=spelled)
    try:
        cfg = RunConfig(**values)
    except ValidationError as exc:
        for e in exc.errors():
            dotted = ".".join(str(p) for p in e["loc"])
            problems.append(f"{spelled.get(dotted, dotted) or 'config'}: {e['msg']}")
    if problems:
        raise ConfigError("; ".join(problems))
    return cfg


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
