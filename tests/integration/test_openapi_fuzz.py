"""Schemathesis against the live server's own /openapi.json: no input gives a 5xx (short, seeded)."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

pytestmark = pytest.mark.integration


def test_no_generated_request_gets_a_server_error(server_factory):
    # The operator's stop needs the admin token (never sent here): fuzzing cannot end the run.
    srv = server_factory("--protect-reads")
    schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    checked: list[str] = []
    calls: list[int] = []
    for op in operations:

        @given(case=op.as_strategy())
        @settings(max_examples=25, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case) -> None:
            response = case.call(base_url=srv.url, timeout=10)
            calls.append(response.status_code)
            assert response.status_code < 500, (case.method, case.formatted_path, response.status_code,
                                                response.text[:300])

        fuzz()
        checked.append(op.label)
    assert len(calls) >= 5 * len(operations), len(calls)  # every operation was really exercised
    assert srv.healthz()["status"] == "ok", checked
