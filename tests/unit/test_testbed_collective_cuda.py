"""A collective testbed on CUDA gives each agent its own GPU, and refuses more agents than GPUs up front."""

from __future__ import annotations

import pytest

from hermes.deploy import testbed_cli
from hermes.deploy.testbed_commands import agent_device


def test_more_collective_agents_than_gpus_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(testbed_cli, "cuda_device_count", lambda: 1)
    rc = testbed_cli.main(["--topology", "collective", "--device", "cuda", "--clients", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "nccl, which needs a GPU per agent: 2 agents, 1 GPU(s)" in err
    monkeypatch.setattr(testbed_cli, "cuda_device_count", lambda: 4)
    assert testbed_cli.main(["--topology", "collective", "--device", "cuda:1", "--clients", "2"]) == 2


@pytest.mark.parametrize(("device", "topology", "expected"), [
    ("cuda", "collective", ["cuda:0", "cuda:1", "cuda:2"]),
    ("cuda", "ps", ["cuda", "cuda", "cuda"]),
    ("cpu", "collective", ["cpu", "cpu", "cpu"]),
])
def test_agent_devices(device: str, topology: str, expected: list[str]) -> None:
    args = testbed_cli.build_parser().parse_args(["--device", device, "--topology", topology])
    assert [agent_device(args, i) for i in range(3)] == expected
