"""Typed control-plane bodies: registration, heartbeat and the collective's rendezvous.

FastAPI validates the requests on the server; the agent parses the replies
with ``messages.parse_reply`` (unknown fields ignored, a malformed reply one
line naming the field). The data plane's bodies are in ``messages``; the same
rules hold here: a request names only known fields, and numbers are bounded
and finite.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from hermes.common.messages import KafkaRanges
from hermes.common.wire import PROTOCOL_VERSION

# The server's worker ids (server/registry.py): w and at least four digits.
_WORKER_ID = re.compile(r"w[0-9]{4,}")


class Hints(BaseModel):
    """What an agent says about its device at registration: typed and bounded.

    Unknown keys are dropped rather than refused, so a newer agent still
    registers with an older server; nothing else a client sends is kept.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    torch: str | None = Field(default=None, max_length=64)
    memory_available_bytes: int | None = Field(default=None, ge=0)
    # Declared capacity for the static allocation (OmniLearn Eq. 4a's c_k): FLOPs, else cores.
    flops: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    cores: float | None = Field(default=None, gt=0, le=65_536, allow_inf_nan=False)
    # What the agent may use here (affinity and cgroup quota), reported, not allocated by.
    usable_cores: int | None = Field(default=None, ge=1, le=65_536)
    affinity_cores: int | None = Field(default=None, ge=1, le=65_536)
    cpu_quota: float | None = Field(default=None, gt=0, le=65_536, allow_inf_nan=False)
    # Random per agent process: the same name from another live process is a second agent
    # (refused), from the same one a re-registration (server/engine/membership.py).
    instance: str | None = Field(default=None, min_length=8, max_length=64, pattern=r"^[0-9a-f]+$")

    def known(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class RegisterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@-]+$")
    threads: int = Field(default=1, ge=1, le=1024)
    # The agent's own secret for its name (kept in its state directory): the first key a name is
    # registered with owns it, and only that key takes it back (server/registry.py).
    name_key: str | None = Field(default=None, min_length=16, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")
    device: str = Field(default="cpu", max_length=32)
    slowdown: float = Field(default=1.0, ge=1.0, le=1000.0)
    hints: Hints = Field(default_factory=Hints)
    # Strict: ``false`` is not version 0.
    protocol_version: StrictInt = PROTOCOL_VERSION
    # The agent's task (its name and hermes.common.task.fingerprint of its model): a server
    # training another task refuses it (409) before creating any state. None: not stated
    # (tools that speak the protocol without training, load tests); the data plane still
    # checks every update's shapes.
    task: str | None = Field(default=None, min_length=1, max_length=200)
    task_fingerprint: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")
    # Device-local data: how many samples the agent's local set holds (None: it trains on the server's shards).
    local_samples: int | None = Field(default=None, ge=1)

    @field_validator("name")
    @classmethod
    def _not_a_path_or_an_id(cls, name: str) -> str:
        # Names end up in log lines, file names and next to ids in every listing.
        if name in (".", "..") or name.startswith(("-", ".")):
            raise ValueError(f"worker name {name!r} looks like a path or an option; start it with a letter or digit")
        if _WORKER_ID.fullmatch(name):
            raise ValueError(f"worker name {name!r} looks like a worker id (w0001...); choose another name")
        return name


class CollectiveRendezvous(BaseModel):
    """Where and as whom a worker joins the collective group (torchrun's RANK, WORLD_SIZE, MASTER_*)."""

    model_config = ConfigDict(frozen=True)

    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    master_addr: str
    master_port: int = Field(ge=1, le=65535)
    timeout_seconds: float = Field(gt=0.0)
    # Regrouping: the group's generation and the store prefix its rendezvous keys live under.
    generation: int = Field(default=0, ge=0)
    store_prefix: str = ""

    @model_validator(mode="after")
    def _rank_in_group(self) -> CollectiveRendezvous:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} not in 0..{self.world_size - 1}")
        return self


class RegroupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The generation whose collective failed on this worker.
    generation: int = Field(ge=0)


class RegisterResponse(BaseModel):
    worker_id: str
    token: str
    rejoined: bool
    protocol_version: int
    data_plane: str
    model_spec: dict[str, Any]
    run_config: dict[str, Any]
    # Fixed local validation split for this worker's update gate (shard ids, split "validation").
    validation_shards: list[int]
    # Where shard records come from: {"source": "zmq"} or the Kafka topics and
    # this worker's validation ranges ({"source": "kafka", "bootstrap", ...}).
    data_source: dict[str, Any] = Field(default_factory=lambda: {"source": "zmq"})
    # Topology "collective": rank, world_size, master_addr, master_port, timeout_seconds, generation, store_prefix.
    collective: CollectiveRendezvous | None = None
    # Signed data-plane messages carry server-clock timestamps: the agent's offset.
    server_time_ms: int
    heartbeat_interval_seconds: float
    max_message_bytes: int

    def source(self) -> KafkaRanges:
        """``data_source`` typed: where this worker's validation shards are read from.

        The reply keeps the compact dict (only the fields that apply), as the
        server's ``KafkaRanges.model_dump(exclude_none=True)`` wrote it.
        """
        return KafkaRanges.model_validate(self.data_source, extra="ignore")


class HeartbeatReply(BaseModel):
    """POST /v1/workers/{id}/heartbeat: the worker's state as the server sees it.

    Every field is optional: a heartbeat's answer matters only as proof that the
    server heard us, whatever else it says.
    """

    model_config = ConfigDict(frozen=True)

    state: str | None = None
    model_version: int | None = None
    stop: bool = False
    # Topology collective: the generation the server knows broke while this worker is in it.
    collective_broken: int | None = None


class HTTPErrorBody(BaseModel):
    """A refused control-plane call's body: FastAPI's ``{"detail": "..."}``."""

    detail: str
