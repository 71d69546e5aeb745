"""A pytest plugin that appends each test's call time to a file as the test
finishes, so a run stopped by a timeout still says where its time went
(pytest's own ``--durations`` prints only at the end). Works with xdist: the
controller sees every worker's reports.

    PYTHONPATH=tools DURATIONS_LOG=durations.txt \\
        python -m pytest -p pytest_durations -n 8 tests -k cuda
    sort -rn durations.txt | head -40
"""

import os

_IN_WORKER = False


def pytest_configure(config):
    # An xdist worker sees its own reports and passes them to the
    # controller, which sees them again: only the controller logs.
    global _IN_WORKER
    _IN_WORKER = hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    if report.when == "call" and not _IN_WORKER:
        with open(os.environ.get("DURATIONS_LOG", "test_durations.txt"), "a") as log:
            log.write(f"{report.duration:.2f} {report.nodeid}\n")
