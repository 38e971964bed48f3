"""TLS: a real redis-server serving only TLS, with a CA and certificates made here by ``openssl``.

Worker processes connect with ``rediss://`` and ``--tls-ca-file`` and process a labelled
stream exactly once; a CA that did not sign the server's certificate fails at start with
one line; a server that requires client certificates accepts one given as
``cert_file``/``key_file``. Skipped when openssl or TLS support in redis-server is missing.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import msgpack
import pytest
import redis

from streamnb.exceptions import SettingsError
from streamnb_workers.replication.shards import load_model
from streamnb_workers.store.connection import RedisSettings, UrlConnector
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.worker import Worker, WorkerOptions
from tests.helpers.acl import (
    FEATURIZER,
    cli,
    drained,
    one_line_failure,
    start_worker_cli,
    stop,
    wait_until,
)
from tests.helpers.redis_server import REDIS_SERVER, RedisServer
from tests.helpers.workers import (
    assert_same_stats,
    count_spec,
    offline_model,
    produce,
    token_messages,
)

pytestmark = pytest.mark.redis

OPENSSL = shutil.which("openssl")


def openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN=streamnb test {name}", cwd=d)


def make_cert(d: Path, name: str, ca: str, san: str) -> None:
    """``name``.crt/.key signed by ``ca``, with subjectAltName ``san``."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}", cwd=d)
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    if OPENSSL is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_cert(d, "server", "ca", "IP:127.0.0.1,DNS:localhost")
    make_cert(d, "client", "ca", "DNS:streamnb-worker")
    return d


class TlsRedis(RedisServer):
    """A redis-server with no plain port, TLS on :attr:`port`."""

    def __init__(self, pki: Path, auth_clients: str = "no") -> None:
        self.pki = pki
        super().__init__(extra=["--tls-cert-file", str(pki / "server.crt"),
                                "--tls-key-file", str(pki / "server.key"),
                                "--tls-ca-cert-file", str(pki / "ca.crt"),
                                "--tls-auth-clients", auth_clients])

    def args(self) -> list[str]:
        a = super().args()
        i = a.index("--port")
        a[i + 1] = "0"
        return [*a, "--tls-port", str(self.port)]

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def client(self, **kw) -> redis.Redis:
        kw.setdefault("ssl_certfile", str(self.pki / "client.crt"))
        kw.setdefault("ssl_keyfile", str(self.pki / "client.key"))
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, ssl=True,
                           ssl_ca_certs=str(self.pki / "ca.crt"), **kw)


def start_tls(pki: Path, auth_clients: str = "no") -> TlsRedis:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    server = TlsRedis(pki, auth_clients)
    try:
        return server.start()
    except RuntimeError as exc:
        server.__exit__(None, None, None)
        if "tls" in str(exc).lower():
            pytest.skip(f"redis-server has no TLS support: {str(exc)[:200]}")
        raise


@pytest.fixture
def tls_redis(pki):
    server = start_tls(pki)
    yield server
    server.__exit__(None, None, None)


@pytest.mark.slow
def test_workers_process_a_stream_over_tls(tls_redis, pki, tmp_path):
    admin = tls_redis.client()
    name = "tls-mail"
    k = ModelKeys(name)
    msgs = token_messages(500, seed=21, labelled_share=0.8)
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    # error weight 1: the statistics are an offline partial_fit's
    procs = [start_worker_cli(tls_redis.url, name, f"tls-{i}", logs[i], "--tls-ca-file",
                              str(pki / "ca.crt"), "--error-weight", "1") for i in range(2)]
    try:
        wait_until(lambda: admin.hlen(k.workers) == 2, 60, "both workers' heartbeats", procs, logs)
        produce(admin, name, msgs)
        wait_until(lambda: drained(admin, name), 60, "the stream drained", procs, logs)
    finally:
        codes = stop(procs)
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    labelled = [m for m in msgs if "label" in m]
    model, _ = load_model(admin, name)
    assert_same_stats(model, offline_model("multinomial", {"n_features": 1024}, FEATURIZER, labelled))
    outs = [msgpack.unpackb(f[b"data"]) for _, f in admin.xrange(k.out)]
    assert sorted(o["id"] for o in outs) == sorted(m["id"] for m in msgs)
    assert len({o["worker"] for o in outs}) == 2
    # every client of the server is on TLS: there is no plain port at all
    assert tls_redis.client().config_get("port") == {"port": "0"}


def test_a_wrong_ca_fails_at_start_with_one_line(tls_redis, pki):
    t0 = time.monotonic()
    proc = cli("worker", "--redis", tls_redis.url, "--tls-ca-file", str(pki / "other-ca.crt"),
               "--model", "tls-wrong", "--kind", "multinomial", "--metrics-port", "0", timeout=60)
    line = one_line_failure(proc)
    assert "TLS handshake" in line and "certificate verify failed" in line, line
    assert time.monotonic() - t0 < 30
    assert tls_redis.client().dbsize() == 0  # nothing was written


def test_the_worker_api_reports_a_wrong_ca_as_a_settings_error(tls_redis, pki):
    settings = RedisSettings(tls_redis.url, ca_file=str(pki / "other-ca.crt"))
    w = Worker(UrlConnector(settings), [count_spec("tls-api")], WorkerOptions(consumer="t1"))
    with pytest.raises(SettingsError, match="TLS handshake with rediss://127.0.0.1"):
        w.run(install_signals=False)


def test_a_client_certificate_is_sent_when_the_server_requires_one(pki):
    server = start_tls(pki, auth_clients="yes")
    try:
        ca = str(pki / "ca.crt")
        with_cert = RedisSettings(server.url, ca_file=ca, cert_file=str(pki / "client.crt"),
                                  key_file=str(pki / "client.key"))
        assert with_cert.make_client().ping()
        without = RedisSettings(server.url, ca_file=ca).make_client()
        with pytest.raises(redis.ConnectionError):
            without.ping()
    finally:
        server.__exit__(None, None, None)


def test_status_over_tls_with_a_client_certificate_from_the_cli(pki):
    """--tls-cert-file/--tls-key-file reach the client; a half-given pair is one line, exit 2."""
    server = start_tls(pki, auth_clients="yes")
    try:
        ca, crt, key = str(pki / "ca.crt"), str(pki / "client.crt"), str(pki / "client.key")
        ok = cli("status", "--redis", server.url, "--tls-ca-file", ca, "--tls-cert-file", crt,
                 "--tls-key-file", key, "--model", "tls-cert", "--json", timeout=60)
        # refused as a model that does not exist: the TLS session worked (it read Redis)
        assert ok.returncode == 2 and "'tls-cert' does not exist" in ok.stderr, ok.stderr
        half = cli("status", "--redis", server.url, "--tls-ca-file", ca, "--tls-cert-file", crt,
                   "--model", "tls-cert", timeout=60)
        assert "go together" in one_line_failure(half)
    finally:
        server.__exit__(None, None, None)
