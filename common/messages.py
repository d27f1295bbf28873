"""Typed message bodies: the one definition of what server and agent say to each other.

Data plane: the msgpack ``body`` of each request type and of the replies
that carry fields (WORK, SHARD); the control plane's bodies (register,
rendezvous) are in ``control_messages``. Requests are checked once, at the
receiving boundary, with ``parse_body``; a refusal is a
``ProtocolError(BAD_REQUEST)`` whose one-line message names the field.

Numbers are strict: a bool is not a count, a string is not a number, and a
non-finite float is refused everywhere (a NaN folded into the model or a
measurement poisons every later decision). Request bodies ignore fields they
do not know, as the hand validators did, so agents of a newer minor version
still talk to this server; the bodies the server builds forbid them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    ValidationError,
    model_validator,
)

from hermes.common.policies.compression import CodecSpec
from hermes.common.wire import ErrorCode, ProtocolError

log = logging.getLogger(__name__)

# The most shard records one FETCH_SHARD may ask for (one reply; the agent sends up to this many).
MAX_SHARDS_PER_FETCH = 256
# The most gate-skipped cycle records one PUSH_UPDATE or REQUEST_WORK may carry
# (combine_messages); an agent with more pending sends the newest ones.
MAX_CYCLES_PER_MESSAGE = 64
# A cycle's decision when it ended with the agent's push still in flight (overlap_push): not gated, not pushed.
IN_FLIGHT = "in-flight"
# A cycle whose local loss was not finite: dropped by the agent, which took the global model again.
# A cycle the agent dropped because its loss was not finite (client/topology.py): no gate decided it.
# (The gate's own "diverged" resync is a decision, counted as a skip.)
LOSS_NOT_FINITE = "loss_not_finite"
# The most assignments one REQUEST_WORK may ask for.
MAX_ASSIGNMENTS_PER_REQUEST = 16


def gate_outcome(decision: str, pushed: bool) -> str | None:
    """How a cycle counts in the gate's push/skip tallies: None where no gate decided ("always", in flight).

    The registry, the metrics and the TensorBoard writer all count with this one rule.
    """
    if decision in ("always", IN_FLIGHT, LOSS_NOT_FINITE):
        return None
    return "push" if pushed else "skip"


def batch_size_of(record: Mapping[str, Any]) -> Any:
    """A worker or cycle record's batch size: ``batch_size``, or ``mbs`` in files written before issue 26."""
    return record["batch_size"] if "batch_size" in record else record.get("mbs")


def _number(v: Any) -> Any:
    # A bool is an int to Python and a numeric string is a float to pydantic's lax mode: neither is a measurement.
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError("must be a number")
    return v


def _positive_number(v: Any) -> int | float:
    """An int stays an int (a batch size), a float a float; both finite and > 0."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError("must be a finite number > 0")
    return v


Count = Annotated[StrictInt, Field(ge=0)]
Positive = Annotated[StrictInt, Field(ge=1)]
Finite = Annotated[float, BeforeValidator(_number), Field(allow_inf_nan=False)]
Seconds = Annotated[float, BeforeValidator(_number), Field(ge=0, allow_inf_nan=False)]
PositiveNumber = Annotated[int | float, PlainValidator(_positive_number)]


def _short_text(v: Any) -> str | None:
    """A label the server only displays: kept to 16 characters; anything but a string is ignored."""
    return v[:16] if isinstance(v, str) else None


Label = Annotated[str | None, BeforeValidator(_short_text)]

_REQUEST = ConfigDict(frozen=True, extra="ignore")
_BUILT = ConfigDict(frozen=True, extra="forbid")

M = TypeVar("M", bound=BaseModel)


def describe(exc: ValidationError) -> str:
    """One line naming the first bad field, what it must be and what came."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = ".".join(str(p) for p in first["loc"])
    got = repr(first.get("input"))
    if len(got) > 60:
        got = got[:57] + "..."
    text = f"body field {loc!r}: {first['msg']}" if loc else f"body: {first['msg']}"
    if loc and first["type"] != "missing":  # a missing field's "input" is the whole body
        text += f", got {got}"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more)"
    return text


