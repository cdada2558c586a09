"""TF-free reading and writing of TensorBoard event files (TFRecord framing of `Event` protos).

Only TensorBoard's own protobufs are used, never TensorFlow: this module works in a process where
`import tensorflow` fails (PyTorch/JAX users), and reading a logdir does not pay TF's start-up.
"""

import os
import socket
import struct
import threading
import time
from typing import Iterator

from tensorboard.compat.proto import event_pb2

try:  # A C implementation when installed; TensorBoard's pure-Python table otherwise.
    from google_crc32c import value as _crc32c
except ImportError:  # pragma: no cover - depends on the environment
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as _crc32c

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_FILE_COUNTER = iter(range(1 << 62))
_FILE_COUNTER_LOCK = threading.Lock()


def _masked_crc32c(data: bytes) -> int:
    crc = _crc32c(data) & 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def is_event_file(filename: str) -> bool:
    return "tfevents" in os.path.basename(filename)


class EventFileWriter:
    """Appends `Event` records to one new event file in `logdir`, created on first write."""

    def __init__(self, logdir: str, filename_suffix: str = ".gradients"):
        self.logdir = logdir
        self._suffix = filename_suffix
        self._file = None
        self._lock = threading.Lock()

    @property
    def path(self):
        return self._file.name if self._file else None

    def _open(self):
        os.makedirs(self.logdir, exist_ok=True)
        with _FILE_COUNTER_LOCK:
            counter = next(_FILE_COUNTER)
        # TensorBoard's naming; the pid and counter keep files of concurrent writers apart.
        name = "events.out.tfevents.%010d.%s.%d.%d%s" % (
            time.time(),
            socket.gethostname(),
            os.getpid(),
            counter,
            self._suffix,
        )
        self._file = open(os.path.join(self.logdir, name), "ab")
        self._write_record(
            event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()
        )

    def _write_record(self, data: bytes):
        header = struct.pack("<Q", len(data))
        self._file.write(
            header
            + struct.pack("<I", _masked_crc32c(header))
            + data
            + struct.pack("<I", _masked_crc32c(data))
        )

    def write(self, event: "event_pb2.Event"):
        with self._lock:
            if self._file is None:
                self._open()
            self._write_record(event.SerializeToString())

    def flush(self):
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self):
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_events(path: str) -> Iterator["event_pb2.Event"]:
    """Yields the events of one file; stops quietly at a record still being written.

    A record whose data checksum fails is skipped with its neighbours kept (as TensorBoard does),
    so one torn write cannot hide the rest of a run.
    """
    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, length_crc = _HEADER.unpack_from(data, offset)
        if _masked_crc32c(data[offset : offset + 8]) != length_crc:
            return  # corrupt framing: nothing after this point can be located
        start = offset + _HEADER.size
        end = start + length
        if end + _FOOTER.size > len(data):
            return  # the writer has not finished this record yet
        record = data[start:end]
        offset = end + _FOOTER.size
        if _masked_crc32c(record) != _FOOTER.unpack_from(data, end)[0]:
            continue
        event = event_pb2.Event()
        try:
            event.ParseFromString(record)
        except Exception:  # a DecodeError: skip the one bad record, keep the run
            continue
        yield event
