"""hermes-server's start-up pieces: env twins, the data host, one-line errors, the output folder."""

from __future__ import annotations

import json
import time

import pytest
from pydantic import ValidationError

from hermes.server.cli import build_parser
from hermes.server.outdir import OutDirError, check_out_dir, default_out_dir, prepare_out_dir, run_outputs
from hermes.server.preflight import env_twin, explain
from hermes.server.settings import DEFAULT_MAX_MESSAGE_BYTES, ServerSettings


def test_every_flag_has_an_environment_twin_named_in_its_help():
    for action in build_parser()._actions:
        if not action.option_strings or action.dest in ("help", "version"):
            continue
        twin = env_twin(action.dest)
        assert twin is not None, f"{action.option_strings[0]} has no HERMES_* twin"
        assert "HERMES_" in str(action.help), action.option_strings[0]
        name = twin.split()[0].split("=")[0].removeprefix("HERMES_").lower().split("__")[0]
        assert name in ServerSettings.model_fields, (action.option_strings[0], twin)


@pytest.mark.parametrize("env, field, want", [
    ({"HERMES_PORT": "9100"}, "port", 9100),
    ({"HERMES_HOST": "127.0.0.1"}, "data_host", "127.0.0.1"),
    ({"HERMES_OVERWRITE": "1"}, "overwrite", True),
    ({"HERMES_LOG_LEVEL": "WARNING"}, "log_level", "warning"),
    ({"HERMES_PROGRESS_INTERVAL_SECONDS": "2.5"}, "progress_interval_seconds", 2.5),
    ({"HERMES_SSL_CERTFILE": "/x.pem"}, "ssl_certfile", "/x.pem"),
])
def test_environment_twins_are_read(monkeypatch, env, field, want):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert getattr(ServerSettings(), field) == want


def test_a_nested_twin_merges_with_the_flag_leaf_by_leaf(monkeypatch):
    monkeypatch.setenv("HERMES_SCREENING__NORM_FACTOR", "16")
    s = ServerSettings(screening={"enabled": False})
    assert (s.screening.enabled, s.screening.norm_factor) == (False, 16.0)


def test_the_data_plane_binds_where_the_control_plane_does_unless_told():
    assert ServerSettings().data_host == "0.0.0.0"
    assert ServerSettings(host="127.0.0.1").data_host == "127.0.0.1"
    assert ServerSettings(host="127.0.0.1", data_host="0.0.0.0").data_host == "0.0.0.0"


def test_the_max_message_default_matches_the_wire():
    from hermes.common.wire import DEFAULT_MAX_MESSAGE_BYTES as WIRE

    assert DEFAULT_MAX_MESSAGE_BYTES == WIRE


def test_a_bad_value_is_named_as_the_user_wrote_it(monkeypatch):
    parser = build_parser()
    monkeypatch.setenv("HERMES_PORT", "abc")
    with pytest.raises(ValidationError) as ei:
        ServerSettings()
    assert explain(ei.value, {}, parser).startswith("HERMES_PORT='abc': Input should be a valid integer")
    monkeypatch.delenv("HERMES_PORT")
    with pytest.raises(ValidationError) as ei:
        ServerSettings(heartbeat_timeout_seconds=-1)
    assert explain(ei.value, {"heartbeat_timeout_seconds": -1}, parser).startswith("--heartbeat-timeout: ")
    with pytest.raises(ValidationError) as ei:
        ServerSettings(preset="bsb")
    assert explain(ei.value, {"preset": "bsb"}, parser) == "--preset: unknown preset 'bsb'; did you mean 'bsp'?"


def test_an_out_dir_with_another_runs_outputs_is_refused_unless_resumed_or_overwritten(tmp_path):
    out = tmp_path / "out"
    assert check_out_dir(out, resume=False, overwrite=False) == []  # not there yet: fine
    out.mkdir()
    (out / "events.jsonl").write_text('{"ts": 1.0, "event": "testbed_start"}\n')  # no server run in it
    (out / "server.log").write_text("x")  # somebody else's file: never counted, never deleted
    assert run_outputs(out) == []
    (out / "model-best.safetensors").write_bytes(b"best")
    with open(out / "events.jsonl", "a") as fh:  # the engine's first event, as EventLog writes it
        fh.write(json.dumps({"ts": 2.0, "event": "run_start", "config": {}}) + "\n")
    with pytest.raises(OutDirError, match=r"holds another run's outputs \(model-best.safetensors, events.jsonl\)"):
        check_out_dir(out, resume=False, overwrite=False)
    assert check_out_dir(out, resume=True, overwrite=False) == ["model-best.safetensors", "events.jsonl"]
    prepare_out_dir(out, resume=True, overwrite=False)
    assert (out / "model-best.safetensors").read_bytes() == b"best"  # resuming keeps them
    prepare_out_dir(out, resume=False, overwrite=True)
    assert run_outputs(out) == [] and (out / "server.log").read_text() == "x"


def test_the_default_out_dir_is_timestamped_and_never_reused(tmp_path):
    now = time.mktime((2026, 11, 24, 1, 2, 3, 0, 0, 0)) - time.timezone
    first = default_out_dir("bsp", root=tmp_path, now=now)
    assert first == tmp_path / "20261124T010203Z-bsp"
    first.mkdir()
    assert default_out_dir("bsp", root=tmp_path, now=now) == tmp_path / "20261124T010203Z-bsp-2"


def test_a_loopback_data_plane_advertised_elsewhere_is_warned_about():
    from hermes.server.preflight import reachability_warning

    assert reachability_warning(ServerSettings(host="127.0.0.1")) is None  # advertised on loopback too
    warning = reachability_warning(ServerSettings(host="127.0.0.1", advertise_host="10.0.0.5"))
    assert warning is not None and "--data-host 0.0.0.0" in warning and "10.0.0.5" in warning
    assert reachability_warning(ServerSettings(host="127.0.0.1", data_host="0.0.0.0",
                                               advertise_host="10.0.0.5")) is None
