"""`REQUESTS`: how many requests the plugin is answering, so that work in the background
(reading a long run, verifying an event file's checksums) pauses while any is: an overview or a
zoom must not share this machine's cores with work it does not need."""

import collections
import contextlib
import threading


class _Requests:
    """How many requests are being answered (`answering`); background work pauses between its
    pieces while any is (`wait_until_idle`, at most `YIELD_SECONDS` at a time)."""

    def __init__(self):
        self._threads = collections.Counter()  # thread -> requests it is answering
        self._idle = threading.Condition()

    @contextlib.contextmanager
    def answering(self):
        self._change(+1)
        try:
            yield
        finally:
            self._change(-1)

    @contextlib.contextmanager
    def waiting(self):
        """While the calling request waits for a background read (which must not wait for
        it), it does not count."""
        with self._idle:
            counted = self._threads[threading.get_ident()] > 0
        if counted:
            self._change(-1)
        try:
            yield
        finally:
            if counted:
                self._change(+1)

    def _change(self, by: int):
        with self._idle:
            self._threads[threading.get_ident()] += by
            if not self._threads[threading.get_ident()]:
                del self._threads[threading.get_ident()]
            if not self._threads:
                self._idle.notify_all()

    def wait_until_idle(self):
        with self._idle:
            self._idle.wait_for(lambda: not self._threads, timeout=YIELD_SECONDS)


# Background work waits at most this long for requests to finish before its next piece: a tab
# asking again and again must not stop it.
YIELD_SECONDS = 1.0
REQUESTS = _Requests()


def exiting() -> bool:
    """Whether Python is shutting down (TensorBoard was stopped): background work then fails
    (thread pools refuse new work) and ends without reporting it as an error."""
    return not threading.main_thread().is_alive()
