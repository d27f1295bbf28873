"""The control plane's HTTP routes, one router per role; ``hermes.server.app`` assembles them.

- ``probes``: ``/healthz`` and ``/metrics``, for orchestrators and Prometheus;
- ``workers``: an agent's life in the run: register, heartbeat, leave, regroup;
- ``reads``: the run as it stands (workers, status, config, summary);
- ``admin``: ``/v1/stop``, with the admin token;
- the live page and ``/v1/history`` are ``hermes.server.dashboard``'s router.

``deps`` holds what they share: the ``ServerContext`` the factory resolved once
(settings, credentials, the registration limiter) and the read guard.
"""
