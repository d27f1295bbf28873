"""Shape this host's (this container's) own interface as a named link, then run a command.

The compose testbed's link emulation (deploy/compose.link-*.yml): every agent
container starts through this wrapper, which shapes the container's
interface with ``tc`` and then execs the agent::

    python -m hermes.deploy.tc_link --link lte --user hermes -- hermes-client --server ...

* upload (agent to server) on the interface's egress: tbf at the link's rate;
* download (server to agent) on its ingress: redirected (u32 match-all,
  mirred) to an ifb device whose egress has the same tbf;
* the delay, RTT/2 each way, with netem as the root qdisc of both, the tbf
  its child (the netem wiki's recipe). A kernel without netem (such as the
  one the tests run on) gets the rates only and one WARNING line saying the
  delay is not applied; ``--strict`` makes that an error.

The link is a name or ``custom:UP/DOWN/RTT`` parsed by
:func:`hermes.deploy.links.parse_link` (the testbed's own profiles); the tbf
parameters are :func:`hermes.deploy.netlab.tbf_args`, so the compose and the
local kernel-mode testbed shape alike. Changing qdiscs needs CAP_NET_ADMIN
(compose: ``cap_add: [NET_ADMIN]``) and root inside the container; ``--user``
drops to an unprivileged user before the command runs. Anything missing
(iproute2, the capability, ifb) ends the wrapper with one line naming it.
"""

from __future__ import annotations

import logging
import math
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from hermes.common.cli_env import HermesParser
from hermes.deploy.links import Link, LinkError, parse_link
from hermes.deploy.netlab import tbf_args

log = logging.getLogger(__name__)

PROG = "python -m hermes.deploy.tc_link"
IFNAMSIZ = 15  # interface names: 15 characters and the NUL


class TcLinkError(RuntimeError):
    """The link cannot be applied; the message is one line that names what is missing."""


class NetemMissing(TcLinkError):
    """The kernel has no netem qdisc."""


@dataclass(frozen=True)
class Result:
    """What a run of ``tc`` or ``ip`` answered."""

    returncode: int
    stderr: str


Runner = Callable[[list[str]], Result]


def run_command(cmd: list[str]) -> Result:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30)
    except FileNotFoundError:
        raise TcLinkError(f"iproute2 is missing: no `{cmd[0]}` on PATH; install iproute2 in the image "
                          "(apt-get install iproute2)") from None
    return Result(done.returncode, (done.stderr or done.stdout).strip())


def ifb_name(dev: str) -> str:
    return f"ifb-{dev}"[:IFNAMSIZ]


def netem_limit(bps: float | None, delay: float) -> int:
    """netem's queue in packets: twice what the link carries in one delay (MTU packets), at least the default 1000.

    netem holds every packet for the whole delay; a full queue drops, and the
    default 1000 packets is under 1 s of a 10 Mbit/s link at 1500 bytes but
    too few for a fast link with a long RTT. Unshaped: as if 1 Gbit/s.
    """
    rate = bps if bps is not None else 1e9
    return max(1000, 2 * math.ceil(rate / 8 * delay / 1500))


