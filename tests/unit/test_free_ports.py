"""``free_ports``: a port handed to one launcher is not handed to another before its child binds it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hermes.deploy import procs


class _Sock:
    """A socket whose bind to port 0 gets the next port of a script (the kernel's draws)."""

    draws: list[int] = []

    def __init__(self, *_a) -> None:
        self.port = 0

    def bind(self, addr) -> None:
        self.port = self.draws.pop(0)

    def getsockname(self):
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        pass


def test_a_reserved_port_is_skipped_until_its_reservation_lapses(tmp_path, monkeypatch):
    registry, now = tmp_path / "ports.json", [1000.0]
    monkeypatch.setattr(procs.socket, "socket", _Sock)
    _Sock.draws = [40001, 40002]
    assert procs.free_ports(2, registry=registry, clock=lambda: now[0]) == [40001, 40002]
    _Sock.draws = [40001, 40003]  # the kernel hands 40001 out again before its child bound it
    assert procs.free_ports(1, registry=registry, clock=lambda: now[0]) == [40003]
    assert set(json.loads(registry.read_text())) == {"40001", "40002", "40003"}
    now[0] += procs.PORT_RESERVATION_SECONDS + 1  # long bound by now, or given up: the kernel decides again
    _Sock.draws = [40001]
    assert procs.free_ports(1, registry=registry, clock=lambda: now[0]) == [40001]
    assert set(json.loads(registry.read_text())) == {"40001"}


@pytest.mark.parametrize("broken", ["{not json", "[1, 2]", '{"40001": null}', '{"x": 1.0}'])
def test_a_broken_registry_is_started_afresh(tmp_path, monkeypatch, broken):
    registry = tmp_path / "ports.json"
    registry.write_text(broken)
    monkeypatch.setattr(procs.socket, "socket", _Sock)
    _Sock.draws = [40005]
    assert procs.free_ports(1, registry=registry) == [40005]
    assert set(json.loads(registry.read_text())) == {"40005"}


def test_concurrent_launchers_never_share_a_port(tmp_path):
    """Four processes drawing 50 ports each from the real kernel at once: 200 distinct ports, all noted."""
    registry = tmp_path / "ports.json"
    code = ("import json, sys; from pathlib import Path; from hermes.deploy.procs import free_port; "
            f"print(json.dumps([free_port(registry=Path({str(registry)!r})) for _ in range(50)]))")
    children = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    drawn = [p for c in children for p in json.loads(c.communicate(timeout=60)[0])]
    assert all(c.returncode == 0 for c in children)
    assert len(drawn) == 200 and len(set(drawn)) == 200
    # Every draw was noted: the lock kept the four read-modify-writes of the registry from losing any.
    assert {int(p) for p in json.loads(registry.read_text())} == set(drawn)


@pytest.mark.parametrize("count", [1, 3])
def test_ports_are_really_free_and_distinct(tmp_path, count):
    ports = procs.free_ports(count, registry=tmp_path / "ports.json")
    assert len(set(ports)) == count and all(procs.port_is_free(p) for p in ports)
