"""The tc command plan of hermes.deploy.tc_link: rates and delays per link, netem or the tbf-only fallback."""

from __future__ import annotations

import logging

import pytest

from hermes.deploy import tc_link
from hermes.deploy.links import PROFILES, parse_link
from hermes.deploy.tc_link import Result, TcLinkError, apply, default_dev, ifb_name, plan


def _qdiscs(cmds: list[list[str]]) -> dict[str, dict[str, str]]:
    """dev -> {"rate": "10000000bit", "delay": "25000us", "parent": ...} from the qdisc-adding commands."""
    out: dict[str, dict[str, str]] = {}
    for c in cmds:
        if c[:3] != ["tc", "qdisc", "add"] or "ingress" in c:
            continue
        d = out.setdefault(c[c.index("dev") + 1], {})
        if "netem" in c:
            d["delay"] = c[c.index("delay") + 1]
            d["netem_root"] = str("root" in c)
        if "tbf" in c:
            d["rate"] = c[c.index("rate") + 1]
            d["tbf_parent"] = "root" if "root" in c else c[c.index("parent") + 1]
    return out


@pytest.mark.parametrize("name,up,down,delay_us", [
    ("wifi", 50_000_000, 50_000_000, 2500), ("lte", 10_000_000, 30_000_000, 25000),
    ("constrained", 2_000_000, 2_000_000, 75000), ("custom:5mbit/20mbit/80ms", 5_000_000, 20_000_000, 40000),
    ("custom:512kbit/1.5mbit/1s", 512_000, 1_500_000, 500000),
])
def test_plan_with_netem(name, up, down, delay_us) -> None:
    cmds = plan(parse_link(name), "eth0", netem=True)
    q = _qdiscs(cmds)
    ifb = ifb_name("eth0")
    # Upload on the interface's egress, download on the ifb's; RTT/2 each way, netem above tbf.
    assert q == {dev: {"delay": f"{delay_us}us", "netem_root": "True", "rate": f"{bps}bit", "tbf_parent": "1:1"}
                 for dev, bps in (("eth0", up), (ifb, down))}
    assert ["ip", "link", "add", ifb, "type", "ifb"] in cmds
    flt = next(c for c in cmds if c[:3] == ["tc", "filter", "add"])
    assert flt[flt.index("redirect") + 1:] == ["dev", ifb] and "ffff:" in flt
    # The ifb is shaped before traffic is redirected to it.
    assert cmds.index(flt) == len(cmds) - 1
    assert max(i for i, c in enumerate(cmds) if ifb in c and "qdisc" in c) < cmds.index(flt)


@pytest.mark.parametrize("name", ["wifi", "lte", "constrained", "custom:5mbit/20mbit/80ms"])
def test_plan_without_netem_shapes_rates_only(name) -> None:
    link = parse_link(name)
    cmds = plan(link, "eth0", netem=False)
    assert not any("netem" in c for c in cmds)
    assert _qdiscs(cmds) == {"eth0": {"rate": f"{int(link.up_bps)}bit", "tbf_parent": "root"},
                             ifb_name("eth0"): {"rate": f"{int(link.down_bps)}bit", "tbf_parent": "root"}}


def test_plan_lan_is_empty_and_names_fit() -> None:
    assert plan(PROFILES["lan"], "eth0", netem=True) == []
    assert ifb_name("eth0") == "ifb-eth0"
    assert len(ifb_name("a-very-long-ifname")) == 15


def test_netem_queue_holds_a_long_fat_pipe() -> None:
    assert tc_link.netem_limit(10e6, 0.025) == 1000
    # 1 Gbit/s for 0.5 s is 41667 full-size packets in flight.
    assert tc_link.netem_limit(1e9, 0.5) >= 41667


class FakeTc:
    """Records commands; answers ``fail(cmd)``'s (returncode, stderr) or success."""

    def __init__(self, fail=lambda cmd: None) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail

    def __call__(self, cmd: list[str]) -> Result:
        self.calls.append(cmd)
        if cmd[:3] == ["tc", "qdisc", "del"] or cmd[:3] == ["ip", "link", "del"]:
            return Result(2, "Error: Cannot find device")  # nothing to undo: ignored
        answer = self.fail(cmd)
        return Result(*answer) if answer else Result(0, "")


