"""Allocator state across a server checkpoint: ``state_dict`` / ``load_state_dict`` for every policy.

A state goes through ``json.dumps`` into the checkpoint's metadata and comes
back through ``json.loads`` when the server resumes (``server/checkpoint.py``).
What must hold: the restored allocator hands out the same workloads and makes
the same decisions from then on as the one that was saved; agents that
register again (``join`` of a known worker) keep their workloads; a worker
that left (``forget``) and joins again starts like a new one; a state that
another policy, or other bounds, wrote is refused with ``AllocatorStateError``
and changes nothing.
"""

from __future__ import annotations

import json
import math

import pytest

from hermes.common.config import build_config
from hermes.common.policies.allocation import AllocatorStateError, CycleObservation, Resize, Workload

# OmniLearn Table I, HL8: cores of the 4 workers; speeds proportional, 1000 samples/s for 32 cores.
CORES = {"w1": 6, "w2": 6, "w3": 4, "w4": 32}
HL8 = {w: 1000.0 * c / 32 for w, c in CORES.items()}
# After the checkpoint the cluster changes (OmniLearn's dynamic heterogeneity), so the
# restored allocators have real decisions left to make.
SHIFTED = {"w1": 190.0, "w2": 250.0, "w3": 600.0, "w4": 300.0}
EPOCH = 2048  # samples per data epoch: 4 rounds of 4 workers x 128 samples

# (preset, overrides): one per allocation policy, two for pcontrol (global batch each round / per epoch without).
POLICIES = {
    "uniform": ("bsp", {}),
    "dual-search": ("hermes", {"shard_size": 16}),
    "static": ("variable-batching", {}),
    "pcontrol-bsp": ("dynamic-batching", {}),
    "pcontrol-asp": ("omnilearn-asp", {}),
    "adaptive": ("task-allocation", {}),
    "partition": ("dp-sgd", {}),
}


def build(policy: str, **extra):
    preset, overrides = POLICIES[policy]
    return build_config(preset, **{**overrides, **extra}).build_policy("allocation", dss_max=10_000, epoch_samples=EPOCH)


def through_json(state: dict) -> dict:
    # allow_nan=False: the checkpoint is plain JSON, not Python's extension of it.
    return json.loads(json.dumps(state, allow_nan=False))


def join_all(alloc, workers=CORES) -> None:
    for w in workers:
        alloc.join(w, float(CORES[w]))
        alloc.rebalance()


def drive(allocs: list, speeds: dict[str, float], rounds: int) -> list[dict[str, Resize]]:
    """Rounds of every worker running its current workload, fed to every allocator alike.

    Asserts that all of them hand out the same workloads and answer every
    rebalance alike; returns the first allocator's answers.
    """
    decisions = []
    for _ in range(rounds):
        for w in sorted(speeds):
            wls = [a.workload(w) for a in allocs]
            assert all(wl == wls[0] for wl in wls), (w, wls)
            wl = wls[0]
            seconds = wl.dss / speeds[w] + 0.002 * math.ceil(wl.dss / wl.effective_batch_size)
            for a in allocs:
                a.observe(w, CycleObservation(wl.dss, wl.batch_size, seconds, wl.accumulation))
            answers = [a.rebalance() for a in allocs]
            assert all(ans == answers[0] for ans in answers), (w, answers)
            decisions.append(answers[0])
    return decisions


def trained(policy: str):
    """An allocator after joins, memory caps and rounds of measurements: workloads moved, mid-flight."""
    a = build(policy)
    join_all(a)
    a.set_memory_limit("w4", 512)
    a.set_batch_limit("w4", 80)
    a.rebalance()
    moved = [r for d in drive([a], HL8, 5) for r in d.values()]
    if policy == "uniform":
        assert not moved
    elif policy != "static":  # static moves on membership only: its split is set at join
        assert any(r.kind in ("slow", "fast") for r in moved), policy
    return a


