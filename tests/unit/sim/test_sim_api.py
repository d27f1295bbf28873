"""hermes-sim's command line and the Python API's simulated path (hermes.simulate, hermes.train past the limit)."""

from __future__ import annotations

import json

import pytest

import hermes
from hermes.api import PROCESS_AGENTS_MAX
from hermes.sim.cli import main

DIGITS = ["--dataset", "digits", "--model", "mlp", "--target-accuracy", "0.85", "--max-seconds", "300"]


def test_the_cli_writes_the_testbed_summary_and_refuses_to_overwrite_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--population", "hl8", "--preset", "asp", "--seed", "3", "--server-cost", "none",
                 "--out", str(out), *DIGITS]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["reached_target"] and s["engine"] == "sim" and s["clients"] == 4 and s["config"]["seed"] == 3
    assert s["seconds_to_target"] == s["target_reached_at"]["seconds"]
    assert "virtual seconds" in capsys.readouterr().out
    assert s["link_model"] == {"transfer": "transfer_seconds", "device_link": "per-message"}
    assert main(["--population", "hl8", "--out", str(out), *DIGITS]) == 2
    assert "earlier run" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--devices", "0"], "--devices must be >= 1"),
    (["--population", "nowhere.json"], "--population: unknown population"),
    (["--set", "lr=-1"], "lr"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, argv, says):
    assert main([*argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_the_link_model_flags_reach_the_run_and_its_summary(tmp_path):
    # A thin lte link, where the 66 bytes of headers a segment and a device's messages queued behind its
    # overlapped push cost time (hermes: a push in flight while the next cycle's requests go out): each flag alone
    # makes the devices of the same run (same seed) wait longer for replies.
    base = ["--population", "hl8", "--preset", "hermes", "--link", "lte", "--server-cost", "none", "--quiet", *DIGITS]
    runs = {}
    for name, extra in {"plain": [], "framed": ["--framing", "tcp"], "queue": ["--device-link", "queue:0.65"]}.items():
        assert main([*base, *extra, "--out", str(tmp_path / name)]) == 0
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert runs["framed"]["link_model"] == {"transfer": "framed_transfer_seconds", "device_link": "per-message"}
    assert runs["queue"]["link_model"] == {"transfer": "transfer_seconds", "device_link": "queue:0.65"}
    assert runs["plain"]["messages_total"] > 0

    def waited(summary):
        return sum(w["wait_seconds"] for w in summary["workers"]) / sum(w["cycles"] for w in summary["workers"])

    for name in ("framed", "queue"):
        assert waited(runs[name]) > waited(runs["plain"])


def test_version_and_help(capsys):
    for flag in ("--version", "--help"):
        with pytest.raises(SystemExit) as info:
            main([flag])
        assert info.value.code == 0
    assert "hermes-sim" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_train_with_more_agents_than_the_process_path_takes_simulates_every_one(tmp_path):
    agents = 100
    assert agents > PROCESS_AGENTS_MAX
    # A budget, not a target: plain asp over 100 equally fast workers is 100 updates stale and
    # diverges at the digits lr (the sim shows it); what this checks is that every agent is there.
    result = hermes.train("builtin", agents=agents, preset="asp", max_updates=300, out_dir=tmp_path / "run",
                          config={"dataset": "digits", "model": "mlp"})
    assert result.outcome == "budget_reached" and result.updates == 300 and not result.agent_errors
    workers = result.summary["workers"]
    assert len(workers) == agents and len({w["name"] for w in workers}) == agents
    assert all(w["device"]["registrations"] == 1 and w["device"]["cycles"] >= 1 for w in workers)
    assert result.model_path is not None and result.model_path.is_file()


def test_device_link_reads_per_message_queue_and_a_share():
    import argparse

    from hermes.sim.cli import device_link

    assert (device_link("per-message"), device_link("queue"), device_link("queue:0.65")) == (0.0, 1.0, 0.65)
    for bad in ("queue:0", "queue:1.5", "queue:x", "fifo", "per-message:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="per-message, queue or queue:SHARE"):
            device_link(bad)
