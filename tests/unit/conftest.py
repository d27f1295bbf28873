"""Unit tests build configs from presets and overrides: the shell's HERMES_* variables must not leak in."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_hermes_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith("HERMES_"):
            monkeypatch.delenv(key)
