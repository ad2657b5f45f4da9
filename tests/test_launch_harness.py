"""The multi-process harness runs a job again only when its job store lost the port the
launcher chose for it (tests/multiproc/launch.py), never for a failure of the job."""

from tests.multiproc.launch import LaunchResult, lost_master_port

LAUNCHER = ("LAUNCH INFO ------------------------- ERROR LOG DETAIL -------------------------\n"
            "{'PADDLE_MASTER': '127.0.0.1:46022', 'PADDLE_GLOBAL_RANK': '0'}\n")
BIND_FAILED = ("ValueError: (InvalidArgument) Bind network on IP_ANY:46022 failed.\n"
               "  [Hint: Expected sockfd > 0, but received sockfd:-1 <= 0:0.]\n")


def result(rc: int, rank0: str, output: str = LAUNCHER, timed_out: bool = False) -> LaunchResult:
    return LaunchResult(rc, 5.4, output, {0: rank0, 1: "Retry to connect to 127.0.0.1:46022"}, timed_out)


def test_the_job_store_that_lost_its_port_is_named():
    assert lost_master_port(result(1, BIND_FAILED)) == 46022
    assert lost_master_port(result(1, "OSError: [Errno 98] Address already in use: 127.0.0.1:46022")) == 46022


def test_any_other_failure_is_the_jobs():
    assert lost_master_port(result(0, BIND_FAILED)) is None  # it ran
    assert lost_master_port(result(1, BIND_FAILED, timed_out=True)) is None
    assert lost_master_port(result(1, BIND_FAILED.replace("46022", "46023"))) is None  # another port: a gloo pair's
    assert lost_master_port(result(1, "AssertionError: grads differ")) is None
    assert lost_master_port(result(1, BIND_FAILED, output="LAUNCH INFO Exit code 1\n")) is None  # no master named
