"""Server checkpoints and the update journal: nothing acknowledged is lost.

A checkpoint directory holds

- ``checkpoint.json``: metadata of the last complete checkpoint (version,
  run config, shard queue, allocator state, worker ids and names, evaluation
  history, counters), replaced atomically (temp file, fsync, ``os.replace``);
  the allocator state keeps every worker's workload, so agents that register
  again after a resume carry on with it; one that has not registered again
  within the heartbeat timeout is forgotten by the allocator, as if lost;
- ``model-<V>.safetensors``: the global model and its baseline w0 as raw fp32
  tensors in the safetensors layout (8-byte header length, JSON header, raw
  bytes); no pickle anywhere;
- ``journal-<V>.log``: every update folded after checkpoint V, appended and
  fsynced *before* the push is acknowledged (``durable_acks``): the raw delta
  bytes as received and the weights they were folded with.

Resuming loads the last checkpoint and replays the journals in order, which
reproduces the model bit for bit (the folds are element-wise, so the result
does not depend on how frames were cut). An update whose journal record is
torn (the process died while writing it) was never acknowledged and is
dropped. With ``durable_acks`` off nothing is journaled: the window of loss
is then every update since the last checkpoint.

What a restart does not keep: worker secrets (every agent registers again
and gets a new one; ids stay with names), sync-strategy state (barriers
start over as agents rejoin), and the shard queue's progress after the last
checkpoint (those shards are handed out again).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import crc32c
import torch

from hermes.common.config import RunConfig
from hermes.common.wire import Payload, ProtocolError, dtype_from_name, dtype_name
from hermes.server.aio import cancel_and_wait
from hermes.server.engine.run_clock import RunClock
from hermes.server.engine.telemetry import Telemetry
from hermes.server.state import ModelState

# The tensor-file layer (server/tensorfile.py).
from hermes.server.tensorfile import (
    CheckpointError,
    bytes_of,
    read_tensors,
    write_atomic,
    write_tensors,
)

log = logging.getLogger(__name__)

FORMAT = 1
META = "checkpoint.json"
_REC_HEAD = struct.Struct("<I")  # length of a journal record's JSON header


# ---------------------------------------------------------------------------
# the journal


class Journal:
    """Append-only log of folded updates since one checkpoint.

    Record: u32 header length, JSON header (version, op, weights, dtype and
    element count of each delta), the deltas' raw bytes, u32 CRC32C of all
    of it. Appends happen under the engine's step lock, in fold order.
    """

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self._fh = open(path, "ab")  # noqa: SIM115 - closed in close()

    def append(self, version: int, op: str, payloads: Sequence[Payload], weights: Sequence[float],
               *, elapsed: float | None = None, at: float | None = None) -> None:
        head = json.dumps({
            "version": version, "op": op, "weights": [float(w) for w in weights],
            # The run's training seconds and wall-clock time of the fold: the last moment a
            # resumed server knows its predecessor was alive (downtime starts there).
            "elapsed": elapsed, "at": at,
            "deltas": [{"dtype": dtype_name(p.dtype), "numel": p.numel} for p in payloads],
        }).encode()
        crc = crc32c.crc32c(head)
        parts: list[Any] = [_REC_HEAD.pack(len(head)), head]
        for p in payloads:
            for chunk in p.chunks:
                b = bytes_of(chunk)
                crc = crc32c.crc32c(b, crc)
                parts.append(b)
        parts.append(_REC_HEAD.pack(crc))
        self._fh.writelines(parts)
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def read_journal(path: Path) -> list[tuple[dict[str, Any], list[torch.Tensor]]]:
    """Complete records in order; a torn or corrupt tail ends the read (it was never acknowledged)."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos + _REC_HEAD.size <= len(data):
        (n,) = _REC_HEAD.unpack_from(data, pos)
        try:
            head = json.loads(data[pos + 4 : pos + 4 + n])
            sizes = [d["numel"] * torch.empty(0, dtype=dtype_from_name(d["dtype"])).element_size()
                     for d in head["deltas"]]
        except (ValueError, KeyError, TypeError, ProtocolError):  # garbage ends the log
            break
        body_at = pos + 4 + n
        end = body_at + sum(sizes)
        if end + 4 > len(data):
            break
        (crc,) = _REC_HEAD.unpack_from(data, end)
        if crc32c.crc32c(data[body_at:end], crc32c.crc32c(data[pos + 4 : body_at])) != crc:
            log.warning("journal %s: corrupt record at byte %d; replay stops there", path, pos)
            break
        deltas, at = [], body_at
        for d, size in zip(head["deltas"], sizes):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                raw = bytearray(data[at : at + size])
                deltas.append(torch.frombuffer(raw, dtype=dtype_from_name(d["dtype"])) if size else torch.empty(0))
            at += size
        out.append((head, deltas))
        pos = end + 4
    if pos != len(data):
        log.warning("journal %s: %d trailing bytes of an unfinished record dropped", path, len(data) - pos)
    return out


