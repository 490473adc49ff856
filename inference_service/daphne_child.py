"""One daphne process of ``serve_web``: daphne's own command line, with one change to how its
listening socket accepts.

All the processes share one listening socket. Twisted accepts greedily: on each wake-up a
process accepts every pending connection, up to 100 at first and then as many as it got last
time. When a burst of clients connects at once (32 POSTs within 3 ms on the GPU host), the first
process to wake took most of them and ran their requests one after another, while the other
processes idled: a job's POST -> INSERT went from 10 to 24-27 ms (p50). Accepting one connection
per wake-up lets every process take its share; the ones that are busy come back for more last.
"""

from __future__ import annotations

import sys


def accept_one_per_wakeup() -> None:
    """Make every Twisted TCP port accept at most one connection each time it is readable."""
    from twisted.internet import tcp

    # Port.doRead reads numberAccepts to size its accept loop and then adapts it; pin it to 1.
    tcp.Port.numberAccepts = property(lambda self: 1, lambda self, value: None)


def main() -> None:
    from daphne.cli import CommandLineInterface  # installs daphne's asyncio reactor first

    accept_one_per_wakeup()
    CommandLineInterface.entrypoint()


if __name__ == "__main__":
    sys.exit(main())
