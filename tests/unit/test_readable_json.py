"""hermes.common.readable_json: the same JSON as json.dumps, one top-level entry (and list element) a line."""

from __future__ import annotations

import json
import math

from hermes.common import readable_json


def test_it_round_trips_and_puts_each_worker_on_a_line():
    summary = {"reached_target": True, "seconds": 1.5, "workers": [{"name": f"w{i}", "pushes": i} for i in range(3)],
               "empty": [], "nested": {"a": [1, 2]}, "none": None, "text": "é\n\"q\""}
    text = readable_json.dumps(summary)
    assert json.loads(text) == summary
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert '    {"name": "w1", "pushes": 1},' in lines
    assert '  "reached_target": true,' in lines


def test_non_dicts_and_nan_as_json_dumps_writes_them():
    assert readable_json.dumps([1, 2]) == json.dumps([1, 2])
    assert readable_json.dumps({}) == "{}"
    assert math.isnan(json.loads(readable_json.dumps({"x": math.nan}))["x"])
