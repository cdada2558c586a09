"""Real object stores on loopback for the tests: moto's S3 server and a GCS emulator, each a
process of its own, started once per test module and stopped (killed) at its end.

`Stores.environment` is what a reader (this process or a child) needs to reach them: the
endpoints (``AWS_ENDPOINT_URL``, TensorBoard's ``S3_ENDPOINT``, ``STORAGE_EMULATOR_HOST``), test
credentials, and gcsfs told
not to ask the emulator for the bucket's storage layout (a gRPC API the emulator does not
serve: gcsfs would retry it for minutes).
"""

import contextlib
import os
import socket
import subprocess
import sys
import time

from processes import free_ports

# Read by gcsfs when it is imported, which may come before the stores start: without it gcsfs
# asks the emulator for a gRPC API it does not serve, for minutes.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

START_TIMEOUT_S = 60
SCHEMES = ("s3", "gs")
BUCKET = "gradients-logs"
# A credential a test can look for in everything printed: it must never show.
SECRET = "tbg-secret-never-printed"


class Stores:
    def __init__(self, s3_port: str, gcs_port: str):
        self.s3_endpoint = f"http://127.0.0.1:{s3_port}"
        self.gcs_endpoint = f"http://127.0.0.1:{gcs_port}"
        self.environment = {
            # TensorBoard's own S3 reader (its Python loader) takes the endpoint from S3_ENDPOINT.
            "AWS_ENDPOINT_URL": self.s3_endpoint, "S3_ENDPOINT": self.s3_endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
            "STORAGE_EMULATOR_HOST": self.gcs_endpoint,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def filesystem(self, scheme: str):
        """An fsspec filesystem of ``scheme`` on its store (for the tests' own uploads)."""
        import fsspec

        return fsspec.filesystem(scheme, **({"token": "anon"} if scheme == "gs" else {}))

    def upload(self, local_dir, scheme: str, prefix: str) -> str:
        """Copies ``local_dir`` (its files and subdirectories) to ``prefix`` in the bucket of
        ``scheme``; returns the prefix's URL."""
        fs = self.filesystem(scheme)
        if not fs.exists(BUCKET):
            fs.mkdir(BUCKET)
        for directory, _, files in os.walk(local_dir):
            relative = os.path.relpath(directory, local_dir).replace(os.sep, "/")
            for name in files:
                target = f"{BUCKET}/{prefix}/{name}" if relative == "." else \
                    f"{BUCKET}/{prefix}/{relative}/{name}"
                fs.put_file(os.path.join(directory, name), target)
        return f"{scheme}://{BUCKET}/{prefix}"

    def child_environment(self, **changes):
        """``os.environ`` with the stores' variables (and ``changes``) for a child process."""
        return {**os.environ, **self.environment, **changes}


def _wait_for_port(port: str, process, what: str):
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode} at start")
        try:
            socket.create_connection(("127.0.0.1", int(port)), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on port {port} in {START_TIMEOUT_S} s")


def moto_command(port: str):
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", port]


@contextlib.contextmanager
def server(command, port: str, what: str, env=None):
    """Runs ``command`` (a server listening on ``port``) until the block ends, then kills it."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env)
    try:
        _wait_for_port(port, process, what)
        yield
    finally:
        process.kill()
        process.wait(timeout=30)


@contextlib.contextmanager
def running_stores():
    """Starts both servers; yields `Stores`, with their variables set in ``os.environ``."""
    s3_port, gcs_port = free_ports(2)
    # The emulator less a bug that cut an upload ending in a carriage return (`gcs_emulator`).
    gcs_command = [sys.executable, os.path.join(os.path.dirname(__file__), "gcs_emulator.py"),
                   "start", "--host=127.0.0.1", f"--port={gcs_port}", "--in-memory"]
    stores = Stores(s3_port, gcs_port)
    saved = {key: os.environ.get(key) for key in stores.environment}
    with contextlib.ExitStack() as servers:
        servers.enter_context(server(moto_command(s3_port), s3_port, "moto's S3 server"))
        servers.enter_context(server(gcs_command, gcs_port, "the GCS emulator"))
        os.environ.update(stores.environment)
        _forget_filesystems()
        try:
            yield stores
        finally:
            _forget_filesystems()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@contextlib.contextmanager
def stores_with_buckets():
    """`running_stores`, with the bucket made in each (`BUCKET`)."""
    with running_stores() as started:
        for scheme in SCHEMES:
            started.filesystem(scheme).mkdir(BUCKET)
        yield started


def _forget_filesystems():
    """Drops the fsspec filesystems this process made: each keeps the endpoint it was made with
    (another test module's servers, stopped since), and fsspec hands out the same one again."""
    import gcsfs
    import s3fs

    for filesystem in (s3fs.S3FileSystem, gcsfs.GCSFileSystem):
        filesystem.clear_instance_cache()
