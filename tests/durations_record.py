"""CI's record of where the test time went (.ci-records/test_durations.md, which .ci/run prints
after the tests): each file's wall time on its worker, and each test's setup, call and teardown,
from pytest's own reports. `--durations` prints phases alone and no file; this is what
tests/conftest.py's LONGEST_FIRST order and benchmarks/results/test_suite_time.md are made from."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

LISTED_FROM_S = 1.0  # tests this long or longer are listed one by one; the files' table counts every test


@dataclass
class TimedTest:
    nodeid: str
    worker: str
    phases: dict[str, float] = field(default_factory=dict)  # setup/call/teardown -> seconds
    start: float = 0.0
    stop: float = 0.0

    @property
    def file(self) -> str:
        return self.nodeid.split("::")[0]

    @property
    def seconds(self) -> float:
        return sum(self.phases.values())


def worker_of(report) -> str:
    """The xdist worker that ran the report's test (gw0, gw1, ...), or `main` without xdist."""
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    return getattr(gateway, "id", None) or "main"


def timed_tests(reports) -> list[TimedTest]:
    """pytest's reports (each with nodeid, when, duration, start, stop) gathered per test."""
    tests: dict[str, TimedTest] = {}
    for report in reports:
        test = tests.setdefault(report.nodeid, TimedTest(report.nodeid, worker_of(report), start=report.start))
        test.phases[report.when] = test.phases.get(report.when, 0.0) + report.duration
        test.start, test.stop = min(test.start, report.start), max(test.stop, report.stop)
    return list(tests.values())


def markdown(tests: list[TimedTest], listed_from: float = LISTED_FROM_S) -> str:
    if not tests:
        return "# Test durations\n\nNo test ran.\n"
    files: dict[str, list[TimedTest]] = defaultdict(list)
    for test in tests:
        files[test.file].append(test)
    begun, ended = min(t.start for t in tests), max(t.stop for t in tests)
    lines = [
        "# Test durations (pytest's reports: setup + call + teardown)",
        "",
        f"{len(tests)} tests in {len(files)} files; {ended - begun:,.0f} s from the first test's start to the last one's end.",
        "",
        "| file | worker | tests | wall s | starts at s | sum of the tests' s |",
        "|---|---|---|---|---|---|",
    ]
    rows = []
    for name, its in files.items():
        start, stop = min(t.start for t in its), max(t.stop for t in its)
        workers = ",".join(sorted({t.worker for t in its}))
        rows.append((stop - start, f"| {name} | {workers} | {len(its)} | {stop - start:,.1f} | {start - begun:,.0f} | "
                                   f"{sum(t.seconds for t in its):,.1f} |"))
    lines += [row for _, row in sorted(rows, key=lambda r: -r[0])]
    listed = [t for t in sorted(tests, key=lambda t: -t.seconds) if t.seconds >= listed_from]
    lines += [
        "",
        f"The {len(listed)} of {len(tests)} tests that took {listed_from:g} s or more, longest first:",
        "",
        "| test | worker | setup s | call s | teardown s | total s |",
        "|---|---|---|---|---|---|",
    ]
    for test in listed:
        phase = [f"{test.phases.get(p, 0.0):,.1f}" for p in ("setup", "call", "teardown")]
        lines.append(f"| {test.nodeid} | {test.worker} | {' | '.join(phase)} | {test.seconds:,.1f} |")
    return "\n".join(lines) + "\n"
