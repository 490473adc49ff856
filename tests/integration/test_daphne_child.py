"""serve_web's daphne processes accept one connection per wake-up (inference_service/daphne_child.py),
so a burst of connections spreads over all of them instead of going to the first one awake."""

from __future__ import annotations

import subprocess
import sys

import pytest

ACCEPTS_ON_ONE_WAKEUP = """
import socket, sys, time
if sys.argv[1] == "patched":
    from inference_service.daphne_child import accept_one_per_wakeup
    accept_one_per_wakeup()
from twisted.internet import protocol, reactor

accepted = []
factory = protocol.Factory.forProtocol(protocol.Protocol)
factory.buildProtocol = lambda addr: accepted.append(addr) or protocol.Protocol()
port = reactor.listenTCP(0, factory, interface="127.0.0.1")
clients = [socket.create_connection(("127.0.0.1", port.getHost().port)) for _ in range(5)]
time.sleep(0.2)  # all five are waiting in the backlog
port.doRead()  # what the reactor calls once the socket is readable
print(len(accepted))
"""


@pytest.mark.parametrize(("mode", "accepted"), [("patched", 1), ("twisted", 5)])
def test_a_wakeup_accepts_one_waiting_connection_where_twisted_takes_them_all(mode, accepted):
    out = subprocess.run([sys.executable, "-c", ACCEPTS_ON_ONE_WAKEUP, mode], capture_output=True, text=True,
                         timeout=60, check=True)
    assert int(out.stdout.strip()) == accepted, out.stderr
