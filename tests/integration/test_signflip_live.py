"""Sign flip under the norm bound, live (issue 29).

Real ``hermes-server`` with its default screening, three honest ``hermes-client``
agents, and an attacker with only the join token: it watches the global model,
and every few honest updates pushes the reverse of the honest global step scaled
to k times the median accepted norm (which ``/v1/status`` publishes). Under the
norm bound alone (32 x the median), asp went 0.972 -> 0.469 at k = 10 and at
k = 30 the honest workers were quarantined instead of the attacker.

The attacker keeps attacking, one flip every EVERY honest pushes, until the run reaches the
target at a model made after its first flip (benchmarks/attack_matrix.py times it against k = 0, the
same worker pushing zeros at the same pace). No honest worker may be refused or quarantined, and the attacker's pushes at k >= 10 must be
refused, folded clipped to 4x the median norm or down-weighted to the median norm (at k = 3 an update is
folded as it is: under the 4x gate nothing is judged).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import ADMIN_TOKEN, JOIN_TOKEN, kill_agents, running_server, wait_for
from tests.integration.test_attack_live import Attacker, _events, start_attack

pytestmark = pytest.mark.integration

TARGET = 0.8
HANG_S = 240.0
# Honest updates between two attacks: the attacker makes ~10% of the pushes (issue 29: 6-15%).
EVERY = 8
PACE_S = 15.0


class SignFlipper(Attacker):
    """``attacks`` flips, or with ``attacks=None`` one flip every EVERY honest pushes until stopped (the matrix's
    attacker, which attacks for the whole run). k = 0 pushes zeros at the same pace: the honest run's idle worker."""

    def __init__(self, srv: Any, k: float, attacks: int | None) -> None:
        super().__init__(srv)
        self.k = k
        self.attacks = attacks
        self.attack_started = threading.Event()
        self.attack_version = 0  # the model version when the first flip was pushed

    def honest_pushes(self) -> int:
        """Pushes the server received from the other workers: the pace of the attack in honest updates, not in
        model versions (a fedbuff version is K = 10 pushes, a bsp round one per worker)."""
        return sum(w["pushes"] for w in self.srv.get_json("/v1/workers") if w["id"] != self.w.id)

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
            done = 0
            while not self.stop.is_set() and (self.attacks is None or done < self.attacks):
                since = self.honest_pushes()
                self.push(f"flip x{self.k:g}", -self.scaled(self.k))  # k = 0: zeros
                done += 1
                if done == 1:  # the attack began: the target counts only for a model made after the first flip
                    self.attack_version = self.srv.healthz()["model_version"]
                    self.attack_started.set()
                if barrier:
                    # A barrier waits for every worker each round: zeros in the rounds between flips.
                    while not self.stop.is_set() and self.honest_pushes() < since + EVERY:
                        self.push("idle", torch.zeros(self.w.numel))
                    continue
                # EVERY honest pushes between attacks, or PACE_S when they are rare (hermes' gate).
                t = time.monotonic()
                wait_for(lambda n=since, t=t: self.heartbeat() >= 0 and self.honest_pushes() >= n + EVERY
                         or time.monotonic() - t > PACE_S or self.stop.is_set(), HANG_S,
                         "honest pushes between attacks", interval=0.2)
        except BaseException as exc:  # the test reports it
            self.error = exc
        finally:
            first_push_done.set()
            self.attack_started.set()
            self.srv.http.post(f"{self.srv.url}/v1/workers/{self.w.id}/leave", headers={"X-Hermes-Token": self.w.token})



