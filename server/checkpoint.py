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

A record damaged before the end (a flipped bit) refuses the resume, naming the
acknowledged updates it would lose; with the operator's
``--resume-truncate-corrupt`` the damaged record(s) are skipped and the
checksum-verified records after them replayed (``salvage``): each record is a
step against the model of its moment, so replaying the later ones without the
damaged one is what a lost update does in asynchronous training. The skipped
versions are kept as empty steps (op ``lost``) so that versions and later
journals stay in step.

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
from dataclasses import dataclass, field
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
_REC_HEAD = struct.Struct("<I")  # length of a journal record's JSON header, and its checksums
# Starts every format-2 journal record. As a format-1 header length it would be 0x324a48ff
# bytes, so the first four bytes tell the formats apart.
RECORD_MARK = b"\xffHJ2"


# ---------------------------------------------------------------------------
# the journal


class Journal:
    """Append-only log of folded updates since one checkpoint.

    Record (format 2): the marker ``RECORD_MARK``, u32 header length, u32
    CRC32C of the length and the header, the JSON header (version, op,
    weights, dtype and element count of each delta), the deltas' raw bytes,
    u32 CRC32C of header and deltas. The marker and the header's own
    checksum let a reader step over a damaged record and count the intact
    ones after it, so a flipped byte mid-journal is told from a torn tail.
    Format 1 (no marker, no header checksum) is still read. Appends happen
    under the engine's step lock, in fold order.
    """

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self._fh = open(path, "ab")  # noqa: SIM115 - closed in close()

    def append(self, version: int, op: str, payloads: Sequence[Payload], weights: Sequence[float],
               *, elapsed: float | None = None, at: float | None = None) -> None:
        self._fh.writelines(record_parts(version, op, payloads, weights, elapsed=elapsed, at=at))
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def record_parts(version: int, op: str, payloads: Sequence[Payload], weights: Sequence[float],
                 *, elapsed: float | None = None, at: float | None = None) -> list[Any]:
    """One format-2 record's bytes, in parts (see Journal)."""
    head = json.dumps({
        "version": version, "op": op, "weights": [float(w) for w in weights],
        # The run's training seconds and wall-clock time of the fold: the last moment a
        # resumed server knows its predecessor was alive (downtime starts there).
        "elapsed": elapsed, "at": at,
        "deltas": [{"dtype": dtype_name(p.dtype), "numel": p.numel} for p in payloads],
    }).encode()
    length = _REC_HEAD.pack(len(head))
    crc = crc32c.crc32c(head)
    parts: list[Any] = [RECORD_MARK, length, _REC_HEAD.pack(crc32c.crc32c(head, crc32c.crc32c(length))), head]
    for p in payloads:
        for chunk in p.chunks:
            b = bytes_of(chunk)
            crc = crc32c.crc32c(b, crc)
            parts.append(b)
    parts.append(_REC_HEAD.pack(crc))
    return parts


# A skipped (damaged) record's stand-in after a salvage: an empty step, so versions stay in step.
LOST = "lost"

Record = tuple[dict[str, Any], list[torch.Tensor]]


@dataclass
class JournalScan:
    """What one journal file holds: the records before any damage, and what the damage costs.

    ``good_end``: bytes of intact records from the start. ``corrupt_at``: the byte of a damaged
    record that intact records follow (None: no such record). ``salvaged``: the intact records
    after it, verified by their own checksums, with their byte spans; ``missing``: the versions
    between them that no intact record holds (the damaged records). ``lost``: the acknowledged
    updates a resume past the damage drops: the missing ones when the salvage is sound (versions
    rising after the intact ones), else the damaged one and every intact one after it.
    ``tail``: bytes of an unfinished last record (never acknowledged).
    """

    path: Path
    records: list[Record] = field(default_factory=list)
    good_end: int = 0
    corrupt_at: int | None = None
    lost: int = 0
    tail: int = 0
    salvaged: list[Record] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    sound: bool = True


