"""The GCS emulator the tests start (gcp-storage-emulator's command line), less one of its bugs.

It parses a multipart upload (how gcsfs uploads an object under 50 MiB) with Python's email
parser, which reads the data's last byte as part of the line ending before the closing boundary
when it is a carriage return (0x0D): such an object is stored one byte short. An event file ends
with a checksum, so about one upload in 256 lost its last record's final byte, which the readers
then rightly took for a record cut short (real GCS stores every byte). Here a multipart upload's
parts are cut exactly at their boundaries; anything else goes to the emulator's own parsing.

    python tests/gcs_emulator.py start --host=127.0.0.1 --port=PORT --in-memory
"""

import base64
import http.server
import json
import re
import sys

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main

_emulators_read_data = server._read_data


def _read_data(request_handler, query):
    content_type = request_handler.headers.get("Content-Type") or ""
    boundary = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.startswith("multipart/related") or boundary is None:
        return _emulators_read_data(request_handler, query)
    raw = server._decode_raw_data(server._read_raw_data(request_handler), request_handler)
    delimiter = b"--" + boundary.group(1).encode()
    first = raw.index(delimiter) + len(delimiter)
    second = raw.index(delimiter, first) + len(delimiter)
    last = raw.rindex(delimiter)  # the closing one ("--" after it): the data may hold anything
    _, meta = _part(raw[first:second - len(delimiter)])
    headers, content = _part(raw[second:last])
    if headers.get(b"content-transfer-encoding", b"").lower() == b"base64":
        content = base64.b64decode(content)
    return {"meta": json.loads(meta), "content": content,
            "content-type": headers.get(b"content-type", b"application/octet-stream").decode()}


def _part(chunk: bytes):
    """(headers, body) of one part: the line ending after its boundary, its headers, a blank
    line, its body, the line ending before the next boundary (CRLF or LF, as the client wrote)."""
    newline = b"\r\n" if chunk.startswith(b"\r\n") else b"\n"
    head, body = chunk[len(newline):].split(newline * 2, 1)
    if not body.endswith(newline):
        raise ValueError("a multipart part without its line ending")
    headers = dict(line.split(b":", 1) for line in head.split(newline) if b":" in line)
    return {name.strip().lower(): value.strip() for name, value in headers.items()}, \
        body[:-len(newline)]


class _Server(http.server.HTTPServer):
    """The emulator's server, listening with room for a reader's concurrent requests: the
    standard library's backlog of 5 drops further connections' SYNs on loopback, each then
    retried by TCP a second later (`ranges.read_ranges` asks a store for dozens of ranges at
    once, as GCS serves them)."""

    request_queue_size = 128


server._read_data = _read_data
server.server.HTTPServer = _Server

if __name__ == "__main__":
    sys.exit(main())
