"""Kept for the scripts in this folder: the code lives in ``hermes.deploy.bench.machine``."""

from hermes.deploy.bench.machine import (  # noqa: F401
    cpu_model,
    loadavg,
    machine_info,
    print_table,
    versions,
)
