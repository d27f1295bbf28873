"""The screening's thresholds are for cluster members (issue 29): k x the published median norm sized
the sign flip that owned asp. Without a token /v1/status and /v1/summary say whether screening is on,
what it refused and whom it holds; the median norm, the clip count and the cosines need a token."""

from __future__ import annotations

import torch

from tests.conftest import ADMIN_TOKEN, JOIN_TOKEN

OPEN = {"enabled", "refusals", "quarantined"}


def test_screening_thresholds_need_the_join_or_admin_token(live_server):
    srv = live_server
    w = srv.register("reader")
    v, _ = w.pull()
    for i in range(5):  # a few accepted pushes: the median norm exists
        reply = w.push(0.003 * torch.randn(w.numel, generator=torch.Generator().manual_seed(i)), base_version=v)
        v = reply.header.model_version
    for path in ("/v1/status", "/v1/summary"):
        anonymous = srv.get_json(path)["screening"]
        assert set(anonymous) == OPEN, (path, anonymous)
        for token in (JOIN_TOKEN, ADMIN_TOKEN):
            r = srv.http.get(srv.url + path, headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200, r.text
            member = r.json()["screening"]
            assert member["median_norm"] > 0 and {"clipped", "min_accepted_cosine"} <= set(member), (path, member)
        r = srv.http.get(srv.url + path, headers={"Authorization": "Bearer not-the-token"})
        assert set(r.json()["screening"]) == OPEN, path
