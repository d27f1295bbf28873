"""client/loop.py: the loop runs cycles until a topology hook says stop, and returns why."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from hermes.client.loop import cycle_record, run_cycles
from hermes.client.prefetch import StopSignal, Work
from hermes.client.topology import PushPull
from hermes.client.trainer import CycleResult


def _work(n: int = 4) -> Work:
    return Work(epoch=0, shards=(0,), x=torch.zeros(n, 1), y=torch.zeros(n, dtype=torch.int64), batch_size=2,
                lr=0.1, fetched_bytes=0, cycle_samples=n, accumulation=1)


class _Trainer:
    slowdown = 1.0
    between_cycles = (0.0, 0.0)

    def set_lr(self, lr: float) -> None:
        self.lr = lr

    def pace_overhead(self, t0: float, cpu0: float, waited: float = 0.0) -> None:
        pass

    def train_cycle(self, x, y, batch_size, accumulation, *, steps=None, grad_hook=None) -> CycleResult:
        return CycleResult(samples=len(y), steps=1, loss=0.5, compute_seconds=0.01, wait_seconds=0.0, stopped=False)


class _Host:
    def __init__(self) -> None:
        self.stats = SimpleNamespace(cycles=0, samples=0, compute_seconds=0.0, wait_seconds=0.0, last_loss=0.0)
        self.stop_requested = threading.Event()
        self.progressed = 0

    def slowdown_now(self) -> float:
        return 1.0

    def report_if_due(self, job, session) -> None:
        pass

    def progress(self, session) -> None:
        self.progressed += 1


class _Session:
    def __init__(self, items: list) -> None:
        self.items = items
        self.prefetcher = SimpleNamespace(next=lambda: self.items.pop(0))

    def cycle_samples(self, work: Work):
        return work.x, work.y


class _Topology:
    """Stops after ``cycles`` cycles with ``reason``."""

    grad_hook = None

    def __init__(self, cycles: int, reason: str) -> None:
        self.cycles, self.reason, self.finished = cycles, reason, 0

    def start_cycle(self):
        return None

    def steps(self, work, samples):
        return None

    def stop_signal(self, signal: StopSignal) -> str:
        return signal.reason

    def finish_cycle(self, work, result):
        self.finished += 1
        return self.reason if self.finished >= self.cycles else None


def test_the_loop_returns_the_reason_a_hook_gives_and_counts_the_cycles() -> None:
    host, job = _Host(), SimpleNamespace(trainer=_Trainer(), task=None)
    reason = run_cycles(host, job, _Session([_work(), _work(), _work()]), _Topology(2, "server asked to stop"))
    assert reason == "server asked to stop"
    assert host.stats.cycles == 2 and host.stats.samples == 8 and host.progressed == 1


def test_the_prefetchers_stop_is_the_loops_reason() -> None:
    host, job = _Host(), SimpleNamespace(trainer=_Trainer(), task=None)
    reason = run_cycles(host, job, _Session([_work(), StopSignal("server asked to stop")]), _Topology(9, "never"))
    assert reason == "server asked to stop" and host.stats.cycles == 1


def _push_pull(host: _Host, max_cycles: int | None) -> PushPull:
    pp = object.__new__(PushPull)
    pp.host, pp.max_cycles = host, max_cycles
    return pp


def test_push_pull_says_why_it_stops_before_a_cycle() -> None:
    host = _Host()
    assert _push_pull(host, max_cycles=2).start_cycle() is None
    host.stats.cycles = 2
    assert _push_pull(host, max_cycles=2).start_cycle() == "max_cycles=2 reached"
    host.stop_requested.set()
    # The operator's stop: its reason is the one request_stop recorded.
    assert _push_pull(host, max_cycles=None).start_cycle() == ""


def test_push_pull_raises_the_prefetchers_error_and_returns_its_reason_otherwise() -> None:
    pp = _push_pull(_Host(), None)
    assert pp.stop_signal(StopSignal("server asked to stop")) == "server asked to stop"
    with pytest.raises(RuntimeError, match="broken"):
        pp.stop_signal(StopSignal("prefetch failed: broken", RuntimeError("broken")))


def test_a_cycle_record_names_the_batch_size_once() -> None:
    result = CycleResult(samples=4, steps=2, loss=0.5, compute_seconds=0.25, wait_seconds=0.0, stopped=False)
    record = cycle_record(_work(), result, pushed=False, decision="no_improvement", val_loss=1.5)
    assert record.batch_size == 2 and record.dss == 4 and not record.pushed
    assert record.model_dump()["batch_size"] == 2 and "mbs" not in record.model_dump()
