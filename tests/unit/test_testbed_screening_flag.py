"""hermes-testbed --screening: the server's update screening off for the defences' cost (issue 29)."""

from __future__ import annotations

from pathlib import Path

from hermes.deploy import testbed_cli
from hermes.deploy.testbed_commands import server_command


def _server(argv: list[str]) -> list[str]:
    a = testbed_cli.build_parser().parse_args(argv)
    return server_command(a, port=1, data_port=2, advertise_host="127.0.0.1", out=Path("o"),
                          checkpoint_dir=Path("c"), kafka_bootstrap=None, faults_pending=False, resume=False)


def test_screening_off_reaches_the_server_and_the_default_leaves_the_server_default():
    off = _server(["--screening", "off"])
    assert off[off.index("--screening") + 1] == "off"
    assert "--screening" not in _server([])
