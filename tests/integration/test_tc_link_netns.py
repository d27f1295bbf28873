"""hermes.deploy.tc_link for real: shape a network namespace's interface, read the qdiscs back, measure the rates.

The namespace is a kernel-mode testbed's (:class:`hermes.deploy.netlab.Netlab`
with an unshaped ``lan`` link: a veth pair and a default route, nothing
shaped), so inside it tc_link finds its interface the way it does in a
container, by the default route. The measuring client is the command
tc_link execs.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from hermes.deploy.links import PROFILES
from hermes.deploy.netlab import Netlab, kernel_available
from hermes.deploy.tc_link import ifb_name
from tests.integration.test_links import CLIENT, _serve

pytestmark = pytest.mark.integration

WRAPPER = [sys.executable, "-m", "hermes.deploy.tc_link"]


def _qdisc_rates(ns: str) -> dict[str, str]:
    """dev -> tbf rate as tc prints it (``10Mbit``), from ``tc qdisc show`` in ``ns``."""
    shown = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "show"], capture_output=True, text=True,
                           check=True).stdout
    return {m.group(1): m.group(2) for m in re.finditer(r"qdisc tbf \S+ dev (\S+) .*?rate (\S+)", shown)}


def test_missing_iproute2_is_one_line() -> None:
    proc = subprocess.run([*WRAPPER, "--link", "lte", "--", "true"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/nonexistent"})
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "iproute2" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not kernel_available(), reason="shaping a namespace needs root and iproute2 (ip, tc)")
def test_shapes_a_namespace_and_execs_the_command() -> None:
    link = PROFILES["lte"]
    assert link.up_bps and link.down_bps
    with Netlab([PROFILES["lan"]]) as lab:
        ns, dev = lab.namespace(0), f"hk{lab.tag}n0"
        far = socket.create_server((lab.service_ip, 0))
        threading.Thread(target=_serve, args=(far,), daemon=True).start()
        try:
            # One second of traffic each way at the nominal rates.
            up, down = int(link.up_bps / 8), int(link.down_bps / 8)
            proc = subprocess.run(lab.wrap(0, [*WRAPPER, "--link", "lte", "--", sys.executable, "-c", CLIENT,
                                               lab.service_ip, str(far.getsockname()[1]), str(up), str(down)]),
                                  capture_output=True, text=True, timeout=60)
        finally:
            far.close()
        assert proc.returncode == 0, proc.stderr
        assert _qdisc_rates(ns) == {dev: "10Mbit", ifb_name(dev): "30Mbit"}
        ingress = subprocess.run(["ip", "netns", "exec", ns, "tc", "filter", "show", "dev", dev, "ingress"],
                                 capture_output=True, text=True, check=True).stdout
        assert f"Redirect to device {ifb_name(dev)}" in ingress
        summary = [ln for ln in proc.stderr.splitlines() if f"link lte on {dev}:" in ln]
        delayed = any("(netem)" in ln for ln in summary)
        if not delayed:  # this kernel has no netem: one line says so
            assert sum("NOT applied" in ln and "WARNING" in ln for ln in proc.stderr.splitlines()) == 1, proc.stderr
        m = json.loads(proc.stdout)
        rtt = link.rtt if delayed else 0.0
        up_bps = up * 8 / (m["up_seconds"] - rtt)
        down_bps = down * 8 / (m["down_seconds"] - rtt / 2)
        # Never faster than the profile (load only slows a measurement); how close to it is not
        # asserted: the 0.7x lower bound on the rates can fail by chance on a loaded machine (issue 32).
        assert up_bps <= 1.3 * link.up_bps, (up_bps, m)
        assert down_bps <= 1.3 * link.down_bps, (down_bps, m)
        if delayed:
            assert m["rtt"] >= link.rtt, m

        # Again with another link: the old qdiscs are replaced; the command runs as the user asked for.
        # /usr/bin/id, not this interpreter: nobody may not be allowed to run it (a venv under /root).
        proc = subprocess.run(lab.wrap(0, [*WRAPPER, "--link", "wifi", "--user", "nobody", "--", "id", "-u"]),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert int(proc.stdout) != 0
        assert _qdisc_rates(ns) == {dev: "50Mbit", ifb_name(dev): "50Mbit"}

        # Without CAP_NET_ADMIN (root with an empty capability bounding set, so the interpreter stays
        # readable wherever it lives): one line naming it, no traceback.
        if shutil.which("setpriv"):
            proc = subprocess.run(lab.wrap(0, ["setpriv", "--bounding-set=-all", "--inh-caps=-all",
                                               *WRAPPER, "--link", "lte", "--", "true"]),
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 1
            assert proc.stderr.strip().count("\n") == 0 and "NET_ADMIN" in proc.stderr, proc.stderr
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert ns not in listed.split()
