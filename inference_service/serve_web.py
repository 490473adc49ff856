"""Run several daphne processes on one port.

daphne serves one process: Django's sync views and the Channels consumers share one GIL, so a
burst of submissions queues behind itself however many cores are free. This launcher starts
``--processes`` daphne children (``python -m inference_service.daphne_server --fd``, daphne's
command line) on the port; any other argument is passed to daphne. A child that dies is restarted
(after a short pause, so a crash loop does not spin); SIGTERM/SIGINT stop all of them.

    python -m inference_service.serve_web -b 127.0.0.1 -p 8000 --processes 2

On Linux every child gets a listening socket of its own, all bound with SO_REUSEPORT, and the
kernel spreads new connections over them. With one shared socket it would not: Twisted accepts
every pending connection on each wake-up, so the first child awake would take nearly all of a
burst while the others idle. The supervisor keeps every socket open, so connections that reach a
dead child's socket wait for its replacement instead of being refused. Elsewhere (macOS's
SO_REUSEPORT does not balance) the children share one socket.

WebSockets need no affinity: a socket lives in the child that accepted it, which reads its job's
Redis stream itself; a key's revocation reaches every child through the channel layer.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import time

logger = logging.getLogger("serve_web")

ASGI_APP = "inference_service.asgi:application"
# daphne with the service's access-log redaction and protocol settings (its docstring says which).
DAPHNE = "inference_service.daphne_server"
RESTART_PAUSE_S = 1.0
STOP_TIMEOUT_S = 30.0


def default_processes() -> int:
    """One per core up to 4 (the engine worker needs cores too)."""
    return max(1, min(4, os.cpu_count() or 1))


def bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def listening_sockets(host: str, port: int, processes: int) -> list[socket.socket]:
    """One socket per child where the kernel balances SO_REUSEPORT (Linux), else one shared."""
    if sys.platform != "linux" or processes == 1:
        return [bind(host, port)]
    # A plain bind first: SO_REUSEPORT alone would let this launcher share the port with another
    # server of the same user (a forgotten earlier launch) instead of failing. It also resolves
    # port 0 to the port the group then binds.
    with bind(host, port) as probe:
        port = probe.getsockname()[1]
    return [bind(host, port, reuse_port=True) for _ in range(processes)]


class Supervisor:
    def __init__(self, sockets: list[socket.socket], processes: int, daphne_args: list[str]) -> None:
        self._sockets = sockets  # one per child, or one shared by all
        self._daphne_args = daphne_args
        self._children: list[subprocess.Popen | None] = [None] * processes
        self._stopping = False

    def _spawn(self, slot: int) -> None:
        fd = self._sockets[slot % len(self._sockets)].fileno()
        argv = [sys.executable, "-m", DAPHNE, "--fd", str(fd), *self._daphne_args, ASGI_APP]
        child = self._children[slot] = subprocess.Popen(argv, pass_fds=(fd,))
        logger.info("daphne %s started (pid %s)", slot, child.pid)

    def stop(self, *_: object) -> None:
        self._stopping = True

    def run(self) -> int:
        for slot in range(len(self._children)):
            self._spawn(slot)
        while not self._stopping:
            for slot, child in enumerate(self._children):
                if child is not None and child.poll() is not None and not self._stopping:
                    logger.warning("daphne %s exited with %s; restarting", slot, child.returncode)
                    time.sleep(RESTART_PAUSE_S)
                    self._spawn(slot)
            time.sleep(0.2)
        return self._terminate()

    def _terminate(self) -> int:
        live = [c for c in self._children if c is not None and c.poll() is None]
        for child in live:
            child.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in live:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-b", "--bind", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=8000)
    parser.add_argument("--processes", type=int, default=default_processes(),
                        help="daphne processes (default: one per core, at most 4)")
    args, daphne_args = parser.parse_known_args(argv)
    processes = args.processes
    if processes < 1:
        parser.error("--processes must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        sockets = listening_sockets(args.bind, args.port, processes)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        logger.error("error: port %s on %s is in use by another process; not starting", args.port, args.bind)
        return 1
    supervisor = Supervisor(sockets, processes, daphne_args)
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    logger.info("listening on %s:%s with %s daphne processes", args.bind, args.port, processes)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
