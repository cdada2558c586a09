"""Running the processes of one distributed test (ranks, workers, JAX processes) under a hard
timeout, so that a hang fails the test in minutes instead of eating CI's time."""

import concurrent.futures
import socket
import subprocess

import pytest

TIMEOUT_S = 240


def free_ports(count=1):
    """`count` distinct free loopback ports, as strings (all bound at once, so none repeats)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [str(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def run_processes(commands, what, env=None, timeout_s=TIMEOUT_S):
    """Starts every command at once; returns ``[(returncode, stdout, stderr)]`` in their order.

    All are killed at `timeout_s`, and the test fails naming `what` (e.g. "fsdp2 on 2 ranks").
    """
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env) for command in commands]
    # All pipes read at once: a process blocked on a full pipe while its peers wait for it in a
    # collective would otherwise look like a hang.
    with concurrent.futures.ThreadPoolExecutor(len(processes)) as readers:
        outputs = [readers.submit(process.communicate, timeout=timeout_s)
                   for process in processes]
        try:
            outputs = [output.result() for output in outputs]
        except subprocess.TimeoutExpired:
            pytest.fail(f"{what} did not finish in {timeout_s} s (a hang)")
        finally:
            for process in processes:
                process.kill()
    return [(process.returncode, *output) for process, output in zip(processes, outputs)]


def assert_succeeded(results, names):
    """Each process exited 0; else the failing one's name and the end of its stderr."""
    for name, (returncode, _, stderr) in zip(names, results):
        assert returncode == 0, f"{name} failed:\n{stderr[-3000:]}"
