"""What an agent is started with: ``hermes-client``'s flags, and what in-process runs (tests, the testbed) pass."""

from __future__ import annotations

from dataclasses import dataclass, field

from hermes.common.pace import SlowdownMode
from hermes.common.task import Task

__all__ = ["AgentOptions"]


@dataclass(frozen=True)
class AgentOptions:
    server: str
    name: str
    # Torch intra-op threads; None: the cores this process may use (client/cores.py).
    # The library default stays 1: in-process agents (tests) share one process.
    threads: int | None = 1
    slowdown: float = 1.0
    # How the slowdown is emulated (common/pace.py): 'cpu' multiplies each step's work, 'floor' its
    # uncontended cost.
    slowdown_mode: SlowdownMode = "cpu"
    # slowdown_mode 'nominal': every device's uncontended cost per sample, in ms (the bench measures it once).
    nominal_sample_ms: float | None = None
    device: str = "auto"
    request_timeout: float = 30.0
    connect_retries: int = 8
    progress: bool = True
    max_cycles: int | None = None
    # (seconds since start, slowdown) steps: a device whose speed changes mid-run.
    slowdown_schedule: tuple[tuple[float, float], ...] = ()
    # Unix time the schedule's seconds count from (the testbed passes one
    # origin to every agent so their phases line up); None: the agent's start.
    schedule_origin: float | None = None
    # Kafka bootstrap address to use instead of the one the server names
    # (the broker may be reachable under another name from this device).
    kafka_bootstrap: str | None = None
    # Compute capacity this device declares (cores, or FLOPs): the static
    # allocation policy's c_k (OmniLearn Eq. 4a). None: the server decides.
    cores: float | None = None
    # Security: the operator's join token; TLS for the control plane.
    join_token: str | None = field(default=None, repr=False)
    ssl_ca_certfile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    # Registrations after the first (server restarted, or it marked us lost) before giving up.
    max_rejoins: int = 100
    # Seconds to prove at the first registration that the advertised data plane answers
    # (client/preflight.py); 0 skips the check.
    data_plane_check_timeout: float = 3.0
    # The task: a reference (MODULE:ATTR, FILE.py:ATTR, an installed name) or a Task object
    # (in-process runs); None: the reference in the server's run config.
    task: str | Task | None = None
    # The key that proves this agent's name (client/name_key.py); None: the one kept in the
    # agent's state directory, made on first use.
    name_key: str | None = field(default=None, repr=False)
    # Local cycles in a row whose loss is not finite before the agent gives up (exit 4); each
    # one is dropped and the global model pulled again.
    max_nonfinite_cycles: int = 3

    def slowdown_at(self, elapsed: float) -> float:
        factor = self.slowdown
        for at, step_factor in self.slowdown_schedule:
            if elapsed >= at:
                factor = step_factor
        return factor