def _no_netem(cmd):
    return (2, "Error: Specified qdisc kind is unknown.") if "netem" in cmd else None


def test_apply_with_netem() -> None:
    fake = FakeTc()
    assert apply(PROFILES["lte"], "eth0", runner=fake) is True
    added = [c for c in fake.calls if "del" not in c]
    assert added == plan(PROFILES["lte"], "eth0", netem=True)


def test_apply_falls_back_to_tbf_and_says_so_once(caplog) -> None:
    fake = FakeTc(_no_netem)
    with caplog.at_level(logging.INFO, logger="hermes.deploy.tc_link"):
        assert apply(PROFILES["lte"], "eth0", runner=fake) is False
    # After the failed netem: undo, then the rates-only plan, complete.
    failed = next(i for i, c in enumerate(fake.calls) if "netem" in c)
    after = [c for c in fake.calls[failed + 1:] if "del" not in c]
    assert after == plan(PROFILES["lte"], "eth0", netem=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NOT applied" in warnings[0] and "50 ms" in warnings[0], warnings
    assert "\n" not in warnings[0]


def test_apply_strict_refuses_without_netem() -> None:
    with pytest.raises(TcLinkError, match="no netem.*--strict"):
        apply(PROFILES["lte"], "eth0", strict=True, runner=FakeTc(_no_netem))


def test_apply_lan_runs_nothing() -> None:
    fake = FakeTc()
    assert apply(PROFILES["lan"], "eth0", runner=fake) is True
    assert fake.calls == []


@pytest.mark.parametrize("stderr,match", [
    ("RTNETLINK answers: Operation not permitted", r"cap_add: \[NET_ADMIN\]"),
    ("Error: Unknown device type.", "no ifb device"),
    ("Error: Exclusivity flag on, cannot modify.", "failed: Error: Exclusivity flag on"),
])
def test_apply_failures_are_one_line(stderr, match) -> None:
    def fail(cmd):
        return (2, stderr) if cmd[:3] == ["ip", "link", "add"] else None

    with pytest.raises(TcLinkError, match=match) as info:
        apply(PROFILES["lte"], "eth0", runner=FakeTc(fail))
    assert "\n" not in str(info.value)


def test_default_dev() -> None:
    routes = {"route": "default via 172.18.0.1 dev eth0 \n", "link": ""}
    assert default_dev(lambda cmd: routes[cmd[2]]) == "eth0"
    links = {"route": "", "link": "1: lo: <LOOPBACK,UP> mtu 65536\n7: hkn0@if8: <BROADCAST,UP> mtu 1500\n"}
    assert default_dev(lambda cmd: links[cmd[2]]) == "hkn0"
    two = {"route": "", "link": "1: lo: <LOOPBACK>\n2: eth0: <UP>\n3: eth1: <UP>\n"}
    with pytest.raises(TcLinkError, match="give --dev"):
        default_dev(lambda cmd: two[cmd[2]])


def test_main_errors_are_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setattr(tc_link.shutil, "which", lambda _name: None)
    assert tc_link.main(["--link", "lte", "--", "true"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "iproute2" in err and "`tc`" in err
    assert tc_link.main(["--link", "ltee"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown link 'ltee'" in err
    # lan needs no tc at all.
    assert tc_link.main(["--link", "lan"]) == 0


def test_main_link_from_environment(monkeypatch, capsys) -> None:
    monkeypatch.setenv("HERMES_LINK", "constrained")
    assert tc_link.main(["--dry-run", "--dev", "veth9"]) == 0
    out = capsys.readouterr().out
    assert "tc qdisc add dev veth9 root handle 1: netem delay 75000us" in out
    assert "tbf rate 2000000bit" in out and "ifb-veth9" in out


def test_wrapper_imports_no_server_stack_nor_torch() -> None:
    """It runs first in the agent image (no fastapi/uvicorn there) and should start in well under a second."""
    import subprocess
    import sys

    code = ("import sys, hermes.deploy.tc_link; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'fastapi', 'uvicorn', 'starlette', 'numpy'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"
