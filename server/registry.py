"""Registered workers: identity, credentials and the measurements they report."""

from __future__ import annotations

import hashlib
import hmac
import threading
from dataclasses import dataclass, field
from typing import Any

from hermes.common.clock import SYSTEM_CLOCK, Clock
from hermes.common.messages import IN_FLIGHT, gate_outcome
from hermes.common.wire import ErrorCode, ProtocolError
from hermes.server.auth import new_secret

CYCLE_LOG = 5000


class RegistryFull(Exception):
    """max_workers reached."""


class NameOwned(Exception):
    """The name belongs to the key that registered it first; this registration has another key or none (409)."""

    def __init__(self, name: str, given: bool) -> None:
        super().__init__(f"worker name {name!r} belongs to the agent that registered it first and this registration "
                         f"{'proves another key' if given else 'proves no key'}; give this agent its own --name "
                         "(an agent that lost its state directory needs a new name too)")


class JoinCapReached(Exception):
    """The join credential already registered its cap of names (429)."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"this join token already registered {cap} worker names (join_token_max_workers); "
                         "give further sites their own join token or raise the cap")


def key_digest(name_key: str) -> str:
    """What the server keeps of an agent's name key: its SHA-256, never the key."""
    return hashlib.sha256(name_key.encode()).hexdigest()


class NameInUse(Exception):
    """Another live agent process is registered under this name (409; the agent explains and exits)."""

    def __init__(self, name: str, silent: float, retry_after: float) -> None:
        super().__init__(f"worker name {name!r} is in use by another live agent (heard from {silent:.1f}s ago); "
                         "give each agent its own --name")
        self.retry_after = retry_after


# Counted by the server itself (data plane, per reported cycle): a checkpoint keeps them.
SERVER_COUNTERS = ("pushes", "applied", "rejected", "pulls", "messages", "server_bytes_in", "server_bytes_out",
                   "cycles", "gate_pushes", "gate_skips", "in_flight_cycles")