def _direction(dev: str, bps: float | None, delay: float, netem: bool) -> list[list[str]]:
    """The qdiscs that shape ``dev``'s egress: netem (delay) with tbf (rate) below it, or tbf alone."""
    if netem and delay > 0:
        cmds = [["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
                 "delay", f"{round(delay * 1e6)}us", "limit", str(netem_limit(bps, delay))]]
        if bps is not None:
            cmds.append(["tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf_args(bps)])
        return cmds
    if bps is not None:
        return [["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", *tbf_args(bps)]]
    return []


def plan(link: Link, dev: str, *, netem: bool) -> list[list[str]]:
    """The ``tc``/``ip`` commands that shape ``dev`` as ``link``, in order (empty: nothing to shape).

    ``netem`` False: rates only (a kernel without netem); the delay is dropped.
    """
    delay = link.rtt / 2
    cmds = _direction(dev, link.up_bps, delay, netem)
    ifb = ifb_name(dev)
    down = _direction(ifb, link.down_bps, delay, netem)
    if down:
        # The ifb is shaped before anything is redirected to it.
        cmds += [["ip", "link", "add", ifb, "type", "ifb"], ["ip", "link", "set", ifb, "up"], *down,
                 ["tc", "qdisc", "add", "dev", dev, "handle", "ffff:", "ingress"],
                 ["tc", "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "u32",
                  "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", ifb]]
    return cmds


def reset_plan(dev: str) -> list[list[str]]:
    """Undo a previous run (their failures are expected and ignored: there may be nothing to undo)."""
    return [["tc", "qdisc", "del", "dev", dev, "root"], ["tc", "qdisc", "del", "dev", dev, "ingress"],
            ["ip", "link", "del", ifb_name(dev)]]


def _failure(cmd: list[str], res: Result) -> TcLinkError:
    text = res.stderr.splitlines()[0] if res.stderr else f"exit status {res.returncode}"
    if "Operation not permitted" in res.stderr:
        return TcLinkError(f"{' '.join(cmd[:3])}: operation not permitted; the container needs "
                           "cap_add: [NET_ADMIN], and the wrapper must start as root (--user drops to the agent's user)")
    if "netem" in cmd and "unknown" in res.stderr.lower():
        return NetemMissing("the kernel has no netem qdisc (sch_netem)")
    if "ifb" in cmd and "unknown device type" in res.stderr.lower():
        return TcLinkError("the kernel has no ifb device (CONFIG_IFB; on the host: modprobe ifb), "
                           "so the download cannot be shaped")
    return TcLinkError(f"`{' '.join(cmd)}` failed: {text}")


def _execute(cmds: list[list[str]], runner: Runner) -> None:
    for cmd in cmds:
        res = runner(cmd)
        if res.returncode != 0:
            raise _failure(cmd, res)
        log.info("applied: %s", " ".join(cmd))


def _mbit(bps: float | None) -> str:
    return "unshaped" if bps is None else f"{bps / 1e6:g} Mbit/s"


def apply(link: Link, dev: str, *, strict: bool = False, runner: Runner = run_command) -> bool:
    """Shape ``dev`` as ``link``; True when the delay was applied too (netem), False when rates only."""
    if not link.shaped:
        log.info("link %s on %s: unshaped, nothing applied", link.name, dev)
        return True
    for cmd in reset_plan(dev):
        runner(cmd)
    netem = link.rtt > 0
    try:
        _execute(plan(link, dev, netem=netem), runner)
    except NetemMissing as exc:
        for cmd in reset_plan(dev):
            runner(cmd)
        if strict:
            raise TcLinkError(f"{exc}, so the {link.rtt * 1e3:g} ms round trip of link {link.name} cannot be "
                              "applied and --strict was given; on the host: modprobe sch_netem") from None
        log.warning("link %s on %s: the kernel has no netem, so the %g ms round-trip delay is NOT applied, "
                    "rates only (tbf); on the host: modprobe sch_netem; --strict (HERMES_LINK_STRICT=1) "
                    "makes this an error",
                    link.name, dev, link.rtt * 1e3)
        netem = False
        _execute(plan(link, dev, netem=False), runner)
    log.info("link %s on %s: upload %s (egress tbf), download %s (ingress via %s, tbf), delay %s",
             link.name, dev, _mbit(link.up_bps), _mbit(link.down_bps), ifb_name(dev),
             f"{link.rtt * 1e3 / 2:g} ms each way (netem)" if netem else
             ("none" if link.rtt == 0 else "NOT applied (no netem)"))
    return netem or link.rtt == 0


def default_dev(runner: Callable[[list[str]], str] | None = None) -> str:
    """The interface of the default route (a container's eth0), else the only one that is not loopback."""
    def read(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30).stdout
        except FileNotFoundError:
            raise TcLinkError("iproute2 is missing: no `ip` on PATH; install iproute2 in the image "
                              "(apt-get install iproute2)") from None

    out = (runner or read)(["ip", "-o", "route", "show", "default"])
    for line in out.splitlines():
        words = line.split()
        if "dev" in words[:-1]:
            return words[words.index("dev") + 1]
    links = [w[1].split("@")[0] for line in (runner or read)(["ip", "-o", "link", "show"]).splitlines()
             if len(w := line.split(": ")) > 1 and w[1].split("@")[0] != "lo"]
    if len(links) == 1:
        return links[0]
    raise TcLinkError(f"no default route and {len(links)} interfaces ({', '.join(links) or 'none'}): give --dev")


def drop_to(user: str) -> None:
    """Become ``user`` (groups, gid, uid; HOME) when root; the capabilities go with root."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise TcLinkError(f"--user {user}: no such user") from None
    if os.geteuid() != 0:
        if os.geteuid() != pw.pw_uid:
            raise TcLinkError(f"--user {user}: cannot switch users when not running as root")
        return
    os.setgroups(os.getgrouplist(user, pw.pw_gid))
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    os.environ.update(HOME=pw.pw_dir, USER=user, LOGNAME=user)


def build_parser() -> HermesParser:
    p = HermesParser(prog=PROG, env_names={"link": "HERMES_LINK", "dev": "HERMES_LINK_DEV", "strict": "HERMES_LINK_STRICT",
                                           "user": "HERMES_LINK_USER", "dry_run": None},
                     description="Shape this container's interface as a link with tc, then exec the command after --.")
    p.add_argument("--link", default="lan", help="lan, wifi, lte, constrained or custom:UP/DOWN/RTT (default lan)")
    p.add_argument("--dev", help="interface to shape (default: the default route's)")
    p.add_argument("--strict", action="store_true", help="fail when the kernel cannot delay (no netem)")
    p.add_argument("--user", help="run the command as this user (the wrapper itself must start as root)")
    p.add_argument("--dry-run", action="store_true", help="print the commands (for a kernel with netem; --dev default eth0) and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = build_parser().parse_args(own)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="tc_link: %(levelname)s %(message)s")
    try:
        link = parse_link(args.link)
    except LinkError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.dry_run:
            for cmd in plan(link, args.dev or "eth0", netem=True):
                print(" ".join(cmd))
            return 0
        missing = [t for t in ("tc", "ip") if shutil.which(t) is None]
        if missing and link.shaped:
            raise TcLinkError(f"iproute2 is missing: no {' or '.join(f'`{t}`' for t in missing)} on PATH; "
                              "install iproute2 in the image (apt-get install iproute2)")
        if link.shaped:
            apply(link, args.dev or default_dev(), strict=args.strict)
        else:
            log.info("link %s: unshaped, nothing applied", link.name)
        if args.user:
            drop_to(args.user)
        if not command:
            return 0
        log.info("running %s", " ".join(command))
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            raise TcLinkError(f"cannot run {command[0]}: {exc.strerror}") from None
    except TcLinkError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    return 0  # not reached: execvp replaced the process


if __name__ == "__main__":
    sys.exit(main())
