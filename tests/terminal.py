"""A command run as in a terminal window: its output goes to a pseudo-terminal of a given width,
so a program that lays out for a terminal (the CLI's table) does so, where a pipe would not."""

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time


def run_in_terminal(args, columns: int, timeout: float = 300, **popen) -> str:
    """What ``args`` prints (stdout and stderr, as a terminal shows them) in a window
    ``columns`` characters wide; raises TimeoutError past ``timeout`` seconds."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    chunks = []
    deadline = time.monotonic() + timeout
    with subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                          **popen) as process:
        os.close(slave)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    process.kill()
                    raise TimeoutError(f"{args!r} ran past {timeout} s")
                if not select.select([master], [], [], left)[0]:
                    continue
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer has closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
        finally:
            os.close(master)
    # A terminal ends its lines with CR LF (its ONLCR mode).
    return b"".join(chunks).decode("utf-8", "backslashreplace").replace("\r\n", "\n")
