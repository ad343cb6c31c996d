"""CI's record of the test time (tests/durations_record.py): every test's setup, call and teardown
and each file's wall time on its worker, written where .ci/run prints its records."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

from durations_record import markdown, timed_tests
from workflow import REPO


def report(nodeid, when, duration, start, worker="gw0"):
    return SimpleNamespace(nodeid=nodeid, when=when, duration=duration, start=start, stop=start + duration,
                           node=SimpleNamespace(gateway=SimpleNamespace(id=worker)))


def test_each_test_sums_its_phases_and_each_file_spans_its_tests_on_its_worker():
    reports = [
        report("tests/test_a.py::test_fixture", "setup", 100.0, 0.0), report("tests/test_a.py::test_fixture", "call", 2.0, 100.0),
        report("tests/test_a.py::test_fixture", "teardown", 1.0, 102.0), report("tests/test_a.py::test_next", "call", 3.0, 103.0),
        report("tests/test_b.py::test_alone", "call", 50.0, 10.0, worker="gw1"),
    ]
    tests = timed_tests(reports)
    assert {t.nodeid: t.seconds for t in tests} == {
        "tests/test_a.py::test_fixture": 103.0, "tests/test_a.py::test_next": 3.0, "tests/test_b.py::test_alone": 50.0}
    text = markdown(tests, listed_from=5)
    assert "3 tests in 2 files; 106 s from the first test's start to the last one's end." in text
    files = [line for line in text.splitlines() if line.startswith("| tests/test_") and ".py |" in line]
    assert files == ["| tests/test_a.py | gw0 | 2 | 106.0 | 0 | 106.0 |", "| tests/test_b.py | gw1 | 1 | 50.0 | 10 | 50.0 |"]
    assert "| tests/test_a.py::test_fixture | gw0 | 100.0 | 2.0 | 1.0 | 103.0 |" in text
    assert "The 2 of 3 tests that took 5 s or more, longest first:" in text and "test_next" not in text


def test_the_test_command_under_ci_writes_the_record_with_its_workers(tmp_path):
    """As .ci/run runs it: the test command's two workers, DRAFTLINE_CI_RECORDS set (these tests
    take under a second each, so they are counted in the files' table, not listed)."""
    env = dict(os.environ, DRAFTLINE_CI_RECORDS=str(tmp_path))
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_content_hash.py"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    text = (tmp_path / "test_durations.md").read_text()
    passed = int(run.stdout.split(" passed")[0].split()[-1])
    assert f"{passed} tests in 1 files;" in text, text
    row = next(line for line in text.splitlines() if line.startswith("| tests/test_content_hash.py |"))
    assert row.split(" | ")[1] in {"gw0", "gw1"} and row.split(" | ")[2] == str(passed), row
