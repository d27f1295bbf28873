"""The Hermes parameter server: FastAPI control plane + ZeroMQ data plane."""

from __future__ import annotations

import os
import sys

# OpenMP's worker threads busy-wait after each parallel region unless told otherwise (libgomp's default), and a
# server's tensor work comes in short bursts, one a request, with idle gaps between: every fold of a 1M-parameter
# update left a worker spinning through the gap. Measured 2026-11-28 (2 cores, torch 2.13, 2 intra-op threads,
# an add_ of 1M floats every 0.5 ms): 0.83 ms of process CPU an add spinning, 0.21 ms with PASSIVE (0.31 ms on one
# thread); `hermes-bench micro` at torch's default threads, a top-1% push's server + agent CPU 2.9-3.2 ms against
# 1.9-2.4 ms. libgomp reads the variable when torch loads it, so only a process that imports the server before
# torch gets it (hermes-server, uvicorn's factory); a value the user set wins (OMP_WAIT_POLICY=ACTIVE restores
# the spin). Agents train back to back, where the spin is what keeps the next region's start cheap: left alone.

# True when torch was loaded first with no policy set (hermes.Server after the user's `import torch`): its workers
# spin, and the server says so once it is ready (server/app.py).
OMP_SPINS = "torch" in sys.modules and "OMP_WAIT_POLICY" not in os.environ
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