def workloads(alloc) -> dict[str, Workload]:
    return {w: alloc.workload(w) for w in CORES}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_restored_allocator_has_the_same_workloads_and_makes_the_same_decisions(policy):
    a = trained(policy)
    state = through_json(a.state_dict())
    assert state["policy"] == ("pcontrol" if policy.startswith("pcontrol") else policy)
    b = build(policy)
    b.load_state_dict(state)
    assert workloads(b) == workloads(a)
    if policy not in ("uniform", "static"):
        assert workloads(a) != {w: build(policy).workload(w) for w in CORES}  # not the fresh start
    assert through_json(b.state_dict()) == state
    # The same measurements and membership changes from here on: the same answers, resizes included.
    after = drive([a, b], SHIFTED, 8)
    speeds = {**SHIFTED, "w5": 400.0}
    assert a.join("w5", 8.0) is None and b.join("w5", 8.0) is None
    after.append(a.rebalance())
    assert b.rebalance() == after[-1]
    after += drive([a, b], speeds, 4)
    a.forget("w1"), b.forget("w1")
    speeds.pop("w1")
    after.append(a.rebalance())
    assert b.rebalance() == after[-1]
    after += drive([a, b], speeds, 8)
    if policy != "uniform":
        assert any(after), f"{policy}: no decision left to compare after the restore"
    assert through_json(b.state_dict()) == through_json(a.state_dict())


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_restored_workers_registering_again_keep_their_workloads(policy):
    a = trained(policy)
    b = build(policy)
    b.load_state_dict(through_json(a.state_dict()))
    before = through_json(b.state_dict())
    # After a resume every agent registers again: the engine calls join, then
    # applies its memory caps again, then rebalances.
    for w in sorted(CORES):
        b.join(w, float(CORES[w]))
        b.set_memory_limit("w4", 512) if w == "w4" else None
        b.set_batch_limit("w4", 80) if w == "w4" else None
        assert through_json(b.state_dict()) == before, w
    assert workloads(b) == workloads(a)
    drive([a, b], SHIFTED, 12)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_join_of_a_known_worker_is_idempotent_without_a_restart_too(policy):
    a, b = trained(policy), trained(policy)
    a.join("w3", float(CORES["w3"]))
    assert a.rebalance() == {}
    drive([a, b], SHIFTED, 12)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_worker_that_left_and_joins_again_starts_like_a_new_one(policy):
    a = trained(policy)
    state = through_json(a.state_dict())
    b, c = build(policy), build(policy)
    b.load_state_dict(state)
    c.load_state_dict(state)
    restored_w3 = b.workload("w3")
    # b: w3 leaves and comes back; c: w3 leaves and a never-seen worker takes its place.
    b.forget("w3")
    c.forget("w3")
    assert b.rebalance() == c.rebalance()
    b.join("w3", float(CORES["w3"]))
    c.join("w3b", float(CORES["w3"]))  # sorts where w3 did: the same tie-breaks
    rb, rc = b.rebalance(), c.rebalance()
    rename = {"w3b": "w3"}
    assert rb == {rename.get(w, w): r for w, r in rc.items()}
    assert b.workload("w3") == c.workload("w3b")
    assert all(b.workload(w) == c.workload(w) for w in ("w1", "w2", "w4"))
    if policy in ("dual-search", "pcontrol-bsp", "pcontrol-asp", "partition"):
        assert b.workload("w3") != restored_w3  # its measured workload did not survive the leave
        assert b.workload("w3").batch_size == build_config(*POLICIES[policy][:1], **POLICIES[policy][1]).batch_size


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_another_policys_state_is_refused_and_changes_nothing(policy):
    b = trained(policy)
    before = through_json(b.state_dict())
    own = before["policy"]
    for other in sorted(POLICIES):
        foreign = through_json(build(other).state_dict())
        if foreign["policy"] == own:
            continue
        with pytest.raises(AllocatorStateError, match=f"policy {foreign['policy']!r}.*allocation is {own!r}"):
            b.load_state_dict(foreign)
    assert issubclass(AllocatorStateError, ValueError)
    assert through_json(b.state_dict()) == before


@pytest.mark.parametrize("policy", ["pcontrol-bsp", "static", "partition", "dual-search"])
def test_a_state_saved_with_other_bounds_is_refused(policy):
    state = through_json(trained(policy).state_dict())
    other = build(policy, b_max=64) if policy != "dual-search" else build(policy, mbs_max=128)
    fresh = through_json(other.state_dict())
    with pytest.raises(AllocatorStateError, match="other parameters: (b_max 96 -> 64|mbs_max 256 -> 128)"):
        other.load_state_dict(state)
    assert through_json(other.state_dict()) == fresh


@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"uniform"}))
def test_a_malformed_state_is_refused_and_changes_nothing(policy):
    state = through_json(trained(policy).state_dict())
    b = build(policy)
    join_all(b)
    before = through_json(b.state_dict())
    for broken in _broken_variants(state):
        with pytest.raises(AllocatorStateError, match="malformed|format|mapping"):
            b.load_state_dict(broken)
        assert through_json(b.state_dict()) == before


def _broken_variants(state: dict) -> list:
    body_keys = [k for k in state if k not in ("policy", "format", "params")]
    missing = {k: v for k, v in state.items() if k != body_keys[-1]}
    wrong_type = {**state, body_keys[0]: "not a map"}
    return [missing, wrong_type, {**state, "format": 99}, "not a state"]


def test_a_dual_search_state_from_before_states_were_stamped_still_loads():
    a = trained("dual-search")
    bare = through_json(a.sizer.state_dict())  # what older servers wrote into checkpoint.json
    b = build("dual-search")
    b.load_state_dict(bare)
    assert workloads(b) == workloads(a)


def _before_one_name(state: dict) -> dict:
    """``state`` as servers wrote it before the batch size had one name (issue 26)."""
    old = json.loads(json.dumps(state))
    params = old["params"]
    if "batch_size" in params:  # adaptive called it mbs, the per-step batch policies base
        params["mbs" if "w0" in params else "base"] = params.pop("batch_size")
    if "base_batch_size" in params:
        params["base_mbs"] = params.pop("base_batch_size")
    if "batches" in old:
        old["batches"]["batch"] = old["batches"].pop("batch_size_of")
    for st in (old.get("controller") or {}).get("workers", {}).values():
        st["batch"] = st.pop("batch_size")
    return old


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_state_written_before_the_batch_size_had_one_name_still_loads(policy):
    a = trained(policy)
    state = through_json(a.state_dict())
    old = _before_one_name(state)
    if policy != "uniform":
        assert old != state  # the old layout really differs
    b = build(policy)
    b.load_state_dict(old)
    assert workloads(b) == workloads(a)
    assert through_json(b.state_dict()) == state  # and is saved again in the new one
    assert drive([a, b], SHIFTED, 4) is not None  # the same decisions from here on (drive asserts it)


def test_epoch_clock_and_global_batch_survive_for_pcontrol():
    a = trained("pcontrol-bsp")
    b = build("pcontrol-bsp")
    b.load_state_dict(through_json(a.state_dict()))
    assert (b.clock.samples, b.clock.epoch) == (a.clock.samples, a.clock.epoch)
    assert b.ctl.global_batch == a.ctl.global_batch == sum(wl.batch_size for wl in workloads(a).values())
    assert b.ctl.adjustments == a.ctl.adjustments >= 1
    assert {w: b.ctl.b_max_of(w) for w in CORES} == {w: a.ctl.b_max_of(w) for w in CORES}
    assert b.ctl.b_max_of("w4") == 80
