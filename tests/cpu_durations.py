"""``--cpu-durations=N``: the N tests that used the most CPU, setup to teardown, and the suite's
total: the test process's threads and the subprocesses it waited for (a subprocess still running
when a test ends counts where it is reaped). Unlike ``--durations``' wall time this does not grow
while other work loads the machine, so it is the figure to reason about the suite's time on CI
from. Under xdist each worker measures its own tests and the figure travels in the teardown
report's ``user_properties`` to the controller, which sums them."""

from __future__ import annotations

import resource

import pytest

_STARTED = pytest.StashKey[float]()
PROPERTY = "cpu_s"
_times: list[tuple[float, str]] = []  # (CPU seconds, node id) of the tests reported to this process


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="show the N tests that used the most CPU (0: all) and the total")


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.config.getoption("cpu_durations") is not None:
        item.stash[_STARTED] = _cpu_s()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    if call.when == "teardown" and _STARTED in item.stash:
        report.user_properties.append((PROPERTY, _cpu_s() - item.stash[_STARTED]))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == PROPERTY and report.when == "teardown":
            _times.append((float(value), report.nodeid))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    n = config.getoption("cpu_durations")
    if n is None:
        return
    times = sorted(_times, reverse=True)
    terminalreporter.section(f"CPU seconds: {sum(t for t, _ in times):.1f} in {len(times)} tests")
    for cpu, nodeid in times[:n or None]:
        terminalreporter.write_line(f"{cpu:8.2f}s  {nodeid}")