def parse_body(model: type[M], body: Mapping[str, Any]) -> M:
    """The boundary check: a body, or ProtocolError(BAD_REQUEST) naming the bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.BAD_REQUEST, describe(exc)) from None


def parse_reply(model: type[M], body: Any, what: str) -> M:
    """The agent's boundary check of a server's reply (``what`` names it in the error).

    Fields the model does not know are ignored, so an agent still talks to a
    newer server; a reply that lacks a field or carries a wrong type is a
    ProtocolError(MALFORMED) whose one line names the reply and the field.
    """
    if not isinstance(body, Mapping):
        raise ProtocolError(ErrorCode.MALFORMED, f"server's {what} reply is not an object: {body!r:.60}")
    try:
        return model.model_validate(body, extra="ignore")
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.MALFORMED, f"server's {what} reply: {describe(exc)}") from None


def request_body(message: BaseModel) -> dict[str, Any]:
    """A typed request as the wire carries it: aliases as the receiver reads them, unset optionals left out."""
    return message.model_dump(by_alias=True, exclude_none=True)


# ---- data plane: requests ---------------------------------------------------------------


class FederatedReport(BaseModel):
    """One device's score of the global model on its own held-out data (a federated evaluation round)."""

    model_config = _REQUEST

    round: Positive
    version: Annotated[StrictInt, Field(ge=0)]
    samples: Positive
    loss: Finite
    metrics: Annotated[dict[Annotated[str, Field(max_length=64)], Finite], Field(max_length=32)] = {}


class CycleReport(BaseModel):
    """One local training cycle, attached to a push or a stats report."""

    model_config = _REQUEST

    dss: Positive
    # The mini-batch size this cycle trained with (the WORK reply's batch_size). Agents before
    # the one-name rename sent it as ``mbs``: still accepted on input.
    batch_size: Positive = Field(validation_alias=AliasChoices("batch_size", "mbs"))
    compute_seconds: Seconds = 0.0
    # Older agents do not send it: they never accumulate.
    accumulation: Positive = 1
    val_loss: Finite | None = None
    z: Finite | None = None
    alpha: Finite | None = None
    pushed: StrictBool = True
    # The gate's reason ("always" without a gate).
    decision: Annotated[str, Field(max_length=32, strict=True)] = "always"
    # The answer to a federated evaluation request (WorkReply.federated_round), scored before this cycle trained.
    federated: FederatedReport | None = None
    # The WORK reply's ``assignment`` this cycle trained (issue 29): the server times the claim against
    # the wall time since it handed that out. Agents before the field leave it out (no elapsed-time floor).
    assignment: Count | None = None

    def fields(self) -> dict[str, Any]:
        """The report as the registry and the event log keep it (``batch_size`` since issue 26, ``mbs`` before)."""
        return self.model_dump()


ShardSource = Literal["kafka", "zmq"]
# The precisions an agent may time (precision=auto) and train in.
PrecisionName = Literal["fp32", "bf16", "fp16"]


class ReportStats(BaseModel):
    """REPORT_STATS: the agent's running totals, and optionally a cycle and a memory profile."""

    model_config = _REQUEST

    samples: Count
    bytes_sent: Count
    bytes_received: Count
    compute_seconds: Seconds = 0.0
    wait_seconds: Seconds = 0.0
    prefetch_wait_seconds: Seconds = 0.0
    # Topology collective: the all-reduce traffic the agent sent.
    collective_bytes: Count | None = None
    # The shard-fetch part (optional: older agents do not send it).
    prefetch_wait_steady_seconds: Seconds | None = None
    shard_bytes: Annotated[dict[ShardSource, Count], Field(strict=True)] | None = None
    shard_records: Annotated[dict[ShardSource, Count], Field(strict=True)] | None = None
    corrupt_records: Count | None = None
    shard_refetches: Count | None = None
    kafka_fallbacks: Count | None = None
    kafka_reconnects: Count | None = None
    kafka_discarded_bytes: Count | None = None
    kafka_data_missing: Count | None = None
    data_source: Label = None
    # Absent means "" (the worker reports none); anything but a string is ignored.
    precision: Label = ""
    # How the agent chose it (precision=auto): milliseconds per step of each precision it timed.
    precision_timings_ms: Annotated[
        dict[PrecisionName, Annotated[float, Field(ge=0, allow_inf_nan=False)]], Field(max_length=3)
    ] | None = None
    final: bool = False
    # OmniLearn Eq. 9's measurements: [batch, bytes] pairs.
    memory_profile: Annotated[
        list[Annotated[list[PositiveNumber], Field(min_length=2, max_length=2, strict=True)]],
        Field(min_length=2, max_length=16, strict=True),
    ] | None = None
    cycle: CycleReport | None = None

    def counters(self) -> dict[str, Any]:
        """The running totals, as the worker record keeps them."""
        return {
            "samples": self.samples, "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
            "compute_seconds": self.compute_seconds, "wait_seconds": self.wait_seconds,
            "prefetch_wait_seconds": self.prefetch_wait_seconds,
        }

    def shard_counters(self) -> dict[str, int]:
        """The shard-fetch counters this report carries (only those sent)."""
        names = ("corrupt_records", "shard_refetches", "kafka_fallbacks", "kafka_reconnects",
                 "kafka_discarded_bytes", "kafka_data_missing")
        return {k: v for k in names if (v := getattr(self, k)) is not None}


