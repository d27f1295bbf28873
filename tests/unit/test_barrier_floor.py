"""The bsp deadline's default floor (issue 29's matrix, docs/security-screening.md section 3).

With the 10 s floor a silent worker cost every run 2 x 10 s before rounds stopped waiting for it, several
times an honest bsp run to 0.8 on digits. With the default floor (1 s) a round of fast arrivals is cut at
4 x its latest arrival, so the silent worker costs two such rounds.
"""

from __future__ import annotations

from hermes.common.policies.sync import BarrierParams, BarrierStrategy, PushInfo, Release


def _at(worker: str, t: float) -> PushInfo:
    return PushInfo(worker, 0, 0, 1, 1, at=t)


def test_the_default_floor_cuts_fast_rounds_at_a_second_and_excuses_a_silent_worker_after_two():
    s = BarrierStrategy(BarrierParams())
    for w in ("a", "b", "silent"):
        s.on_join(w)
    t = 100.0
    for round_ in range(2):
        s.on_push(_at("a", t))
        s.on_push(_at("b", t + 0.1))  # latest arrival 0.1 s in: 4 x 0.1 s is under the floor
        s.on_tick(t + 0.99)
        assert s.take_release() is None, round_
        s.on_tick(t + 1.0)
        assert s.take_release() == Release(("a", "b"), ("a", "b")), round_
        t += 1.0
    s.on_push(_at("a", t + 0.1))
    s.on_push(_at("b", t + 0.2))
    assert s.take_release() == Release(("a", "b"), ("a", "b"))  # excused: no wait at all
