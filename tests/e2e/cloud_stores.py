"""Real local object-store servers for the cloud repository tests, and a proxy that breaks downloads.

- S3: moto's server mode (ThreadedMotoServer, in this process).
- GCS: gcp-storage-emulator (PyPI; in this process).
- Azure: Azurite (npm), a subprocess; `make azurite` installs it into tests/.node (CI does when npm exists).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
AZURITE_BIN = REPO_ROOT / "tests" / ".node" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's well-known development account (public, documented by Microsoft)
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f}s") from None
            time.sleep(0.05)


def walk_files(src: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(src.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            yield path.relative_to(src).as_posix(), path


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        wait_port(port)
        yield f"127.0.0.1:{port}"
    finally:
        server.stop()


@contextlib.contextmanager
def gcs_server() -> Iterator[str]:
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def azurite_missing() -> str:
    if AZURITE_BIN.exists():
        return ""
    if shutil.which("npm") is None:
        return "Azurite is not installed and npm is missing (install Node.js, then `make azurite`)"
    return f"Azurite is not installed ({AZURITE_BIN} missing): run `make azurite`"


@contextlib.contextmanager
def azurite_server(workdir: Path) -> Iterator[str]:
    port = free_port()
    log = open(workdir / "azurite.log", "wb")  # noqa: SIM115 - closed after the process ends
    proc = subprocess.Popen([str(AZURITE_BIN), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                             "--location", str(workdir), "--silent", "--skipApiVersionCheck", "--loose",
                             "--disableTelemetry"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        try:
            wait_port(port, proc=proc)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {(workdir / 'azurite.log').read_text()[-2000:]}") from None
        yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


class BreakingProxy:
    """An HTTP/1.1 proxy, one request per connection, that damages the answers to requests whose
    target contains `marker`:

    - mode "cut": the answer's headers and half its body, then the connection closes (a network error
      mid-download; the Content-Length still announces the whole object);
    - mode "short": Content-Length rewritten to half and half the body sent (a partial object that
      looks complete to HTTP);
    - mode "stall": headers and half the body, then nothing until the proxy closes (a hung server);
    - mode "pass": untouched.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.mode = "pass"
        self.marker = b""
        self.damaged = 0
        self.hits = 0  # requests whose target contains the marker
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self._stop = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop = True
        self._closed.set()
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        self._thread.join(timeout=5)
        self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            conn, _ = self.sock.accept()
            if self._stop:
                conn.close()
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_message(sock: socket.socket, buf: bytes = b"") -> tuple[bytes, bytes] | None:
        """(headers, body) of one request: the body by Content-Length."""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            rest += chunk
        return head, rest

    @staticmethod
    def _set_header(head: bytes, name: bytes, value: bytes) -> bytes:
        lines = [ln for ln in head.split(b"\r\n") if ln.partition(b":")[0].strip().lower() != name.lower()]
        return b"\r\n".join([*lines, name + b": " + value])

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            msg = self._read_message(conn)
            if msg is None:
                return
            head, body = msg
            target = head.split(b"\r\n", 1)[0]
            marked = bool(self.marker) and self.marker in target and not target.startswith(b"HEAD")
            self.hits += marked
            damage = marked and self.mode != "pass"
            head = self._set_header(head, b"Connection", b"close")
            with socket.create_connection(("127.0.0.1", self.upstream_port), timeout=30) as up:
                up.sendall(head + b"\r\n\r\n" + body)
                answer = b""
                while True:
                    chunk = up.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            rhead, _, rbody = answer.partition(b"\r\n\r\n")
            if not damage or len(rbody) < 2:
                conn.sendall(answer)
                return
            self.damaged += 1
            half = len(rbody) // 2
            if self.mode == "short":
                rhead = self._set_header(rhead, b"Content-Length", str(half).encode())
            conn.sendall(rhead + b"\r\n\r\n" + rbody[:half])
            if self.mode == "cut":
                conn.shutdown(socket.SHUT_RDWR)
            elif self.mode == "stall":
                self._closed.wait(60)


def upload_s3(endpoint: str, bucket: str, prefix: str, src: Path, key_id: str = "testing",
              secret: str = "testing", create: bool = True) -> Callable[[str, bytes], None]:
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://{endpoint}", aws_access_key_id=key_id,
                          aws_secret_access_key=secret, region_name="us-east-1")
    if create:
        client.create_bucket(Bucket=bucket)

    def put(rel: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=f"{prefix}{rel}", Body=data)

    for rel, path in walk_files(src):
        put(rel, path.read_bytes())
    return put


def upload_gcs(endpoint: str, bucket: str, prefix: str, src: Path) -> Callable[[str, bytes], None]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": endpoint})
    b = client.create_bucket(bucket)

    def put(rel: str, data: bytes) -> None:
        b.blob(f"{prefix}{rel}").upload_from_string(data)

    for rel, path in walk_files(src):
        put(rel, path.read_bytes())
    return put


def upload_azure(endpoint: str, container: str, prefix: str, src: Path) -> Callable[[str, bytes], None]:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient(account_url=endpoint,
                                credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY})
    client = service.create_container(container)

    def put(rel: str, data: bytes) -> None:
        client.upload_blob(f"{prefix}{rel}", data, overwrite=True)

    for rel, path in walk_files(src):
        put(rel, path.read_bytes())
    return put