class PushUpdate(BaseModel):
    """PUSH_UPDATE: a model delta (payload) trained from ``header.model_version``."""

    model_config = _REQUEST

    # >= 1: with aggregation "samples" a group whose counts sum to 0 has no
    # weights, which left BSP peers held forever.
    samples: Positive
    loss: Finite | None = None
    steps: Count | None = None
    compute_seconds: Seconds | None = None
    # Collective rank 0: the change since its last copy of the model, for the server to evaluate.
    copy_: StrictBool = Field(default=False, alias="copy")
    cycle: CycleReport | None = None
    # combine_messages (docs/protocol.md): the reply carries the model when it is newer than
    # header.model_version (the PULL_MODEL that would follow), the gate-skipped cycles since
    # the agent's last message come along (each a REPORT_STATS before), and so may its stats.
    pull: StrictBool = False
    # The dtype the model comes back in (run config pull_dtype).
    pull_dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    cycles: Annotated[list[CycleReport], Field(max_length=MAX_CYCLES_PER_MESSAGE)] | None = None
    stats: ReportStats | None = None
    # From-baseline presets (update_from_baseline): the version of the model the payload G is
    # measured from, the agent's base pull (docs/churn.md); None: w0, the run's first model.
    base_version: Count | None = None
    # compression.push: the payload is this codec's bytes (common/policies/compression.py), not the delta.
    codec: CodecSpec | None = None
    # compression.pull int8: the model comes back in this codec (fp16/bf16 are pull_dtype).
    pull_codec: CodecSpec | None = None


class PullModel(BaseModel):
    """PULL_MODEL: the current model, or ``unchanged`` when ``if_newer`` and the agent has it."""

    model_config = _REQUEST

    if_newer: bool = False
    # Checked by the server against what it serves (BAD_DTYPE, not BAD_REQUEST).
    dtype: Any = "float32"
    # The pull that starts a registration of a from-baseline agent: the server keeps the model
    # it serves as this worker's base until the worker leaves (docs/churn.md).
    base: StrictBool = False
    # compression.pull int8: the model in this codec instead of ``dtype``.
    codec: CodecSpec | None = None


class RequestWork(BaseModel):
    """REQUEST_WORK: the next assignment; with combine_messages its shards come in the reply and
    the agent's pending cycles and stats come with the request."""

    model_config = _REQUEST

    # The WORK reply carries the train shard records (as a multi-shard SHARD reply does) when
    # they are served over the data plane: no FETCH_SHARD follows.
    inline_shards: StrictBool = False
    # How many assignments to hand out at once (assignments_per_request): the WORK reply's ``then``.
    assignments: Annotated[StrictInt, Field(ge=1, le=MAX_ASSIGNMENTS_PER_REQUEST)] = 1
    cycles: Annotated[list[CycleReport], Field(max_length=MAX_CYCLES_PER_MESSAGE)] | None = None
    stats: ReportStats | None = None


Split = Literal["train", "validation"]


class FetchShard(BaseModel):
    """FETCH_SHARD: one shard record (``shard``) or several back to back (``shards``)."""

    model_config = _REQUEST

    shard: Count | None = None
    shards: Annotated[list[Count], Field(min_length=1, max_length=MAX_SHARDS_PER_FETCH, strict=True)] | None = None
    split: Split = "train"

    @model_validator(mode="after")
    def _one_of(self) -> FetchShard:
        if self.shard is None and self.shards is None:
            raise ValueError("body field 'shard' (an int >= 0) or 'shards' (a list of ints) is required")
        return self

    def ids(self) -> list[int]:
        return list(self.shards) if self.shards is not None else [self.shard or 0]


