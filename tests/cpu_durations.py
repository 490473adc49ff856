"""``--cpu-durations=N``: the N tests that used the most CPU, setup to teardown, and the suite's
total: this process's threads and the subprocesses it waited for (a subprocess still running when
a test ends counts where it is reaped). Unlike ``--durations``' wall time this does not grow while
other work loads the machine, so it is the figure to reason about the suite's time on CI from."""

from __future__ import annotations

import resource

import pytest

_TIMES = pytest.StashKey[list[tuple[float, str]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="show the N tests that used the most CPU (0: all) and the total")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_TIMES] = []


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    if item.config.getoption("cpu_durations") is None:
        return (yield)
    start = _cpu_s()
    try:
        return (yield)
    finally:
        item.config.stash[_TIMES].append((_cpu_s() - start, item.nodeid))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    n = config.getoption("cpu_durations")
    if n is None:
        return
    times = sorted(config.stash[_TIMES], reverse=True)
    terminalreporter.section(f"CPU seconds: {sum(t for t, _ in times):.1f} in {len(times)} tests")
    for cpu, nodeid in times[:n or None]:
        terminalreporter.write_line(f"{cpu:8.2f}s  {nodeid}")
