"""The launcher names a rank that failed on another machine, from hydra's report.

hydra prints no "Exit codes:" line then, only its BAD TERMINATION block with the host
(the whole path is exercised in test_multi_machine.py, over two simulated machines).
"""

from sbpflow.distributed.launch import describe_remote_failure

REPORT = b"""=   PID 7839 RUNNING AT 192.0.2.2
=   EXIT CODE: 9
"""


def test_the_rank_on_the_reported_host_is_named():
    hosts = ["192.0.2.1", "192.0.2.2"]
    assert describe_remote_failure(REPORT, hosts, 1) == [
        "rank 1 on host 192.0.2.2 ended with code 9 (or was killed by signal 9, SIGKILL) "
        "(the first failure)"]
    assert describe_remote_failure(REPORT, hosts, 4)[0].startswith(
        "one of ranks 4-7 on host 192.0.2.2 ended with code 9")


def test_unknown_host_or_no_report():
    assert describe_remote_failure(REPORT, ["node-a"], 2)[0].startswith(
        "a rank on host 192.0.2.2")
    assert describe_remote_failure(b"=   EXIT CODE: 3\n", ["node-a"], 1) == []
    code_200 = REPORT.replace(b"CODE: 9", b"CODE: 200")
    assert describe_remote_failure(code_200, ["192.0.2.2"], 1) == [
        "rank 0 on host 192.0.2.2 ended with code 200 (the first failure)"]


def test_exit_codes_of_every_machine_are_read():
    # hydra writes the codes of each further machine on a line of its own.
    import io
    import os

    from sbpflow.distributed.launch import _relay, rank_statuses

    read, write = os.pipe()
    os.write(write, b"rank 0: done\n[mpiexec@vm] Exit codes: [192.0.2.1] 0,0\n"
                    b"[192.0.2.2] 0,9\n[192.0.2.3] 0,0\nafter\n")
    os.close(write)
    out = io.BytesIO()
    try:
        exit_line = _relay(read, out)
    finally:
        os.close(read)
    assert rank_statuses(exit_line) == [0, 0, 0, 9, 0, 0]
    assert out.getvalue() == b"rank 0: done\nafter\n"