# ---- data plane: replies ----------------------------------------------------------------
#
# The server builds these (extra fields forbidden); the agent parses them with ``parse_reply``
# (extra fields ignored). Every data-plane reply also says whether the run is stopping:
# the server's reply helper adds ``stop`` to whatever body it sends.


class Reply(BaseModel):
    """What every data-plane reply carries: ``stop``, the run is stopping."""

    model_config = _BUILT

    stop: StrictBool = False


class KafkaRanges(BaseModel):
    """Where a reader finds shard records: ``{"source": "zmq"}``, the Kafka topic and ranges, or
    ``{"source": "local"}``: nowhere, the agent trains on its own data (``task.local_data``)."""

    model_config = _BUILT

    source: Literal["kafka", "zmq", "local"] = "zmq"
    bootstrap: str | None = None
    topic: str | None = None
    partitions: int | None = None
    ranges: Any = None
    max_record_bytes: int | None = None


class WorkReply(Reply):
    """WORK: the assignment for the agent's next cycle (plus where its shards are read from)."""

    epoch: int
    shards: list[int]
    batch_size: int
    cycle_samples: int
    # Micro-batches per optimizer step (Chao et al.); servers that never accumulate may leave it out.
    accumulation: int = 1
    lr: float
    data: KafkaRanges = KafkaRanges()
    # Device-local data (source "local"): draw this many samples from the local set; shards is [].
    local_samples: int | None = None
    # inline_shards: the payload is the records of this assignment's shards and then of those
    # in ``then``, back to back, cut by these lengths.
    lengths: list[int] | None = None
    # REQUEST_WORK ``assignments`` > 1: the assignments after this one, in the order to train them.
    then: list[WorkReply] | None = None
    # Score the pulled global model on the device's held-out data before this cycle (federated_eval).
    federated_round: int | None = None
    # The assignment's id, for the cycle report to name (CycleReport.assignment); servers before it send none.
    assignment: int | None = None

    def body(self) -> dict[str, Any]:
        """The wire body: the data-source fields sit beside the assignment's, as agents read them."""
        out = self.model_dump(exclude={"data", "then", "stop"}, exclude_none=True)
        out.update(self.data.model_dump(exclude_none=True))
        if self.then:
            out["then"] = [w.body() for w in self.then]
        return out

    @classmethod
    def from_body(cls, body: Any) -> WorkReply:
        """The agent's side of ``body()``: the wire body parsed back (``parse_reply``'s rules)."""
        return parse_reply(cls, _nest_data(body), "WORK")


def _nest_data(body: Any) -> Any:
    """A WORK wire body with its data-source fields gathered under ``data`` again (``then`` too)."""
    if not isinstance(body, Mapping):
        return body
    data = {k: body[k] for k in KafkaRanges.model_fields if k in body}
    out = {k: v for k, v in body.items() if k not in data}
    out["data"] = data
    if isinstance(out.get("then"), list):
        out["then"] = [_nest_data(b) for b in out["then"]]
    return out


class ShardReply(Reply):
    """SHARD: one record (``shard``) or several back to back, cut by ``lengths``."""

    shard: int | None = None
    shards: list[int] | None = None
    lengths: list[int] | None = None

    def body(self) -> dict[str, Any]:
        return self.model_dump(exclude={"stop"}, exclude_none=True)


class PushReply(Reply):
    """PUSH_REPLY: what became of the update, and (combine_messages) whether the model came along."""

    # "applied"; anything else counts as refused ("rejected", "abandoned" at a stop, ...).
    status: str
    reason: str | None = None
    # Asked with ``pull``: "included" (the payload is the newer model) or "unchanged".
    model: Literal["included", "unchanged"] | None = None
    # The push's base_version is not a base the server keeps for this worker: pull a new base.
    rebase: StrictBool = False
    # The included model's codec (compression.pull int8); None: the payload is the model in the pull dtype.
    codec: CodecSpec | None = None


class ErrorReply(BaseModel):
    """ERROR: a refused request (``header.error_reply`` builds it); unsigned, so read leniently."""

    model_config = _BUILT

    code: str = ErrorCode.INTERNAL.value
    message: str = ""


class ModelReply(Reply):
    """MODEL: the current model (the payload), or ``unchanged`` when the agent has it."""

    unchanged: StrictBool = False
    codec: CodecSpec | None = None