def _parse_record(data: bytes, pos: int) -> tuple[Record, int] | None:
    """The record at ``pos`` and where it ends, or None when it is damaged or incomplete."""
    mark = len(RECORD_MARK)
    v2 = data[pos : pos + mark] == RECORD_MARK
    at = pos + mark if v2 else pos
    if at + (8 if v2 else 4) > len(data):
        return None
    (n,) = _REC_HEAD.unpack_from(data, at)
    head_at = at + (8 if v2 else 4)
    if v2:
        (head_crc,) = _REC_HEAD.unpack_from(data, at + 4)
        if head_at + n > len(data) or crc32c.crc32c(data[head_at : head_at + n], crc32c.crc32c(data[at : at + 4])) \
                != head_crc:
            return None
    try:
        head = json.loads(data[head_at : head_at + n])
        sizes = [int(d["numel"]) * torch.empty(0, dtype=dtype_from_name(d["dtype"])).element_size()
                 for d in head["deltas"]]
    except (ValueError, KeyError, TypeError, ProtocolError):  # garbage: not a record
        return None
    body_at = head_at + n
    end = body_at + sum(sizes)
    if min(sizes, default=0) < 0 or end + 4 > len(data):
        return None
    (crc,) = _REC_HEAD.unpack_from(data, end)
    if crc32c.crc32c(data[body_at:end], crc32c.crc32c(data[head_at:body_at])) != crc:
        return None
    deltas, off = [], body_at
    for d, size in zip(head["deltas"], sizes):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            raw = bytearray(data[off : off + size])
            deltas.append(torch.frombuffer(raw, dtype=dtype_from_name(d["dtype"])) if size else torch.empty(0))
        off += size
    return (head, deltas), end + 4


def _intact_after(data: bytes, pos: int) -> tuple[list[Record], list[tuple[int, int]]]:
    """Intact format-2 records after a damaged one at ``pos``, found by their markers, with their byte spans."""
    records: list[Record] = []
    spans: list[tuple[int, int]] = []
    at = data.find(RECORD_MARK, pos + 1)
    while at >= 0:
        parsed = _parse_record(data, at)
        if parsed is None:
            at = data.find(RECORD_MARK, at + 1)
            continue
        records.append(parsed[0])
        spans.append((at, parsed[1]))
        at = data.find(RECORD_MARK, parsed[1])
    return records, spans


def _base_version(path: Path) -> int | None:
    """The checkpoint version a journal follows (``journal-<V>.log``): its first record is V + 1."""
    try:
        return int(path.stem.split("-", 1)[1])
    except (IndexError, ValueError):
        return None


def _salvage(scan: JournalScan) -> None:
    """The versions the damaged records held, from the intact ones around them; unsound (the old rule:
    everything from the damage on is lost) when the salvaged versions do not rise after the intact ones."""
    before = scan.records[-1][0]["version"] if scan.records else _base_version(scan.path)
    versions = [int(head["version"]) for head, _ in scan.salvaged]
    if before is None:
        before = versions[0] - 2  # at least the damaged record itself
    previous, missing = int(before), list[int]()
    for v in versions:
        if v <= previous:
            scan.sound = False
            break
        missing.extend(range(previous + 1, v))
        previous = v
    if scan.sound:
        scan.missing = missing
        scan.lost = len(missing)
    else:
        scan.missing = []
        scan.lost = len(scan.salvaged) + 1


def scan_journal(path: Path) -> JournalScan:
    """Read a journal: the intact records up to the first damaged one, and what follows it."""
    data = path.read_bytes()
    scan = JournalScan(path)
    pos = 0
    while pos < len(data):
        parsed = _parse_record(data, pos)
        if parsed is None:
            break
        scan.records.append(parsed[0])
        pos = parsed[1]
    scan.good_end = pos
    if pos < len(data):
        scan.salvaged, scan.spans = _intact_after(data, pos)
        if scan.salvaged:
            scan.corrupt_at = pos
            _salvage(scan)
            scan.tail = len(data) - scan.spans[-1][1]
        else:
            scan.tail = len(data) - pos
    return scan


def read_journal(path: Path) -> list[Record]:
    """Intact records in order, up to the first damaged or unfinished one."""
    return scan_journal(path).records


def scan_journals(directory: Path) -> list[JournalScan]:
    """Every journal of a checkpoint directory, in order."""
    paths = sorted(directory.glob("journal-*.log"), key=lambda p: int(p.stem.split("-", 1)[1]))
    return [scan_journal(p) for p in paths]


def journal_damage(scans: Sequence[JournalScan]) -> tuple[JournalScan, int] | None:
    """The first journal with a damaged record before its end, and the acknowledged updates lost if
    the run resumes past the damage: the damaged records of every journal, where the records after
    them can be salvaged (``JournalScan.sound``); from the first journal where they cannot, that one's
    damaged record, the intact ones after it and every record of the later journals. None when every
    journal is intact up to a torn tail."""
    first: JournalScan | None = None
    lost = 0
    for i, scan in enumerate(scans):
        if scan.corrupt_at is None:
            continue
        first = first or scan
        lost += scan.lost
        if not scan.sound:
            lost += sum(len(s.records) + len(s.salvaged) for s in scans[i + 1 :])
            break
    return None if first is None else (first, lost)