@dataclass
class WorkerRecord:
    id: str
    name: str
    token: str
    joined_at: float
    threads: int = 1
    device: str = "cpu"
    slowdown: float = 1.0
    hints: dict[str, Any] = field(default_factory=dict)
    state: str = "active"  # active | left | lost (silent past the heartbeat timeout)
    last_seen: float = 0.0
    pushes: int = 0
    applied: int = 0
    rejected: int = 0
    # Refused by update screening too often in a row: its pushes are refused unread.
    quarantined: bool = False
    # SHA-256 of the name key that registered this name first (None: registered without one).
    name_key_hash: str | None = None
    # Which join credential registered it (its index among the server's join tokens).
    join_slot: int = 0
    pulls: int = 0
    messages: int = 0
    # As the agent reports them (cumulative since it joined).
    samples: int = 0
    compute_seconds: float = 0.0
    wait_seconds: float = 0.0
    prefetch_wait_seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    precision: str = ""
    precision_timings_ms: dict[str, float] = field(default_factory=dict)
    # Shard fetching, as the agent reports it: where records came from
    # ("kafka", "zmq", "kafka+zmq"), bytes and records by source, trouble.
    prefetch_wait_steady_seconds: float = 0.0
    data_source: str = ""
    shard_bytes: dict[str, int] = field(default_factory=dict)
    shard_records: dict[str, int] = field(default_factory=dict)
    corrupt_records: int = 0
    shard_refetches: int = 0
    kafka_fallbacks: int = 0
    kafka_reconnects: int = 0
    kafka_discarded_bytes: int = 0
    kafka_data_missing: int = 0
    # Device-local data: the size of the worker's local set as it declared it (0: shard-fed).
    local_samples: int = 0
    # As the server counts them on the data plane.
    server_bytes_in: int = 0
    server_bytes_out: int = 0
    # Per local training cycle, as the agent reports them.
    cycles: int = 0
    gate_pushes: int = 0
    gate_skips: int = 0
    # overlap_push: cycles that ended with the worker's push still in flight (the gate was not asked).
    in_flight_cycles: int = 0
    last_cycle_seconds: float = 0.0
    # (elapsed, dss, batch_size, compute seconds, z, pushed): bounded, see CYCLE_LOG.
    cycle_log: list[tuple] = field(default_factory=list)
    # (elapsed, dss, batch_size) whenever the allocator changed this worker's workload.
    workload_history: list[tuple[float, int, int]] = field(default_factory=list)
    accumulation: int = 1
    # Topology collective: all-reduce bytes through this worker (ring estimate, as the agent reports).
    collective_bytes: int = 0
    # Samples handed out beyond the workloads asked for, which the agent
    # carries into its next cycle (see Engine._on_request_work).
    sample_credit: int = 0

    @property
    def declared_capacity(self) -> float | None:
        """Compute capacity the worker declared (FLOPs, else cores): the static policy's c_k."""
        for key in ("flops", "cores"):
            v = self.hints.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return float(v)
        return None

    def throughput(self, window: int = 5) -> float | None:
        """Samples per compute second over the last ``window`` cycles (DP-SGD Eq. 2's CP)."""
        recent = self.cycle_log[-window:]
        seconds = sum(c[3] for c in recent)
        return sum(c[1] for c in recent) / seconds if recent and seconds > 0 else None

    def record_cycle(self, elapsed: float, cycle: dict[str, Any]) -> None:
        self.cycles += 1
        self.last_cycle_seconds = cycle["compute_seconds"]
        if cycle["decision"] == IN_FLIGHT:
            self.in_flight_cycles += 1
        outcome = gate_outcome(cycle["decision"], cycle["pushed"])
        self.gate_pushes += outcome == "push"
        self.gate_skips += outcome == "skip"
        self.cycle_log.append((elapsed, cycle["dss"], cycle["batch_size"], round(cycle["compute_seconds"], 6),
                               None if cycle["z"] is None else round(cycle["z"], 4), cycle["pushed"]))
        if len(self.cycle_log) > CYCLE_LOG:
            del self.cycle_log[: len(self.cycle_log) - CYCLE_LOG]

    @property
    def key(self) -> bytes:
        """The data plane's MAC key: the secret handed out at registration."""
        return self.token.encode()

    @property
    def worker_independence(self) -> float:
        """WI = local iterations / global model requests (Hermes Eq. 7).

        The pull that fetches the initial model at join is not a request for
        progress, so it is not counted: BSP and ASP come out at exactly 1.
        """
        return self.cycles / max(1, self.pulls - 1)

    @property
    def worker_independence_eq7(self) -> float:
        """Hermes Eq. 7 as printed: every global-model request counts, the join pull too."""
        return self.cycles / max(1, self.pulls)

    def public(self) -> dict[str, Any]:
        wall = max(1e-9, self.last_seen - self.joined_at)
        return {
            "id": self.id,
            "name": self.name,
            "state": self.state,
            "threads": self.threads,
            "device": self.device,
            "slowdown": self.slowdown,
            "speed": round(1.0 / self.slowdown, 6),
            "precision": self.precision,
            "precision_timings_ms": self.precision_timings_ms,
            "samples": self.samples,
            "compute_seconds": round(self.compute_seconds, 6),
            "wait_seconds": round(self.wait_seconds, 6),
            "prefetch_wait_seconds": round(self.prefetch_wait_seconds, 6),
            "prefetch_wait_steady_seconds": round(self.prefetch_wait_steady_seconds, 6),
            "data_source": self.data_source,
            "shard_bytes_fetched": sum(self.shard_bytes.values()),
            "shard_bytes": dict(self.shard_bytes),
            "shard_records": dict(self.shard_records),
            "local_samples": self.local_samples,
            "corrupt_records": self.corrupt_records,
            "shard_refetches": self.shard_refetches,
            "kafka_fallbacks": self.kafka_fallbacks,
            "kafka_reconnects": self.kafka_reconnects,
            "kafka_discarded_bytes": self.kafka_discarded_bytes,
            "kafka_data_missing": self.kafka_data_missing,
            "utilization": round(min(1.0, self.compute_seconds / wall), 6) if self.last_seen else 0.0,
            "pushes": self.pushes,
            "applied": self.applied,
            "rejected": self.rejected,
            "quarantined": self.quarantined,
            "pulls": self.pulls,
            "messages": self.messages,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "collective_bytes": self.collective_bytes,
            "cycles": self.cycles,
            "wi": round(self.worker_independence, 4),
            "wi_eq7": round(self.worker_independence_eq7, 4),
            "gate_pushes": self.gate_pushes,
            "gate_skips": self.gate_skips,
            "in_flight_cycles": self.in_flight_cycles,
            "dss": self.workload_history[-1][1] if self.workload_history else None,
            "batch_size": self.workload_history[-1][2] if self.workload_history else None,
            "accumulation": self.accumulation,
            "declared_capacity": self.declared_capacity,
            "throughput": None if (x := self.throughput()) is None else round(x, 3),
            "workload_history": [list(t) for t in self.workload_history],
            "cycle_log_fields": ["elapsed", "dss", "batch_size", "compute_seconds", "z", "pushed"],
            "cycle_log": [list(t) for t in self.cycle_log],
            "server_bytes_in": self.server_bytes_in,
            "server_bytes_out": self.server_bytes_out,
            "joined_at": self.joined_at,
            "last_seen": self.last_seen,
        }


