"""A redis-server that speaks only TLS (``--port 0 --tls-port ...``) and requires a client
certificate, with an ACL user and the default user off; the CA, server and client certificates
are made by ``openssl`` in a temp dir.

Without ``redis-server`` (built with TLS, as Debian's is) and ``openssl`` on PATH the TLS tests
are skipped, except in CI (``CI`` set), where that is a failure (.ci/run installs them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis

import drumbeat
from tests.conftest import _free_port

MISSING = (
    "the TLS tests need redis-server (built with TLS) and openssl on PATH "
    "(Debian: apt-get install redis-server openssl)"
)
USER, PASSWORD = "drumbeat", "s3cret-pass"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(where: Path) -> None:
    """A CA, and a server and a client certificate it signed (the server's for localhost and
    127.0.0.1): ca.crt, server.crt/.key, client.crt/.key."""
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=drumbeat test CA", cwd=where)  # fmt: skip
    (where / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    (where / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=drumbeat test {name}", cwd=where)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                 "-extfile", f"{name}.ext", cwd=where)  # fmt: skip


def tls_options(certs: Path | None) -> dict[str, Any]:
    """redis-py's options for a client of a TLS node whose certificates are in ``certs``
    (none for a plain node)."""
    if certs is None:
        return {}
    return {"ssl": True, "ssl_ca_certs": str(certs / "ca.crt"), "ssl_cert_reqs": "required",
            "ssl_certfile": str(certs / "client.crt"),
            "ssl_keyfile": str(certs / "client.key")}  # fmt: skip


def tls_args(certs: Path) -> list[str]:
    """redis-server's arguments for TLS with the certificates in ``certs``, client certificates
    required, TLS for replication (and the cluster bus, if clustered) too; the port is the
    caller's (``--port 0 --tls-port N``)."""
    return ["--tls-replication", "yes", "--tls-auth-clients", "yes",
            "--tls-cert-file", str(certs / "server.crt"),
            "--tls-key-file", str(certs / "server.key"),
            "--tls-ca-cert-file", str(certs / "ca.crt")]  # fmt: skip


class TlsServer:
    """redis-server on a TLS port only, client certificates required, one ACL user."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="drumbeat-tls-", dir="/tmp"))
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(
        self,
        user: str = USER,
        password: str = PASSWORD,
        *,
        client_cert: bool = True,
        **options: str,
    ) -> str:
        """A ``rediss://`` URL with the CA, the client certificate (unless told otherwise) and
        ``options`` in its query string."""
        query = {"ssl_ca_certs": str(self.dir / "ca.crt"), "ssl_cert_reqs": "required"}
        if client_cert:
            query |= {"ssl_certfile": str(self.dir / "client.crt"),
                      "ssl_keyfile": str(self.dir / "client.key")}  # fmt: skip
        query |= options
        return f"rediss://{user}:{password}@localhost:{self.port}/0?{urlencode(query)}"

    def start(self) -> None:
        make_certificates(self.dir)
        conf = self.dir / "redis.conf"
        conf.write_text(
            "\n".join([
                "port 0", f"tls-port {self.port}", "bind 127.0.0.1", f"dir {self.dir}",
                f"logfile {self.dir / 'redis.log'}",
                "tls-cert-file server.crt", "tls-key-file server.key",
                "tls-ca-cert-file ca.crt", "tls-auth-clients yes",
                "user default off",
                f"user {USER} on >{PASSWORD} ~* &* +@all",
                'save ""', "appendonly no", "maxmemory-policy noeviction",
            ]) + "\n"
        )  # fmt: skip
        # Relative certificate paths: redis-server reads them after moving to `dir`.
        self.proc = subprocess.Popen(
            [self.binary, str(conf)], cwd=self.dir,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        client = redis.Redis.from_url(self.url())
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError as exc:
                    if self.proc.poll() is not None:
                        log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                        raise RuntimeError(f"{self.binary} with TLS did not start:\n{log}") from exc
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{self.binary} with TLS did not answer: {exc}") from exc
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def tls_redis() -> Iterator[TlsServer]:
    binary = shutil.which("redis-server")
    if binary is None or shutil.which("openssl") is None:
        if os.environ.get("CI"):
            pytest.fail(f"{MISSING}; CI must run the TLS tests (.ci/run installs them)")
        pytest.skip(MISSING)
    server = TlsServer(binary)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
async def tls_app(tls_redis: TlsServer) -> AsyncIterator[drumbeat.App]:
    app = drumbeat.App(tls_redis.url(), namespace="t" + uuid.uuid4().hex[:12])
    yield app
    await app.aclose()
