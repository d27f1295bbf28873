"""Sign flip under the norm bound, live (issue 29).

Real ``hermes-server`` with its default screening, three honest ``hermes-client``
agents, and an attacker with only the join token: it watches the global model,
and every few honest updates pushes the reverse of the honest global step scaled
to k times the median accepted norm (which ``/v1/status`` publishes). Under the
norm bound alone (32 x the median), asp went 0.972 -> 0.469 at k = 10 and at
k = 30 the honest workers were quarantined instead of the attacker.

The run must reach the target after the attack, no honest worker may be
refused by direction or quarantined, and the attacker's pushes at k >= 10 must be
refused or folded clipped to 4x the median norm, most of them refused (at k = 3 an update may be folded
as it is: it is harmless in size, three honest steps at most, and the target is still
reached).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import JOIN_TOKEN, running_server, wait_for

# attack_then_reach is imported from here too (test_robust_async_live).
from tests.integration.test_attack_live import Attacker, _events, attack_then_reach

pytestmark = pytest.mark.integration

TARGET = 0.8
HANG_S = 240.0
# Honest updates between two attacks: the attacker makes ~10% of the pushes (issue 29: 6-15%).
EVERY = 8
PACE_S = 15.0


class SignFlipper(Attacker):
    def __init__(self, srv: Any, k: float, attacks: int) -> None:
        super().__init__(srv)
        self.k = k
        self.attacks = attacks

    def idle_until(self, predicate: Any, timeout: float) -> None:
        """Push zeros until ``predicate()``; honest agents may take a while to start on a loaded machine."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline or self.stop.is_set():
                raise AssertionError(f"attacker: gave up waiting after {timeout}s")
            self.push("idle", torch.zeros(self.w.numel))
            if self.w.run_config["sync"] != "bsp":
                version = self.srv.healthz()["model_version"]
                wait_for(lambda v=version: self.heartbeat() > v or self.stop.is_set(), HANG_S, "an honest push")

    def run(self, *, first_push_done: threading.Event) -> None:  # type: ignore[override]
        try:
            _, self.w0 = self.pull()
            first_push_done.set()
            barrier = self.w.run_config["sync"] == "bsp"
            self.idle_until(lambda: (self.screening()["history"] or 0) >= 4 and self.direction is not None, HANG_S)
            for _ in range(self.attacks):
                if self.stop.is_set():
                    break
                self.push(f"flip x{self.k:g}", -self.scaled(self.k))
                if barrier:  # a barrier waits for every worker each round: it pushes every round
                    continue
                # EVERY honest updates between attacks, or PACE_S when they are rare (hermes' gate).
                version, since = self.srv.healthz()["model_version"], time.monotonic()
                wait_for(lambda v=version, t=since: self.heartbeat() >= v + EVERY or time.monotonic() - t > PACE_S
                         or self.stop.is_set(), HANG_S, "honest pushes between attacks")
        except BaseException as exc:  # the test reports it
            self.error = exc
        finally:
            first_push_done.set()
            self.srv.http.post(f"{self.srv.url}/v1/workers/{self.w.id}/leave", headers={"X-Hermes-Token": self.w.token})



def _signflip_run(tmp_path: Path, preset: str, k: float, attacks: int = 6, honest: int = 3) -> dict[str, Any]:
    """k = 0: the same run with the attacker only idling (the honest time to target, for the 1.5x comparison)."""
    attacks = attacks if k > 0 else 0
    names = [f"honest-{i}" for i in range(honest)]
    with running_server(tmp_path / "server", "--preset", preset, sets=("eval_interval_seconds=0.5",)) as srv:
        attacker = SignFlipper(srv, k, attacks)
        status, seconds = attack_then_reach(srv, attacker, names, tmp_path,
                                            f"{preset} to reach {TARGET} after the sign flips")
        flips = [r for r in attacker.replies if r[0].startswith("flip")]
        assert flips or k == 0, attacker.replies
        # The screening's numbers (clipped, median norm ...) are for cluster members: read with the join token.
        r = srv.http.get(srv.url + "/v1/status", headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
        assert r.status_code == 200, r.text
        screening = r.json()["screening"]
        if k >= 10:
            # Refused, or made harmless: folded clipped to 4x the median norm (a flip whose reversed
            # step happened to agree with the descent direction and not to raise the probe loss).
            applied = sum(r[1] == "applied" for r in flips)
            assert applied <= screening["clipped"], (flips, screening)
            assert applied <= len(flips) // 2, flips
        # No honest worker refused by direction, none quarantined.
        refused = {e["worker"] for e in _events(srv, "update_screened_out")}
        assert refused <= {attacker.w.id}, (refused, screening)
        assert set(screening["quarantined"]) <= {attacker.w.id}, screening
        result = {"preset": preset, "k": k, "seconds_to_target": round(seconds, 1), "flips": len(flips),
                  "flips_applied": sum(r[1] == "applied" for r in flips), "refusals": screening["refusals"],
                  "accuracy": status["evaluation"]["accuracy"]}
        (tmp_path / "signflip.json").write_text(json.dumps(result))
        print(json.dumps(result))
        return result


# asp at k = 30 in the default suite (the case that quarantined every honest worker); the rest with -m slow.
CASES = [(p, k) for p in ("asp", "fedasync", "fedbuff", "bsp", "hermes") for k in (0, 3, 10, 30)]


@pytest.mark.parametrize("preset, k", [
    pytest.param(p, k, marks=() if (p, k) == ("asp", 30) else pytest.mark.slow) for p, k in CASES])
def test_sign_flip_is_refused_or_harmless(tmp_path, preset, k):
    _signflip_run(tmp_path, preset, k)