class Registry:
    def __init__(self, max_workers: int, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.max_workers = max_workers
        self._by_id: dict[str, WorkerRecord] = {}
        self._by_name: dict[str, str] = {}
        self._lock = threading.Lock()

    def register(self, name: str, *, takeover_after: float = float("inf"), name_key: str | None = None,
                 join_cap: int = 0, **info: Any) -> tuple[WorkerRecord, bool]:
        """A new record, or the same id with a fresh token when the name rejoins.

        Returns (record, rejoined). The old token stops working at once.

        A name belongs to the key (``name_key``, the agent's own secret) it was
        first registered with: only that key takes it back (NameOwned
        otherwise). A name registered without a key, or restored from a
        checkpoint that kept none, follows the rules below and is claimed by
        the first key that registers it. ``join_cap`` (0: none) bounds the names one
        join credential (``info["join_slot"]``) may register (JoinCapReached).

        A name held by an active worker whose agent process (``hints["instance"]``)
        differs is a second agent, not a rejoin: refused with NameInUse while
        the holder was heard from within ``takeover_after`` seconds, taken over
        after that (its process died without saying goodbye and was restarted).
        """
        digest = None if name_key is None else key_digest(name_key)
        with self._lock:
            now = self.clock.time()
            wid = self._by_name.get(name)
            if wid is not None:
                rec = self._by_id[wid]
                held_by = rec.hints.get("instance")
                instance = (info.get("hints") or {}).get("instance")
                if rec.name_key_hash is not None and (
                        digest is None or not hmac.compare_digest(digest, rec.name_key_hash)):
                    raise NameOwned(name, digest is not None)
                silent = now - rec.last_seen
                if rec.state == "active" and held_by and instance and held_by != instance \
                        and silent < takeover_after:
                    raise NameInUse(name, silent, takeover_after - silent)
                rec.token = new_secret()
                rec.state = "active"
                rec.last_seen = now
                rec.sample_credit = 0  # a restarted agent carries no samples over
                if rec.name_key_hash is None:
                    rec.name_key_hash = digest
                info.pop("join_slot", None)  # a name stays counted against the token that registered it
                for k, v in info.items():
                    setattr(rec, k, v)
                return rec, True
            if len(self._by_id) >= self.max_workers:
                raise RegistryFull(f"max_workers={self.max_workers} reached")
            slot = info.get("join_slot", 0)
            if join_cap and sum(r.join_slot == slot for r in self._by_id.values()) >= join_cap:
                raise JoinCapReached(join_cap)
            wid = f"w{len(self._by_id) + 1:04d}"
            rec = WorkerRecord(id=wid, name=name, token=new_secret(), joined_at=now, last_seen=now,
                               name_key_hash=digest, **info)
            self._by_id[wid] = rec
            self._by_name[name] = wid
            return rec, False

    def lookup(self, worker_id: str) -> WorkerRecord:
        rec = self._by_id.get(worker_id)
        if rec is None:
            raise ProtocolError(ErrorCode.UNKNOWN_WORKER, f"unknown worker id {worker_id!r}")
        return rec

    def authenticate(self, worker_id: str, token: str) -> WorkerRecord:
        """Control-plane calls of a worker (heartbeat, leave): its secret as a header."""
        rec = self.lookup(worker_id)
        if not hmac.compare_digest(rec.token.encode(), token.encode()):
            raise ProtocolError(ErrorCode.UNAUTHORIZED, f"bad token for worker {worker_id!r}")
        return rec

    def identities(self) -> list[dict[str, Any]]:
        """Ids, names and the server's own counts for a checkpoint; never the secrets
        (a restarted server issues new ones). What agents report is cumulative on
        their side and comes back with their next report."""
        return [{"id": r.id, "name": r.name, "joined_at": r.joined_at, "name_key_hash": r.name_key_hash,
                 "join_slot": r.join_slot,
                 "counters": {k: getattr(r, k) for k in SERVER_COUNTERS},
                 "cycle_log": [list(c) for c in r.cycle_log],
                 "workload_history": [list(w) for w in r.workload_history]}
                for r in self._by_id.values()]

    def restore(self, identities: list[dict[str, Any]]) -> None:
        """Known names keep their ids and counts across a restart, as ``lost`` until they register again."""
        with self._lock:
            for ident in identities:
                rec = WorkerRecord(id=str(ident["id"]), name=str(ident["name"]), token=new_secret(),
                                   joined_at=float(ident.get("joined_at", 0.0)), state="lost",
                                   # A name keeps its owner across a restart (older checkpoints kept none).
                                   name_key_hash=ident.get("name_key_hash") or None,
                                   join_slot=int(ident.get("join_slot") or 0))
                # Checkpoints of older servers hold ids and names only.
                for key, value in (ident.get("counters") or {}).items():
                    if key in SERVER_COUNTERS:
                        setattr(rec, key, int(value))
                rec.cycle_log = [tuple(c) for c in ident.get("cycle_log", [])][-CYCLE_LOG:]
                rec.workload_history = [(float(t), int(d), int(m)) for t, d, m in ident.get("workload_history", [])]
                self._by_id[rec.id] = rec
                self._by_name[rec.name] = rec.id

    def get(self, worker_id: str) -> WorkerRecord | None:
        return self._by_id.get(worker_id)

    def all(self) -> list[WorkerRecord]:
        return list(self._by_id.values())

    def active_ids(self) -> list[str]:
        return [r.id for r in self._by_id.values() if r.state == "active"]

    def heterogeneity(self, active_only: bool = True) -> dict[str, float | None]:
        """HL of the active (or all) workers (OmniLearn Eq. 3): max/min capacity.

        ``declared`` from the cores/FLOPs workers declared, ``measured`` from
        their recent training throughput (samples per compute second): the
        latter includes slowdowns no declaration shows. None until two
        workers have a value.
        """
        active = [r for r in self._by_id.values() if r.state == "active" or not active_only]
        out: dict[str, float | None] = {}
        for key, values in (("declared", [r.declared_capacity for r in active]),
                            ("measured", [r.throughput() for r in active])):
            known = [v for v in values if v]
            out[key] = round(max(known) / min(known), 3) if len(known) >= 2 else None
        return out
