"""How the PyTorch rank scripts of the distributed tests end, so that a finished job exits 0."""

import faulthandler
import os
import sys

# An abort anywhere in a rank (a C++ std::terminate is SIGABRT) prints the Python stack, so a
# failure names where it happened instead of only "terminate called without an active exception".
faulthandler.enable()


def leave_together(distributed):
    """Ends this rank once every rank is done: a barrier, the process group destroyed, the output
    flushed, then ``os._exit(0)``, which skips interpreter finalization.

    Why not a plain exit: after all work and the group's destruction, PyTorch's gloo backend can
    still abort while the interpreter tears down (SIGABRT, "terminate called without an active
    exception": C++ threads and the FSDP/DeviceMesh references to the group are freed in no fixed
    order; pytorch/pytorch PR 179291 describes the same finalization race). It struck one rank of
    `test_sharded_statistics_equal_the_unsharded_model[fsdp2-2]` in one CI run, after that rank's
    work and the barrier were done, and did not recur in 60 runs of the same rank pair here. What
    the tests check (every statistic, step and file) is complete before this point.
    """
    distributed.barrier()  # a rank tearing down gloo while another still trains would abort it
    distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