def check_model_file(path: Path) -> None:
    """A checkpoint's model file is there and holds every byte its header names (CheckpointError if not)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n)) if n <= size else None
    except FileNotFoundError:
        raise CheckpointError(f"{path.name} is missing from {path.parent}: the checkpoint cannot be resumed") from None
    except (OSError, struct.error, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable tensor file ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: truncated ({size} bytes, shorter than its own header)")
    try:
        need = 8 + n + max((int(e["data_offsets"][1]) for k, e in header.items() if k != "__metadata__"), default=0)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"{path}: not a readable tensor file ({exc})") from None
    if size < need:
        raise CheckpointError(f"{path}: truncated ({size} bytes of {need}): the checkpoint cannot be resumed")
    for name in ("model", "baseline"):
        if name not in header:
            raise CheckpointError(f"{path}: no {name!r} tensor: the checkpoint cannot be resumed")


def _aside(path: Path) -> Path:
    """Where a damaged journal is kept: ``NAME.damaged``, or ``NAME.damaged.N`` when an earlier salvage
    already kept one there (a second damaged resume must not overwrite the first one's evidence)."""
    aside = path.with_name(path.name + ".damaged")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.damaged.{n}")
        n += 1
    return aside


def check_resumable(directory: str | Path, meta: Mapping[str, Any], *, truncate_corrupt: bool = False) -> None:
    """Refuse (CheckpointError, one line) a resume that would fail or silently lose acknowledged
    updates: a missing or truncated model file, a damaged journal record before the end
    (unless ``truncate_corrupt``)."""
    d = Path(directory)
    model_file = meta.get("model_file")
    if not isinstance(model_file, str):
        raise CheckpointError(f"{d / META}: names no model file")
    check_model_file(d / model_file)
    damage = journal_damage(scan_journals(d))
    if damage is not None and not truncate_corrupt:
        scan, lost = damage
        raise CheckpointError(
            f"{scan.path.name}: damaged record at byte {scan.corrupt_at} with {len(scan.salvaged)} intact "
            f"record(s) after it; resuming would lose {lost} acknowledged update(s): restore the file, or "
            "resume with --resume-truncate-corrupt to skip the damaged record(s)"
            + (" and replay the intact ones after" if scan.sound else " and drop everything after"))


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
        # --resume-truncate-corrupt: resume past a damaged journal record, skipping it (salvage).
        self.truncate_corrupt = False
        self.dropped_updates = 0

    def _model_path(self, version: int) -> Path:
        return self.dir / f"model-{version}.safetensors"

    def _journal_path(self, version: int) -> Path:
        return self.dir / f"journal-{version}.log"

    # -- lifecycle --
    def open(self, *, resume: bool, overwrite: bool = False, truncate_corrupt: bool = False) -> None:
        """Prepare the directory: resume from it, or start a fresh run in it."""
        self.truncate_corrupt = truncate_corrupt
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

        Keeps the last replayed record's (elapsed, at) stamp in ``last_alive``. A torn tail
        (never acknowledged) is cut off the file, so the resumed run appends after intact
        records; a damaged record before the end refuses the resume (check_resumable)
        unless ``truncate_corrupt``: then the damaged records are skipped and the
        verified ones after them replayed (``_salvage_damaged``), or, where that is not
        sound, it and everything after it are dropped; the damaged files are kept beside
        as ``*.damaged`` either way.
        """
        replayed = 0
        scans = scan_journals(self.dir)
        damage = journal_damage(scans)
        if damage is not None:
            scan, lost = damage
            if not self.truncate_corrupt:
                raise CheckpointError(f"{scan.path.name}: damaged record at byte {scan.corrupt_at} with intact "
                                      f"records after it; resuming would lose {lost} acknowledged update(s)")
            for i, damaged in enumerate(scans):
                if damaged.corrupt_at is None:
                    continue
                if not damaged.sound:
                    scans = self._drop_damaged(scans, damaged, damaged.lost + sum(
                        len(s.records) + len(s.salvaged) for s in scans[i + 1 :]))
                    break
                self._salvage_damaged(damaged)
        for scan in scans:
            if scan.tail:
                log.warning("journal %s: %d trailing bytes of an unfinished record dropped (never acknowledged)",
                            scan.path.name, scan.tail)
                os.truncate(scan.path, scan.good_end)
            for head, deltas in scan.records:
                if head["version"] <= state.version:
                    continue
                if head["version"] != state.version + 1:
                    raise CheckpointError(f"{scan.path.name}: update {head['version']} follows {state.version}; "
                                          "the journal has a gap")
                payloads = [Payload(dtype=d.dtype, chunks=(d,), shapes=((d.numel(),),)) for d in deltas]
                if head["op"] == LOST:  # a damaged record skipped by a salvage: the version, no step
                    state.apply([])
                    continue
                if head["op"] == "blend":
                    state.blend(payloads[0], head["weights"][0])
                else:
                    state.apply(list(zip(payloads, head["weights"])))
                replayed += 1
                if head.get("elapsed") is not None and head.get("at") is not None:
                    self.last_alive = (float(head["elapsed"]), float(head["at"]))
        return replayed

    def _salvage_damaged(self, damaged: JournalScan) -> None:
        """--resume-truncate-corrupt, where sound: the journal rewritten as its intact records, the damaged
        ones replaced by empty ``lost`` records of their versions (so a later resume replays the same), the
        damaged file kept beside. Replaying the later records without the damaged one is what a lost update
        does in asynchronous training: each is a step computed against the model of its moment, and the
        model it now lands on lacks one step, as if that update had been refused. Under a barrier preset a
        record is a round's combined fold: the round is lost, and the rounds after it land one round stale."""
        data = damaged.path.read_bytes()
        aside = _aside(damaged.path)
        aside.write_bytes(data)
        rewritten: list[tuple[int, bytes]] = [(int(head["version"]), data[a:b])
                                              for (head, _), (a, b) in zip(damaged.salvaged, damaged.spans)]
        lost: list[Record] = []
        for v in damaged.missing:
            head = {"version": v, "op": LOST, "weights": [], "elapsed": None, "at": None, "deltas": []}
            rewritten.append((v, b"".join(record_parts(v, LOST, [], []))))
            lost.append((head, []))
        rewritten.sort(key=lambda vb: vb[0])
        tmp = damaged.path.with_name(damaged.path.name + ".salvage")
        with open(tmp, "wb") as fh:
            fh.write(data[: damaged.good_end])
            fh.writelines(b for _, b in rewritten)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, damaged.path)
        self.dropped_updates += len(damaged.missing)
        log.warning("--resume-truncate-corrupt: %s has %d damaged record(s) from byte %s (version(s) %s); skipped "
                    "as lost updates, and the %d verified record(s) after them replayed (the damaged journal kept "
                    "as %s)", damaged.path.name, len(damaged.missing), damaged.corrupt_at,
                    ", ".join(map(str, damaged.missing)) or "none", len(damaged.salvaged), aside.name)
        damaged.records = sorted([*damaged.records, *damaged.salvaged, *lost], key=lambda r: int(r[0]["version"]))
        damaged.corrupt_at, damaged.lost, damaged.tail = None, 0, 0
        damaged.salvaged, damaged.spans, damaged.missing = [], [], []

    def _drop_damaged(self, scans: list[JournalScan], damaged: JournalScan, lost: int) -> list[JournalScan]:
        """--resume-truncate-corrupt: keep the records before the damage, move the rest aside."""
        i = scans.index(damaged)
        for later in scans[i + 1 :]:
            later.path.replace(_aside(later.path))
        aside = _aside(damaged.path)
        aside.write_bytes(damaged.path.read_bytes())
        os.truncate(damaged.path, damaged.good_end)
        self.dropped_updates += lost
        log.warning("--resume-truncate-corrupt: %s has a damaged record at byte %s; dropped %d acknowledged "
                    "update(s) from there on (the damaged journal kept as %s)", damaged.path.name,
                    damaged.corrupt_at, lost, aside.name)
        damaged.corrupt_at, damaged.lost, damaged.tail = None, 0, 0
        return scans[: i + 1]

    def _restore(self, meta: dict[str, Any]) -> None:
        e = self.engine
        spec = e.state.spec
        if meta["model"] != {"name": spec.name, "numel": spec.numel}:
            raise CheckpointError(f"checkpoint model {meta['model']} does not match this run's "
                                  f"{spec.name} ({spec.numel} parameters)")
        differing = sorted(k for k, v in meta["config"].items() if e.config.model_dump().get(k) != v)
        if differing:
            log.warning("resuming with run-config changes: %s", ", ".join(differing))
        check_model_file(self.dir / meta["model_file"])
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
        if self.dropped_updates:  # --resume-truncate-corrupt: what the damaged journal cost
            self.resumed_from["dropped_updates"] = self.dropped_updates
        e.telemetry.emit("resumed", directory=str(self.dir), **self.resumed_from)
        log.info("resumed from %s: checkpoint version %d + %d journaled updates = version %d%s",
                 self.dir, version, replayed, e.state.version,
                 f" ({self.dropped_updates} damaged or following updates dropped)" if self.dropped_updates else "")
