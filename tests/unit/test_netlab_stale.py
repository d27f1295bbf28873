"""deploy/netlab.py: which link namespaces are a gone testbed's (the sweep removes them; a live one's are kept)."""

from __future__ import annotations

import os

from hermes.deploy import netlab


def test_only_namespaces_of_testbeds_no_longer_running_are_stale(monkeypatch):
    gone = 2**22 + 12345  # above Linux's largest pid: no such process
    listing = (f"hlk{os.getpid()}-0 (id: 3)\nhlk{gone}-0 (id: 4)\nhlk{gone}-1\nsomeone-elses\nhlkx-0\n\n")
    monkeypatch.setattr(netlab, "_run", lambda *cmd: listing if cmd[:3] == ("ip", "netns", "list") else "")
    assert netlab.stale_namespaces() == [f"hlk{gone}-0", f"hlk{gone}-1"]
    deleted: list[list[str]] = []
    monkeypatch.setattr(netlab.subprocess, "run", lambda cmd, **kw: deleted.append(cmd))
    assert netlab.sweep_stale() == 2
    assert deleted == [["ip", "netns", "delete", f"hlk{gone}-0"], ["ip", "netns", "delete", f"hlk{gone}-1"]]