def attacked_throughout_reach(srv: Any, attacker: SignFlipper, names: list[str], tmp_path: Path, what: str,
                              target: float = TARGET, hang_s: float = HANG_S) -> tuple[dict[str, Any], float, int]:
    """Start the attacker, then the honest agents; the attacker attacks until the run reaches ``target`` (at an
    evaluation of a model made after its first attack); stop the run. The status at the target, the seconds from
    the agents' start and the attacker's pushes by then; every honest agent exited 0, the attacker raised nothing.

    Attacked (k > 0) and honest (k = 0, zeros at the same pace) runs are timed alike: same start, same target,
    same evaluation cadence, and the attack's effect is in every model evaluated after it began."""
    thread, t0, agents = start_attack(srv, attacker, names, tmp_path)
    try:
        assert attacker.attack_started.wait(hang_s), "the attack never started"
        assert attacker.error is None, (attacker.error, attacker.replies)

        def reached() -> dict[str, Any] | None:
            s = srv.get_json("/v1/status")
            ev = s["evaluation"]
            return s if ev and ev["version"] > attacker.attack_version and ev["accuracy"] >= target else None

        status = wait_for(reached, hang_s, what)
        seconds = time.monotonic() - t0
        pushed = len(attacker.replies)
        attacker.stop.set()
        r = srv.http.post(srv.url + "/v1/stop", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert r.status_code == 200, r.text
        thread.join(timeout=hang_s)
        assert not thread.is_alive(), ("the attacker did not stop", attacker.replies)
        codes = [a.wait(timeout=60) for a in agents]
    finally:
        attacker.stop.set()
        kill_agents(agents)
    logs = [(tmp_path / f"{n}.log").read_text(errors="replace") for n in names]
    assert codes == [0] * len(names), [log[-2000:] for log in logs]
    assert attacker.error is None, (attacker.error, attacker.replies)
    return status, seconds, pushed


def _signflip_run(tmp_path: Path, preset: str, k: float, attacks: int | None = None,
                  honest: int = 3, env: dict[str, str | None] | None = None) -> dict[str, Any]:
    """The attacker flips for the whole run (``attacks=None``); k = 0: it pushes zeros at the same pace (the
    honest time to target, for the 1.5x comparison). ``env``: the server's (a screening setting to compare)."""
    names = [f"honest-{i}" for i in range(honest)]
    with running_server(tmp_path / "server", "--preset", preset, sets=("eval_interval_seconds=0.5",),
                        env=env) as srv:
        attacker = SignFlipper(srv, k, attacks)
        status, seconds, pushed = attacked_throughout_reach(srv, attacker, names, tmp_path,
                                                            f"{preset} to reach {TARGET} under the sign flips")
        flips = [r for r in attacker.replies[:pushed] if r[0].startswith("flip")]
        assert flips, attacker.replies
        # The screening's numbers (clipped, median norm ...) are for cluster members: read with the join token.
        r = srv.http.get(srv.url + "/v1/status", headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
        assert r.status_code == 200, r.text
        screening = r.json()["screening"]
        every_flip = [r for r in attacker.replies if r[0].startswith("flip")]
        if k >= 10:
            # Refused, or made harmless: folded clipped to 4x the median norm (a flip whose reversed step
            # happened to agree with the descent direction) or down-weighted to the median norm (one that
            # failed a test on less than the evidence a refusal needs). No share of refusals is asserted:
            # the attack goes on for the whole run, and a clipped flip weighs no more than a 4x honest update.
            applied = sum(r[1] == "applied" for r in every_flip)
            downweighted = sum(e["worker"] == attacker.w.id for e in _events(srv, "update_downweighted"))
            assert applied <= screening["clipped"] + downweighted, (every_flip, screening)
        # No honest worker refused by direction, none quarantined.
        refused = {e["worker"] for e in _events(srv, "update_screened_out")}
        assert refused <= {attacker.w.id}, (refused, screening)
        assert set(screening["quarantined"]) <= {attacker.w.id}, screening
        honest_pushes = sum(w["pushes"] for w in srv.get_json("/v1/workers") if w["id"] != attacker.w.id)
        result = {"preset": preset, "k": k, "seconds_to_target": round(seconds, 1),
                  "flips_before_target": len(flips),
                  "flips_applied_before_target": sum(r[1] == "applied" for r in flips),
                  "flips": len(every_flip), "flips_applied": sum(r[1] == "applied" for r in every_flip),
                  "honest_pushes": honest_pushes, "refusals": screening["refusals"],
                  "clipped": screening["clipped"], "accuracy": status["evaluation"]["accuracy"]}
        (tmp_path / "signflip.json").write_text(json.dumps(result))
        print(json.dumps(result))
        return result


# asp at k = 30 in the default suite (the case that quarantined every honest worker); the rest with -m slow.
CASES = [(p, k) for p in ("asp", "fedasync", "fedbuff", "bsp", "hermes") for k in (0, 3, 10, 30)]


@pytest.mark.parametrize("preset, k", [
    pytest.param(p, k, marks=() if (p, k) == ("asp", 30) else pytest.mark.slow) for p, k in CASES])
def test_sign_flip_is_refused_or_harmless(tmp_path, preset, k):
    _signflip_run(tmp_path, preset, k)