# ---------------------------------------------------------------------------
# the checkpointer


class Checkpointed(Protocol):
    """What the checkpointer saves and restores: the engine (hermes.server.engine.Engine) satisfies it."""

    config: RunConfig
    state: ModelState
    telemetry: Telemetry
    run_clock: RunClock
    step_lock: asyncio.Lock

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any], *, best_flat: torch.Tensor | None = None,
                        alive: tuple[float, float] | None = None) -> float: ...

    def best_flat(self) -> torch.Tensor | None: ...



def check_directory(directory: str | Path, *, resume: bool, overwrite: bool = False) -> dict[str, Any] | None:
    """Create the directory (mode 0700) and return the checkpoint to resume, if resuming.

    Refuses to resume from nothing and to overwrite another run's checkpoint,
    unless ``overwrite``: then that run's checkpoint files are deleted.
    """
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)  # models and worker names: not for other users
    except OSError as exc:
        raise CheckpointError(f"checkpoint directory {d}: {exc.strerror or exc}") from None
    path = d / META
    meta = None
    if path.is_file():
        try:
            meta = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: unreadable ({exc})") from None
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{path}: format {meta.get('format')!r}, this server reads {FORMAT}")
    if resume and meta is None:
        raise CheckpointError(f"--resume {d}: no checkpoint there ({META} missing)")
    if not resume and meta is not None:
        if not overwrite:
            raise CheckpointError(f"{d} holds a checkpoint of a run at version {meta['version']}: "
                                  f"resume it (--resume {d}), replace it (--overwrite) or choose another directory")
        for old in [path, *d.glob("model-*.safetensors"), *d.glob("journal-*.log")]:
            old.unlink(missing_ok=True)
        log.warning("--overwrite: deleted the checkpoint of a run at version %s in %s", meta["version"], d)
        meta = None
    return meta


