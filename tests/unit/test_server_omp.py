"""hermes.server makes OpenMP's workers sleep between requests (server/__init__.py), unless told otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PRINT = "import os; {before}import hermes.server; print(os.environ.get('OMP_WAIT_POLICY', '<unset>'))"


def _policy(before: str = "", **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env
    out = subprocess.run([sys.executable, "-c", _PRINT.format(before=before)], env=clean, capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize(("before", "env", "expected"), [
    ("", {}, "PASSIVE"),  # hermes-server, uvicorn's factory: the server is imported before torch
    ("", {"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),  # the user's choice wins
    ("import torch; ", {}, "<unset>"),  # too late for libgomp: not pretended
])
def test_the_server_sets_a_passive_openmp_wait_policy_only_when_it_can_take_effect(before: str, env: dict[str, str],
                                                                                    expected: str) -> None:
    assert _policy(before, **env) == expected


@pytest.mark.parametrize(("before", "spins"), [("", "False"), ("import torch; ", "True")])
def test_the_server_knows_when_torch_came_first_and_its_workers_spin(before: str, spins: str) -> None:
    code = f"{before}import hermes.server; print(hermes.server.OMP_SPINS)"
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.strip() == spins
