"""The launcher's messages: the failure summary's wording, and hostfile lines it refuses
(naming the file, the line number and the line) before mpiexec starts anything."""

import os
import signal

import pytest

from sbpflow.distributed import launch


def _exited(code: int) -> int:
    return code << 8  # a Linux wait status for exit(code)


def test_stopped_ranks_that_exited_keep_the_whole_verb():
    # rank 0 failed first; ranks 1 and 3 then exited by themselves, rank 2 was killed
    statuses = [_exited(5), _exited(1), signal.SIGKILL, _exited(1)]
    assert os.WIFEXITED(statuses[1]) and os.WEXITSTATUS(statuses[1]) == 1
    assert launch.describe_failures(statuses, culprit=0) == [
        "rank 0 exited with status 5 (the first failure)",
        "ranks 1, 3 were stopped because of it (exited with status 1)",
        "rank 2 was stopped because of it (killed by signal 9 (SIGKILL))",
    ]


def test_one_stopped_rank_that_exited():
    lines = launch.describe_failures([signal.SIGKILL, _exited(2)], culprit=0)
    assert lines[1] == "rank 1 was stopped because of it (exited with status 2)"


@pytest.mark.parametrize("line,problem", [
    ("localhost:abc", "'abc' is not a positive integer"),
    ("localhost:0", "'0' is not a positive integer"),
    ("localhost:-2", "'-2' is not a positive integer"),
    ("localhost:+2", "'+2' is not a positive integer"),
    ("localhost:4.5", "'4.5' is not a positive integer"),
    ("localhost:", "the slot count after ':' is empty"),
    (":4", "the host name is empty"),
    ("host:4:5", "more than one ':'"),
])
def test_malformed_hostfile_line_is_refused_naming_it(tmp_path, line, problem):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# machines\nnode-a:2\n\n{line}  # the bad one\nnode-c\n")
    with pytest.raises(SystemExit) as err:
        launch.read_hostfile(str(hostfile))
    msg = str(err.value)
    assert f"hostfile {hostfile}, line 4: " in msg
    assert repr(f"{line}  # the bad one") in msg
    assert problem in msg
    assert "host[:slots]" in msg


def test_build_command_refuses_a_malformed_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost:abc\n")
    with pytest.raises(SystemExit, match="line 1: 'localhost:abc'"):
        launch.build_command(2, str(hostfile), ["train.py"], mpiexec="/bin/mpiexec")


def test_well_formed_hostfile_lines_still_read(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a:1\nb:16 ifhn=eth0\n  c  \nd:04\n# e:abc\n")
    assert launch.read_hostfile(str(hostfile)) == ["a", "b", "c", "d"]
