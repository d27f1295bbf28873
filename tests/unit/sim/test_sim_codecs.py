"""compression.push / compression.pull in the simulator: the agent's codecs, per device, with error feedback; the
encoded bytes on the links (issue 27: int8 and top-k runs once gave the same trajectory as none)."""

from __future__ import annotations

import torch

from hermes.client.topology import update_of
from hermes.client.trainer import CycleResult
from hermes.common.codecs import ErrorFeedback, TopKCodec
from hermes.common.codecs import decode as decode_codec
from hermes.common.config import build_config
from hermes.common.wire import MsgType
from hermes.sim.links import transfer_seconds
from hermes.sim.memory import own_bytes
from hermes.sim.run import Simulation, deterministic_view
from tests.unit.sim.test_sim_core import hl8


def _sim(tmp_path, name: str, **config):
    cfg = build_config("asp", dataset="digits", model="mlp", seed=0, target_accuracy=0.99, max_seconds=1.5, **config)
    return Simulation(cfg, hl8(4), out=tmp_path / name, transfer=transfer_seconds, population="hl8")


def _sizes(sim: Simulation) -> dict[str, list[tuple[int, int]]]:
    """Every push's (payload bytes, bytes on the device's uplink), and every pull's (0, bytes on its downlink)."""
    sizes: dict[str, list[tuple[int, int]]] = {"push": [], "pull": []}
    request, carry = sim.driver.request, sim.driver.carry
    current: dict[str, tuple[str, int]] = {}

    async def counting_request(dev, type_, body, *, payload=None, **kw):
        if type_ in (MsgType.PUSH_UPDATE, MsgType.PULL_MODEL):
            kind = "push" if type_ is MsgType.PUSH_UPDATE else "pull"
            current[dev.name] = (kind, 0 if payload is None else payload.numel() * payload.element_size())
        return await request(dev, type_, body, payload=payload, **kw)

    async def counting_carry(dev, nbytes, direction):
        kind, payload = current.get(dev.name, ("", 0))
        if (kind, direction) in (("push", "up"), ("pull", "down")):
            sizes[kind].append((payload, nbytes))
            del current[dev.name]
        await carry(dev, nbytes, direction)

    sim.driver.request, sim.driver.carry = counting_request, counting_carry  # type: ignore[method-assign]
    return sizes


def test_a_topk_push_run_differs_from_none_and_charges_the_codecs_bytes(tmp_path):
    plain = _sim(tmp_path, "none")
    plain_sizes = _sizes(plain)["push"]
    none = plain.run()
    sim = _sim(tmp_path, "topk", compression={"push": "topk"}, topk={"ratio": 0.05})
    sizes = _sizes(sim)["push"]
    topk = sim.run()
    assert deterministic_view(none) != deterministic_view(topk)
    numel = sim.engine.spec.numel
    # The codec's real encoded size: k = ceil(0.05 n) (index, value) pairs, 8 bytes each; the header beside it.
    want = TopKCodec.expected_bytes(TopKCodec(0.05).encode(torch.ones(numel), sim.engine.spec.shapes).spec,
                                    sim.engine.spec.shapes)
    assert sizes and plain_sizes
    assert {p for p, _ in sizes} == {want}
    assert {p for p, _ in plain_sizes} == {4 * numel}
    header = max(up - p for p, up in plain_sizes)
    assert all(want < up <= want + header + 256 for _, up in sizes), (sizes[:3], header)
    assert topk["model_updates"] > 0 and none["model_updates"] > 0


def test_int8_pushes_and_pulls_differ_from_topk_and_the_same_seed_repeats(tmp_path):
    sims = [_sim(tmp_path, n, compression={"push": "int8", "pull": "int8"}) for n in ("a", "b")]
    sizes = _sizes(sims[0])
    runs = [s.run() for s in sims]
    topk = _sim(tmp_path, "topk", compression={"push": "topk"}).run()
    assert deterministic_view(runs[0]) == deterministic_view(runs[1])
    assert deterministic_view(runs[0]) != deterministic_view(topk)
    numel = sims[0].engine.spec.numel
    int8_bytes = numel + 4 * -(-numel // 1024)  # a byte per element and an fp32 scale per 1,024 (int8.chunk)
    assert {p for p, _ in sizes["push"]} == {int8_bytes}
    # The model comes down quantised too: the pulls that carry one are about a quarter of fp32's size.
    models = [down for _, down in sizes["pull"] if down > numel]
    assert models and all(int8_bytes < down < int8_bytes + 2048 for down in models), models[:3]


def test_the_device_step_encodes_with_its_own_codec_and_keeps_what_it_dropped(tmp_path):
    sim = _sim(tmp_path, "unit", compression={"push": "topk"}, topk={"ratio": 0.1})
    first, second = sim.devices[0], sim.devices[1]
    shapes = sim.engine.spec.shapes
    reference = torch.zeros(sim.engine.spec.numel)
    first.local = torch.linspace(-1.0, 1.0, reference.numel())
    result = CycleResult(samples=32, steps=1, loss=0.5, compute_seconds=0.1)
    local, delta, update = update_of(first.job(), reference, result, None)  # type: ignore[arg-type]
    assert update.codec is not None and update.codec.name == "topk"
    assert delta.dtype == torch.uint8 and delta.numel() == TopKCodec.expected_bytes(update.codec, shapes)
    codec = first.push_codec
    assert isinstance(codec, ErrorFeedback) and codec.residual is not None
    # EF-SGD (Karimireddy et al. 2019, Alg. 2): what was sent plus what was kept is the true change.
    sent = decode_codec(delta, update.codec, shapes)
    assert torch.allclose(sent + codec.residual, local - reference)
    assert int((sent != 0).sum()) == update.codec.k
    # The residual is the device's own memory (sim.memory's count of what a device holds).
    assert own_bytes(first)["codec"] == 4 * reference.numel() and own_bytes(second)["codec"] == 0
    # Each device its own codec (an agent's is its process's): another device's residual starts empty.
    second.local = first.local.clone()
    second.job()
    assert second.push_codec is not codec and isinstance(second.push_codec, ErrorFeedback)
    assert second.push_codec.residual is None
    # The next push of the first device carries the dropped part along.
    _, delta2, update2 = update_of(first.job(), reference, result, None)  # type: ignore[arg-type]
    assert update2.codec is not None
    sent2 = decode_codec(delta2, update2.codec, shapes)
    assert not torch.equal(sent2, sent)
