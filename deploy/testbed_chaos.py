"""``hermes-testbed --chaos``: the schedule of faults a testbed run injects.

``--chaos`` injects faults on a schedule: SIGKILL an agent (and start it
again later), or SIGKILL the server and restart it with ``--resume`` from
the run's checkpoints. Each step fires at a time after the agents started
(``@SECONDS``) or once the model reaches a version (``@vN``); the testbed
(:meth:`hermes.deploy.testbed.Testbed.run_chaos`) fires them in the order
given, and its summary records what was done and the model version before
the kill and after the resume.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChaosStep:
    at: float  # seconds after the agents started, or
    action: str  # kill-agent | restart-agent | kill-server
    agent: int = 0  # 1-based index for the agent actions
    at_version: int | None = None  # ... once the model reaches this version (``@vN``)

    def due(self, elapsed: float, version: int | None) -> bool:
        if self.at_version is not None:
            return version is not None and version >= self.at_version
        return elapsed >= self.at


_WHEN = r"@(v\d+|[0-9.]+)$"
_CHAOS = re.compile(r"^(kill-agent|restart-agent):(\d+)" + _WHEN + r"|^(kill-server)" + _WHEN)


def _when(text: str) -> dict[str, Any]:
    return {"at": 0.0, "at_version": int(text[1:])} if text.startswith("v") else {"at": float(text)}


def parse_chaos(items: list[str], clients: int) -> list[ChaosStep]:
    steps = []
    for item in items:
        m = _CHAOS.match(item.strip())
        if not m:
            raise ValueError(f"{item!r}: expected kill-agent:N@WHEN, restart-agent:N@WHEN or kill-server@WHEN, "
                             "WHEN being seconds after the agents started or vN (once the model reaches version N)")
        if m.group(1):
            n = int(m.group(2))
            if not 1 <= n <= clients:
                raise ValueError(f"{item!r}: agent {n} not in 1..{clients}")
            steps.append(ChaosStep(action=m.group(1), agent=n, **_when(m.group(3))))
        else:
            steps.append(ChaosStep(action="kill-server", **_when(m.group(5))))
    return steps

