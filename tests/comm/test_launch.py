"""The launcher: rank variables per rank, hostfiles, modules, and plain mpiexec's variables."""

import platform
import socket

from .conftest import launcher_cmd, mpiexec_cmd, run_job, script


def _env_lines(job):
    assert job.returncode == 0, job.output
    rows = [dict(kv.split("=", 1) for kv in line.split("\t")[1:])
            for line in job.stdout.splitlines() if line.startswith("ENV\t")]
    return sorted(rows, key=lambda row: int(row["get_rank"]))


def test_launcher_sets_rank_variables():
    rows = _env_lines(run_job(launcher_cmd(2, script("print_env.py"), "a", "b c"), timeout=60))
    assert len(rows) == 2
    for r, row in enumerate(rows):
        assert row["RANK"] == row["get_rank"] == str(r)
        assert row["WORLD_SIZE"] == row["get_world_size"] == "2"
        assert row["LOCAL_RANK"] == row["get_local_rank"] == row["MPI_LOCALRANKID"] == str(r)
        assert row["LOCAL_WORLD_SIZE"] == "2" and row["get_node_size"] == "1"
        assert row["argv"] == "a,b c"


def test_launcher_hostfile_places_n_ranks_per_machine(tmp_path):
    # Two "machines" that are both this one: hydra starts a proxy for each, as it would
    # over ssh, and numbers the ranks machine by machine.
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# two machines\n{socket.gethostname()}:8\nlocalhost\n")
    rows = _env_lines(run_job(launcher_cmd(2, script("print_env.py"), hostfile=str(hostfile)),
                              timeout=60))
    assert [row["RANK"] for row in rows] == ["0", "1", "2", "3"]
    for r, row in enumerate(rows):
        assert row["WORLD_SIZE"] == "4" and row["LOCAL_WORLD_SIZE"] == "2"
        # The launcher's LOCAL_RANK agrees with where hydra put the rank.
        assert row["LOCAL_RANK"] == row["MPI_LOCALRANKID"] == str(r % 2)


def test_launcher_runs_a_module():
    job = run_job(launcher_cmd(2, "-m", "platform"), timeout=60)
    assert job.returncode == 0, job.output
    # Both ranks print one line; mpiexec forwards their unbuffered writes as they come, so the
    # two lines may interleave (text, text, newline, newline). Count the platform string itself.
    assert job.stdout.count(platform.platform()) == 2, job.output


def test_plain_mpiexec_gets_rank_variables_on_import():
    rows = _env_lines(run_job(mpiexec_cmd(2, script("print_env.py")), timeout=60))
    assert [(row["RANK"], row["WORLD_SIZE"], row["LOCAL_RANK"]) for row in rows] == [
        ("0", "2", "0"), ("1", "2", "1")]
