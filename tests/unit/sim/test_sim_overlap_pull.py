"""overlap_pull in the simulator (issue 31): a device whose gate holds asks for the newer model on its overlapped
push's channel, as the agent does (client.topology.PushPull._pull_held), and rebases on it."""

from __future__ import annotations

from hermes.common.config import build_config
from hermes.common.wire import MsgType
from hermes.sim.links import transfer_seconds
from hermes.sim.run import Simulation, deterministic_view
from tests.unit.sim.test_sim_core import hl8


def _run(tmp_path, name: str, **config):
    cfg = build_config("hermes", dataset="digits", model="mlp", seed=0, target_accuracy=0.99, max_seconds=1.5,
                       **config)
    sim = Simulation(cfg, hl8(4), out=tmp_path / name, transfer=transfer_seconds, population="hl8")
    sent: list[tuple[MsgType, str]] = []
    request = sim.driver.request

    async def recording(dev, type_, body, **kw):
        sent.append((type_, kw.get("channel", "main")))
        return await request(dev, type_, body, **kw)

    sim.driver.request = recording  # type: ignore[method-assign]
    return sim.run(), sent


def test_a_held_device_pulls_in_the_background_only_with_overlap_pull(tmp_path):
    off, sent_off = _run(tmp_path, "off")
    on, sent_on = _run(tmp_path, "on", overlap_pull=True)
    held_pulls = [t for t in sent_on if t == (MsgType.PULL_MODEL, "overlap")]
    # Without it the overlap channel carries pushes only; with it the gate's held cycles pull there too.
    assert (MsgType.PULL_MODEL, "overlap") not in sent_off
    assert held_pulls and (MsgType.PUSH_UPDATE, "overlap") in sent_on
    assert sum(w["device"]["gate_skips"] for w in on["workers"]) >= len(held_pulls)
    assert deterministic_view(off) != deterministic_view(on)