class Checkpointer:
    def __init__(self, engine: Checkpointed, directory: str | Path, *, interval: float, durable_acks: bool) -> None:
        self.engine = engine
        self.dir = Path(directory)
        self.interval = interval
        self.durable_acks = durable_acks
        self.journal: Journal | None = None
        self.last_version: int | None = None
        # (training seconds, wall-clock time) of the last moment the resumed run is known alive.
        self.last_alive: tuple[float, float] = (0.0, 0.0)
        self.last_seconds = 0.0
        self.written = 0
        # What the resume restored (checkpoint version, journaled updates replayed, downtime); None on a fresh run.
        self.resumed_from: dict[str, Any] | None = None
        self._task: asyncio.Task | None = None

    def _model_path(self, version: int) -> Path:
        return self.dir / f"model-{version}.safetensors"

    def _journal_path(self, version: int) -> Path:
        return self.dir / f"journal-{version}.log"

    # -- lifecycle --
    def open(self, *, resume: bool, overwrite: bool = False) -> None:
        """Prepare the directory: resume from it, or start a fresh run in it."""
        meta = check_directory(self.dir, resume=resume, overwrite=overwrite)
        if meta is not None:
            self._restore(meta)
        else:
            # A checkpoint from the start, so --resume works even after a crash
            # before the first periodic one (the journal holds the rest).
            version, flat = self.engine.state.snapshot(torch.float32)
            self._write(version, flat, self._metadata(version, self.engine.state_dict()))
            self.last_version = version
        self._start_journal(self.engine.state.version)

    def _start_journal(self, version: int) -> None:
        if self.journal is not None:
            self.journal.close()
        self.journal = Journal(self._journal_path(version), fsync=True) if self.durable_acks else None

    def start(self) -> None:
        self._task = asyncio.create_task(self._periodic(), name="hermes-checkpoints")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.save_or_report("periodic")

    async def save_or_report(self, reason: str) -> int | None:
        """``save``, with a failure logged and emitted instead of raised (None then)."""
        try:
            return await self.save(reason)
        except Exception as exc:  # a full disk must not take the server down
            self.engine.telemetry.emit("checkpoint_failed", reason=reason, error=str(exc)[:500])
            return None

    def record_fold(self, version: int, op: str, payloads: Sequence[Payload], weights: Sequence[float]) -> None:
        """Called by the engine after each fold and before any reply: durable first, then acknowledged."""
        if self.journal is not None:
            clock = self.engine.run_clock
            now = clock.clock.time()
            self.journal.append(version, op, payloads, weights, elapsed=clock.seconds(now), at=now)

    # -- saving --
    async def save(self, reason: str) -> int:
        """Write a checkpoint of the current state; returns its version."""
        engine = self.engine
        t0 = time.perf_counter()
        async with engine.step_lock:  # no fold in between: model, version and queue agree
            version, flat = engine.state.snapshot(torch.float32)
            meta = self._metadata(version, engine.state_dict())
            best = engine.best_flat()
            old_journal = self.journal
            # Folds after this point belong to the new checkpoint's journal.
            self.journal = Journal(self._journal_path(version), fsync=True) if self.durable_acks else None
        try:
            await asyncio.to_thread(self._write, version, flat, meta, best)
        finally:
            if old_journal is not None and old_journal is not self.journal:
                old_journal.close()
        self.last_version, self.last_seconds = version, time.perf_counter() - t0
        self.written += 1
        engine.telemetry.emit("checkpoint", version=version, reason=reason, seconds=round(self.last_seconds, 6))
        return version

    def _metadata(self, version: int, parts: dict[str, Any]) -> dict[str, Any]:
        """checkpoint.json: the file layout around the engine's ``state_dict()``."""
        return {
            "format": FORMAT,
            "version": version,
            "created": self.engine.run_clock.clock.time(),
            "model_file": self._model_path(version).name,
            "journal_file": self._journal_path(version).name,
            **parts,
        }

    def _write(self, version: int, flat: torch.Tensor, meta: dict[str, Any], best: torch.Tensor | None = None) -> None:
        tensors = {"model": flat, "baseline": self.engine.state.baseline}
        if best is not None:
            tensors["best"] = best
        write_tensors(self._model_path(version), tensors, {"version": str(version)})
        write_atomic(self.dir / META, lambda fh: fh.write(json.dumps(meta, indent=1).encode()))
        # Only now is everything older unneeded.
        for old in list(self.dir.glob("model-*.safetensors")) + list(self.dir.glob("journal-*.log")):
            try:
                v = int(old.stem.split("-", 1)[1].split(".")[0])
            except ValueError:
                continue
            if v < version:
                old.unlink(missing_ok=True)

    # -- resuming --
    def _replay(self, state: ModelState) -> int:
        """Fold the journals' updates after the checkpoint's version, in order; returns how many.

        Keeps the last replayed record's (elapsed, at) stamp in ``last_alive``.
        """
        replayed = 0
        journals = sorted(self.dir.glob("journal-*.log"), key=lambda p: int(p.stem.split("-", 1)[1]))
        for path in journals:
            for head, deltas in read_journal(path):
                if head["version"] <= state.version:
                    continue
                if head["version"] != state.version + 1:
                    raise CheckpointError(f"{path.name}: update {head['version']} follows {state.version}; "
                                          "the journal has a gap")
                payloads = [Payload(dtype=d.dtype, chunks=(d,), shapes=((d.numel(),),)) for d in deltas]
                if head["op"] == "blend":
                    state.blend(payloads[0], head["weights"][0])
                else:
                    state.apply(list(zip(payloads, head["weights"])))
                replayed += 1
                if head.get("elapsed") is not None and head.get("at") is not None:
                    self.last_alive = (float(head["elapsed"]), float(head["at"]))
        return replayed

    def _restore(self, meta: dict[str, Any]) -> None:
        e = self.engine
        spec = e.state.spec
        if meta["model"] != {"name": spec.name, "numel": spec.numel}:
            raise CheckpointError(f"checkpoint model {meta['model']} does not match this run's "
                                  f"{spec.name} ({spec.numel} parameters)")
        differing = sorted(k for k, v in meta["config"].items() if e.config.model_dump().get(k) != v)
        if differing:
            log.warning("resuming with run-config changes: %s", ", ".join(differing))
        tensors = read_tensors(self.dir / meta["model_file"])
        version = int(meta["version"])
        e.state.load(tensors["model"], version, baseline=tensors["baseline"])
        self.last_alive = (float(meta.get("elapsed_seconds", 0.0)),
                           float(meta.get("created", e.run_clock.clock.time())))
        replayed = self._replay(e.state)
        # The run's clock goes on from the last moment the old server was known alive (its
        # last journaled fold, else the checkpoint); the gap since is downtime, counted apart.
        down = e.load_state_dict(meta, best_flat=tensors.get("best"), alive=self.last_alive)
        self.resumed_from = {"checkpoint_version": version, "replayed_updates": replayed,
                             "version": e.state.version, "downtime_seconds": round(down, 3)}
        e.telemetry.emit("resumed", directory=str(self.dir), **self.resumed_from)
        log.info("resumed from %s: checkpoint version %d + %d journaled updates = version %d",
                 self.dir, version, replayed, e.state.version)
