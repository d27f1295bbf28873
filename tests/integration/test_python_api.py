"""hermes.train / hermes.Server / hermes.Agent: a Task object (no import reference, as in a notebook)
trained in this process to a target, then everything shut down: no thread, no port left."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import hermes
from hermes.deploy.procs import port_is_free

pytestmark = pytest.mark.integration


def _digits_task() -> hermes.Task:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    # A function defined here, not importable by any reference: in-process agents get the object itself.
    return hermes.Task(model=lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)),
                       train_data=(x[:1400], y[:1400]), test_data=(x[1400:], y[1400:]), name="api-digits")


def _port_free(address: str) -> bool:
    host, _, port = address.rpartition("/")[2].rpartition(":")
    return port_is_free(int(port), host)


def test_train_reaches_the_target_and_leaves_nothing_running(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    task = _digits_task()
    with hermes.Server(task, preset="asp", target="accuracy=0.85", max_seconds=120, out_dir=tmp_path / "run",
                       config={"eval_interval_seconds": 0.5}) as server:
        assert server.url.startswith("http://127.0.0.1:") and server.running
        addresses = [server.url.removeprefix("http://"), server.data_address]
        server.add_agents(2, slowdowns=[1.0, 2.0])
        result = server.wait(timeout=150)
    assert result.target_reached, (result.outcome, result.stop_reason, result.metrics)
    assert "target accuracy 0.85 reached" in result.stop_reason
    assert result.best_metrics is not None and result.best_metrics["accuracy"] >= 0.85
    assert set(result.metrics) >= {"accuracy", "loss"} and result.updates > 0 and result.seconds > 0
    assert result.agent_errors == {}
    assert result.summary["task"] == "api-digits" and result.out_dir == tmp_path / "run"
    assert {w["name"] for w in result.summary["workers"]} == {"worker-1", "worker-2"}
    # The final model is a standard state_dict: two lines load it, and it scores what the server said.
    assert result.model_path == tmp_path / "run" / "model-final.safetensors"
    from safetensors.torch import load_file

    model = task.model()
    model.load_state_dict(load_file(result.model_path))
    inputs, targets = (torch.from_numpy(a) for a in task.test_data)  # type: ignore[union-attr]
    with torch.no_grad():
        accuracy = float((model(inputs).argmax(dim=1) == targets).double().mean())
    assert accuracy == pytest.approx(result.metrics["accuracy"], abs=1e-6)

    assert not server.running
    # pyzmq's zero-copy frame collector is one daemon thread per process, started by the first
    # zero-copy send (the server's cached model frames) and meant to outlive any one socket.
    assert [t.name for t in threading.enumerate()
            if t not in before and type(t).__name__ != "GarbageCollectorThread"] == []
    assert all(_port_free(a) for a in addresses), addresses


def test_train_needs_a_stop_and_refuses_a_broken_task(tmp_path: Path) -> None:
    task = _digits_task()
    with pytest.raises(ValueError, match="give a target"):
        hermes.train(task, agents=1)
    broken = hermes.Task(model=task.model, train_data=task.train_data, test_data=task.test_data,
                         loss=lambda out, y: out.sum(dim=1), name="broken")  # not a scalar
    before = set(threading.enumerate())
    with pytest.raises(hermes.TaskError, match="task broken: loss"):
        hermes.train(broken, agents=1, max_seconds=5, out_dir=tmp_path / "broken")
    # pyzmq's zero-copy frame collector is one daemon thread per process, started by the first
    # zero-copy send (the server's cached model frames) and meant to outlive any one socket.
    assert [t.name for t in threading.enumerate()
            if t not in before and type(t).__name__ != "GarbageCollectorThread"] == []


def test_agents_that_all_fail_end_the_run(tmp_path: Path) -> None:
    """An agent whose task differs is refused at registration; with none left training, wait() returns."""
    task = _digits_task()
    other = hermes.Task(model=lambda: nn.Linear(64, 10), train_data=task.train_data, test_data=task.test_data,
                        name="api-digits")
    with hermes.Server(task, preset="asp", max_seconds=120, out_dir=tmp_path / "run") as server:
        hermes.Agent(server, name="worker-1", task=other)
        result = server.wait(timeout=60)
    assert result.outcome == "stopped" and "every agent ended" in result.stop_reason
    assert "task mismatch" in result.agent_errors["worker-1"]


def test_a_server_that_cannot_bind_is_one_error_and_leaves_no_thread(tmp_path: Path) -> None:
    import socket

    before = set(threading.enumerate())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        server = hermes.Server(_digits_task(), max_seconds=30, out_dir=tmp_path / "run", port=busy.getsockname()[1])
        with pytest.raises(hermes.RunError, match="did not start"):
            server.start()
    assert server.close() is None and not server.running
    # pyzmq's zero-copy frame collector is one daemon thread per process, started by the first
    # zero-copy send (the server's cached model frames) and meant to outlive any one socket.
    assert [t.name for t in threading.enumerate()
            if t not in before and type(t).__name__ != "GarbageCollectorThread"] == []
