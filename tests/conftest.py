"""Test-session plumbing shared by all test folders."""

import os
import tempfile

import pytest

# Every Job a test compiles is verified after each graph pass (placements and SBPs too).
os.environ.setdefault("SBPFLOW_CHECK_JOBS", "1")


# Under `mpiexec -n N python -m pytest ...`, a test failing on one rank would leave the others
# blocked in their next collective: end the whole job at once, naming the rank and the test.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        from sbpflow.comm import abort_job, env

        if env.is_multi_process():
            abort_job(f"test {item.nodeid} failed ({report.when}); ending the job\n"
                      f"{report.longreprtext}")


def pytest_configure(config):
    # The SBP validator's report of plausible-but-undeclared signatures is written by whichever
    # process runs the test (xdist workers too) and printed once by the controller.
    if "SBPFLOW_SBP_REPORT" not in os.environ:
        fd, path = tempfile.mkstemp(prefix="sbpflow-sbp-report-", suffix=".txt")
        os.close(fd)
        os.environ["SBPFLOW_SBP_REPORT"] = path
        config._sbp_report_owner = True


@pytest.fixture
def sbp_report():
    class _Report:
        def append(self, line: str) -> None:
            with open(os.environ["SBPFLOW_SBP_REPORT"], "a") as f:
                f.write(line + "\n")

    return _Report()


def pytest_terminal_summary(terminalreporter, config):
    if not getattr(config, "_sbp_report_owner", False):
        return
    path = os.environ.pop("SBPFLOW_SBP_REPORT", None)
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        lines = sorted(set(f.read().splitlines()))
    os.unlink(path)
    if lines:
        terminalreporter.section("SBP signatures that hold but are not declared")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    # Tests that check kernel errors may leave one unread; at interpreter exit the VM would
    # report it and force exit status 1 (tests/vm/test_unobserved_errors.py checks that in
    # a subprocess). Here such leftovers belong to tests that already passed: drain them.
    from sbpflow.vm import machine

    if machine._vm is not None:
        machine._vm.report_unobserved()
