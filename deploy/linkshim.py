"""Run a module with its TCP connections to some addresses sent to others (process link mode).

``python -m hermes.deploy.linkshim MODULE ARGS...`` with
``HERMES_LINK_REWRITE="HOST:PORT=HOST:PORT,..."`` in the environment runs
``MODULE`` as ``__main__`` after rewriting, in this process, every
connection to a left-hand address into one to the right-hand address: Python
sockets (httpx, kafka-python, asyncio) and ZeroMQ's ``connect``. The testbed
uses it to put an agent's relay between the agent and the server's control
port, its data plane (whose address the server advertises at registration)
and the broker (whose address the broker itself advertises), without the
agent knowing.
"""

from __future__ import annotations

import logging
import os
import runpy
import socket
import sys
from typing import Any

log = logging.getLogger(__name__)

ENV = "HERMES_LINK_REWRITE"


def parse_rewrites(text: str) -> dict[tuple[str, int], tuple[str, int]]:
    table = {}
    for item in filter(None, text.split(",")):
        src, _, dst = item.partition("=")
        sh, _, sp = src.rpartition(":")
        dh, _, dp = dst.rpartition(":")
        table[(sh, int(sp))] = (dh, int(dp))
    return table


def install(table: dict[tuple[str, int], tuple[str, int]]) -> None:
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def target(address: Any) -> Any:
        if isinstance(address, tuple) and len(address) >= 2:
            return table.get((address[0], address[1]), address)
        return address

    def patched_connect(self: socket.socket, address: Any) -> None:
        connect(self, target(address))

    def patched_connect_ex(self: socket.socket, address: Any) -> int:
        return connect_ex(self, target(address))

    socket.socket.connect = patched_connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = patched_connect_ex  # type: ignore[method-assign,assignment]
    try:
        import zmq
    except ImportError:
        return
    zconnect = zmq.Socket.connect

    def patched_zconnect(self: Any, addr: str) -> Any:
        if addr.startswith("tcp://"):
            host, _, port = addr[len("tcp://"):].rpartition(":")
            if port.isdigit() and (host, int(port)) in table:
                h, p = table[(host, int(port))]
                addr = f"tcp://{h}:{p}"
        return zconnect(self, addr)

    zmq.Socket.connect = patched_zconnect  # type: ignore[method-assign]


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m hermes.deploy.linkshim MODULE ARGS...")
    install(parse_rewrites(os.environ.get(ENV, "")))
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
