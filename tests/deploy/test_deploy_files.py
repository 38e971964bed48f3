"""The deployment files (deploy/) are ones an operator can use as they are.

Static checks: every YAML/JSON parses; compose, Kubernetes and systemd files have the fields
the operating guide relies on and agree with each other and with the worker's flags. Live
checks: the production redis.conf and users.acl are loaded by a real redis-server (started on
a free port), whose ACL lets the worker user run the worker's commands, including the real
commit script, on streamnb:* keys only; the Dockerfile's HEALTHCHECK passes against a live
/metrics endpoint and fails against a dead one. No Docker, no network.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
import yaml
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamnb_workers.cli.main import build_parser
from streamnb_workers.store.commit import CacheWrite, CommitRequest, commit_batch
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.label_cache import fetch_cached
from tests.helpers.redis_server import REDIS_SERVER, RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
ACL_FILE = DEPLOY / "redis" / "users.acl"
REDIS_CONF = DEPLOY / "redis" / "redis.conf"
UNIT = DEPLOY / "systemd" / "streamnb-worker@.service"
ENV_EXAMPLE = DEPLOY / "systemd" / "streamnb.env.example"
DOCKERFILE = DEPLOY / "Dockerfile"

#: The worker's default metrics port (DEFAULT_METRICS_PORT in the worker CLI).
METRICS_PORT = 9500
def worker_flags() -> set[str]:
    """The `streamnb worker` settings, from the CLI's parser."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(getattr(a, "choices", None), dict))
    dests = {a.dest for a in sub.choices["worker"]._actions if a.option_strings}
    return dests | {"redis_url", "redis_password"}


def load_yaml_docs(path: Path) -> list[Any]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def acl_users() -> dict[str, list[str]]:
    """user name -> its rules, from deploy/redis/users.acl."""
    users = {}
    for line in ACL_FILE.read_text().splitlines():
        words = line.split()
        if words:
            assert words[0] == "user", f"users.acl line must start with 'user': {line!r}"
            users[words[1]] = words[2:]
    return users


def password_matches(user: str, password: str) -> bool:
    """Whether ``password`` is the one users.acl gives ``user`` (as #sha256 or >plain)."""
    rules = acl_users()[user]
    digest = hashlib.sha256(password.encode()).hexdigest()
    return f"#{digest}" in rules or f">{password}" in rules


def compose_default(value: str) -> str:
    """Expand ``${VAR:-default}`` to its default, as compose does with VAR unset."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


# ------------------------------------------------------------------------------ parsing
def test_every_yaml_and_json_file_under_deploy_parses() -> None:
    files = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml", ".json"))
    assert COMPOSE in files and (K8S / "kustomization.yaml") in files
    for path in files:
        if path.suffix == ".json":
            json.loads(path.read_text())
        else:
            assert load_yaml_docs(path), f"{path} holds no YAML document"


# ------------------------------------------------------------------------------ compose
@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    (doc,) = load_yaml_docs(COMPOSE)
    return doc


def bind_sources(service: dict[str, Any]) -> list[tuple[Path, str]]:
    """(host path, container path) of each bind mount of a compose service."""
    out = []
    for vol in service.get("volumes", []):
        src, target = compose_default(vol).split(":")[:2]
        if src.startswith((".", "/")):
            out.append(((DEPLOY / src).resolve(), target))
    return out


def test_compose_has_the_four_services(compose: dict[str, Any]) -> None:
    assert {"redis", "worker", "prometheus", "grafana"} <= set(compose["services"])


def test_compose_files_it_references_exist(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for src, _ in bind_sources(service):
            assert src.exists(), f"compose service {name} mounts {src}, which does not exist"
    build = compose["services"]["worker"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert (context / build["dockerfile"]).is_file()
    assert (context / "pyproject.toml").is_file(), "the build context must be the repo root"
    named = {compose_default(v).split(":")[0] for s in compose["services"].values()
             for v in s.get("volumes", []) if not compose_default(v).startswith((".", "/"))}
    assert named <= set(compose.get("volumes", {})), "every named volume is declared"


def test_compose_worker_scales(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    assert "container_name" not in worker, "container_name breaks --scale worker=N"
    assert "ports" not in worker, "fixed host ports break --scale worker=N"
    env = worker["environment"]
    assert int(env["STREAMNB_METRICS_PORT"]) == METRICS_PORT
    assert [int(p) for p in worker["expose"]] == [METRICS_PORT]
    assert env["STREAMNB_METRICS_ADDR"] == "0.0.0.0", "a container must listen beyond loopback"
    assert int(worker["stop_grace_period"].rstrip("s")) > int(compose_default(env["STREAMNB_BLOCK_MS"])) / 1000


def test_compose_worker_settings_are_worker_flags(compose: dict[str, Any]) -> None:
    flags = worker_flags()
    for var in compose["services"]["worker"]["environment"]:
        assert var.startswith("STREAMNB_") and var[len("STREAMNB_"):].lower() in flags, var


def test_compose_redis_is_7_with_aof_acl_and_a_data_volume(compose: dict[str, Any]) -> None:
    r = compose["services"]["redis"]
    assert re.match(r"redis:7\.", r["image"])
    targets = dict((t, s) for s, t in bind_sources(r))
    command = r["command"]
    conf_in_container = command[1]
    assert targets[conf_in_container] == REDIS_CONF.resolve()
    acl_in_container = command[command.index("--aclfile") + 1]
    assert targets[acl_in_container] == ACL_FILE.resolve()
    assert any(v.startswith("redis-data:/data") for v in r["volumes"])
    assert command[command.index("--dir") + 1] == "/data"


def test_compose_passwords_match_the_acl(compose: dict[str, Any]) -> None:
    url = urlsplit(compose_default(compose["services"]["worker"]["environment"]["STREAMNB_REDIS"]))
    assert url.scheme == "redis" and url.hostname == "redis" and url.port == 6379
    assert url.username == "streamnb-worker"
    assert password_matches("streamnb-worker", url.password)
    health = compose["services"]["redis"]
    assert password_matches("streamnb-worker", compose_default(health["environment"]["REDISCLI_AUTH"]))
    assert "--user streamnb-worker" in " ".join(health["healthcheck"]["test"])


def test_compose_prometheus_discovers_workers_by_dns(compose: dict[str, Any]) -> None:
    prom_yml = DEPLOY / "prometheus" / "prometheus.yml"
    (config,) = load_yaml_docs(prom_yml)
    sd = [sd for job in config.get("scrape_configs", []) for sd in job.get("dns_sd_configs", [])]
    assert any("worker" in sd.get("names", []) and int(sd.get("port", 0)) == METRICS_PORT
               and sd.get("type", "A") == "A" for sd in sd), sd
    for rule_file in config.get("rule_files", []):
        name = Path(rule_file).name
        assert (prom_yml.parent / name).is_file(), f"rule file {rule_file} is not in deploy/prometheus"
    mounts = dict(bind_sources(compose["services"]["prometheus"]))
    assert mounts[(DEPLOY / "prometheus").resolve()] == "/etc/prometheus"


def test_compose_grafana_mounts_match_the_provisioning(compose: dict[str, Any]) -> None:
    providers = sorted((DEPLOY / "grafana" / "provisioning" / "dashboards").glob("*.y*ml"))
    assert providers, "deploy/grafana/provisioning/dashboards holds no provider"
    mounts = {src: target for src, target in bind_sources(compose["services"]["grafana"])}
    dashboards_target = mounts[(DEPLOY / "grafana" / "dashboards").resolve()]
    paths = [p["options"]["path"] for f in providers for d in load_yaml_docs(f)
             for p in d.get("providers", [])]
    assert paths and all(p.rstrip("/").startswith(dashboards_target) for p in paths), paths
    assert list((DEPLOY / "grafana" / "dashboards").glob("*.json"))


# ------------------------------------------------------------------------------ Dockerfile
def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_slim_non_root_with_the_worker_entrypoint() -> None:
    ins = dockerfile_instructions()
    bases = [rest for word, rest in ins if word == "FROM"]
    assert bases and all("python:" in b and "slim" in b for b in bases), bases
    users = [rest for word, rest in ins if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert any(re.search(r"useradd .*--uid \$\{STREAMNB_UID\}", r) for w, r in ins if w == "RUN")
    assert json.loads(dict(ins)["ENTRYPOINT"]) == ["streamnb", "worker"]
    assert any(w == "RUN" and "pip install" in r and " ." in r for w, r in ins)
    assert str(METRICS_PORT) in dict(ins)["EXPOSE"].split()
    assert not [r for w, r in ins if w in ("RUN", "HEALTHCHECK") and re.search(r"\b(curl|wget)\b", r)]


def healthcheck_command() -> list[str]:
    rest = dict(dockerfile_instructions())["HEALTHCHECK"]
    return json.loads(rest[rest.index("CMD") + 3:].strip())


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path in ("/metrics", "/healthz") else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"streamnb_worker_up 1\n")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_dockerfile_healthcheck_passes_on_live_metrics_and_fails_on_dead(metrics_server: int) -> None:
    cmd = healthcheck_command()
    assert cmd[0] == "python"
    cmd[0] = sys.executable
    ok = subprocess.run(cmd, env={"STREAMNB_METRICS_PORT": str(metrics_server)},
                        capture_output=True, timeout=20)
    assert ok.returncode == 0, ok.stderr
    dead = subprocess.run(cmd, env={"STREAMNB_METRICS_PORT": str(free_port())},
                          capture_output=True, timeout=20)
    assert dead.returncode != 0


def test_dockerignore_keeps_the_package_and_drops_the_rest() -> None:
    patterns = {p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")}
    assert {".git", ".venv", "tests", "**/*.rdb", ".env"} <= patterns
    assert not {"streamnb", "workers", "pyproject.toml", "README.md", "*"} & patterns


# ------------------------------------------------------------------------------ Kubernetes
@pytest.fixture(scope="module")
def k8s() -> dict[str, dict[str, Any]]:
    """kind -> manifest, for every resource the kustomization lists (plus the optional ones)."""
    (kustomization,) = load_yaml_docs(K8S / "kustomization.yaml")
    by_kind: dict[str, dict[str, Any]] = {"Kustomization": kustomization}
    files = list(kustomization["resources"]) + ["secret.example.yaml", "servicemonitor.yaml"]
    for name in files:
        path = K8S / name
        assert path.is_file(), f"kustomization lists {name}, which does not exist"
        for doc in load_yaml_docs(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), f"{name}: {doc}"
            assert doc["metadata"].get("name"), f"{name}: {doc['kind']} without a name"
            by_kind[doc["kind"]] = doc
    return by_kind


def test_k8s_base_lists_every_required_resource(k8s: dict[str, dict[str, Any]]) -> None:
    required = {"Namespace", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                "ScaledObject", "TriggerAuthentication"}
    assert required <= set(k8s)
    assert k8s["Kustomization"]["namespace"] == k8s["Namespace"]["metadata"]["name"]
    assert "secret.example.yaml" not in k8s["Kustomization"]["resources"], "no password in a base"


def worker_container(k8s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (container,) = k8s["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def test_k8s_deployment_resources_probes_and_grace(k8s: dict[str, dict[str, Any]]) -> None:
    spec = k8s["Deployment"]["spec"]
    pod = spec["template"]["spec"]
    c = worker_container(k8s)
    config = k8s["ConfigMap"]["data"]
    for kind in ("requests", "limits"):
        assert c["resources"][kind]["memory"], kind
    assert c["resources"]["requests"]["cpu"]
    (port,) = c["ports"]
    assert port["containerPort"] == int(config["STREAMNB_METRICS_PORT"]) == METRICS_PORT
    # /healthz fails once the worker has been without Redis for --healthz-grace; the
    # startup probe only waits for the process to serve
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/healthz"),
                        ("startupProbe", "/metrics")):
        get = c[probe]["httpGet"]
        assert get["path"] == path and get["port"] in (port["name"], port["containerPort"])
    assert config["STREAMNB_METRICS_ADDR"] == "0.0.0.0"
    block_s = int(config["STREAMNB_BLOCK_MS"]) / 1000
    assert pod["terminationGracePeriodSeconds"] > block_s + 10, "grace must exceed a batch"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, "upgrade one by one"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    labels = pod_labels(k8s)
    assert spec["selector"]["matchLabels"].items() <= labels.items()


def pod_labels(k8s: dict[str, dict[str, Any]]) -> dict[str, str]:
    return k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]


def test_k8s_settings_come_from_the_configmap_and_the_secret(k8s: dict[str, dict[str, Any]]) -> None:
    c = worker_container(k8s)
    flags = worker_flags()
    assert c["envFrom"][0]["configMapRef"]["name"] == k8s["ConfigMap"]["metadata"]["name"]
    for var in k8s["ConfigMap"]["data"]:
        assert var[len("STREAMNB_"):].lower() in flags, var
    env = {e["name"]: e for e in c["env"]}
    ref = env["STREAMNB_REDIS"]["valueFrom"]["secretKeyRef"]
    secret = k8s["Secret"]
    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
    url = urlsplit(secret["stringData"][ref["key"]])
    assert url.username == "streamnb-worker" and password_matches("streamnb-worker", url.password)
    for e in env:
        assert e[len("STREAMNB_"):].lower() in flags, e


def test_k8s_service_pdb_and_monitor_select_the_workers(k8s: dict[str, dict[str, Any]]) -> None:
    labels = pod_labels(k8s)
    svc = k8s["Service"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == worker_container(k8s)["ports"][0]["name"]
    # readiness reads /healthz: a worker without Redis is not ready, and still scraped
    assert svc["spec"]["publishNotReadyAddresses"] is True
    pdb = k8s["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert ("maxUnavailable" in pdb["spec"]) != ("minAvailable" in pdb["spec"])
    monitor = k8s["ServiceMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    annotations = k8s["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == METRICS_PORT


def test_k8s_keda_scales_on_the_consumer_group_lag(k8s: dict[str, dict[str, Any]]) -> None:
    so = k8s["ScaledObject"]["spec"]
    assert so["scaleTargetRef"]["name"] == k8s["Deployment"]["metadata"]["name"]
    assert 1 <= so["minReplicaCount"] < so["maxReplicaCount"]
    (trigger,) = so["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "redis-streams"
    model = k8s["ConfigMap"]["data"]["STREAMNB_MODEL"]
    assert meta["stream"] == f"streamnb:{{{model}}}:in"
    assert meta["consumerGroup"] == GROUP
    assert int(meta["lagCount"]) > 0 and int(meta["activationLagCount"]) >= 0
    assert "pendingEntriesCount" not in meta and "streamLength" not in meta
    auth = k8s["TriggerAuthentication"]
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    secret = k8s["Secret"]["stringData"]
    params = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert {r["name"] for r in params.values()} == {k8s["Secret"]["metadata"]["name"]}
    user, password = secret[params["username"]["key"]], secret[params["password"]["key"]]
    assert user == "streamnb-keda" and password_matches(user, password)


# ------------------------------------------------------------------------------ systemd
def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as section -> key -> values (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            assert line.endswith("]"), raw
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"not KEY=value: {raw!r}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_systemd_unit_is_a_hardened_templated_worker() -> None:
    unit = parse_unit(UNIT)
    assert set(unit) == {"Unit", "Service", "Install"}
    svc = {k: v[-1] for k, v in unit["Service"].items()}
    argv = shlex.split(svc["ExecStart"])
    assert argv[0].startswith("/") and argv[1:3] == ["worker", "--model"] and argv[3] == "%i"
    assert Path(argv[0]).name == "streamnb"
    assert svc["Restart"] == "on-failure"
    assert int(unit["Unit"]["StartLimitBurst"][0]) > 0 and unit["Unit"]["StartLimitIntervalSec"]
    assert any(f.lstrip("-") == "/etc/streamnb/streamnb.env" for f in unit["Service"]["EnvironmentFile"])
    hardening = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
                 "ProtectHome": "yes", "PrivateDevices": "yes", "RestrictSUIDSGID": "yes",
                 "ProtectKernelTunables": "yes", "ProtectControlGroups": "yes"}
    for key, value in hardening.items():
        assert svc.get(key) == value, key
    assert svc["CapabilityBoundingSet"] == ""
    assert svc.get("DynamicUser") == "yes" or svc.get("User") not in (None, "root")
    env = env_example()
    assert int(svc["TimeoutStopSec"].rstrip("s")) > int(env["STREAMNB_BLOCK_MS"]) / 1000
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def env_example() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"STREAMNB_[A-Z0-9_]+", key), f"bad line {line!r}"
            out[key] = value
    return out


def test_systemd_env_example_sets_worker_flags_only() -> None:
    env = env_example()
    flags = worker_flags()
    for key in env:
        assert key[len("STREAMNB_"):].lower() in flags, key
    url = urlsplit(env["STREAMNB_REDIS"])
    assert url.username == "streamnb-worker" and password_matches("streamnb-worker", url.password)
    assert int(env["STREAMNB_METRICS_PORT"]) == METRICS_PORT


# ------------------------------------------------------------------------------ Redis: live
DEV_PASSWORDS = {u: f"{u}-dev-CHANGE-ME" for u in
                 ("streamnb-worker", "streamnb-scorer", "streamnb-trainer", "streamnb-producer",
                  "streamnb-keda", "streamnb-admin")}


class ProductionRedis(RedisServer):
    """redis-server started with deploy/redis/redis.conf and users.acl, as compose does.

    Only port, bind, dir and logging are overridden; clients log in as streamnb-admin.
    """

    def __init__(self, acl_file: Path) -> None:
        super().__init__()
        self.acl_file = acl_file

    def args(self) -> list[str]:
        return [str(REDIS_SERVER), str(REDIS_CONF), "--port", str(self.port),
                "--bind", "127.0.0.1", "--dir", str(self.dir), "--daemonize", "no",
                "--logfile", str(self.dir / "redis.log"), "--aclfile", str(self.acl_file)]

    def client(self, **kw: Any) -> redis.Redis:
        kw.setdefault("username", "streamnb-admin")
        if "password" not in kw:
            kw["password"] = DEV_PASSWORDS[kw["username"]]
        return super().client(**kw)


@pytest.fixture(scope="module")
def prod_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductionRedis]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    acl = tmp_path_factory.mktemp("acl") / "users.acl"
    shutil.copy(ACL_FILE, acl)
    with ProductionRedis(acl) as server:
        yield server


def test_dev_passwords_are_the_ones_in_the_acl() -> None:
    assert set(acl_users()) == {"default", *DEV_PASSWORDS}
    for user, password in DEV_PASSWORDS.items():
        assert password_matches(user, password), user
    assert "off" in acl_users()["default"]


@pytest.mark.redis
def test_production_conf_turns_on_aof_and_never_evicts(prod_redis: ProductionRedis) -> None:
    admin = prod_redis.client(decode_responses=True)
    conf = {k: v for k, v in admin.config_get("*").items()}
    assert conf["appendonly"] == "yes"
    assert conf["appendfsync"] == "everysec"
    assert conf["maxmemory-policy"] == "noeviction"
    assert conf["lazyfree-lazy-expire"] == "yes"  # a cache bucket is freed off the command loop
    assert admin.info("persistence")["aof_enabled"] == 1


@pytest.mark.redis
def test_acl_refuses_unauthenticated_and_wrong_password(prod_redis: ProductionRedis) -> None:
    no_retry = Retry(NoBackoff(), 0)  # redis-py retries connection errors (auth included)
    anonymous = redis.Redis(host="127.0.0.1", port=prod_redis.port, socket_timeout=5, retry=no_retry)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    for user, password in (("streamnb-worker", "wrong"), ("nobody", "x")):
        with pytest.raises(redis.AuthenticationError, match="WRONGPASS|invalid"):
            prod_redis.client(username=user, password=password, retry=no_retry).ping()


def dryrun(admin: redis.Redis, user: str, *command: Any) -> str:
    """'OK' if ``user`` may run ``command``, else Redis's reason (nothing is executed)."""
    try:
        return str(admin.execute_command("ACL", "DRYRUN", user, *command))
    except redis.ResponseError as exc:
        return str(exc)


M = "streamnb:{acltest}"


@pytest.mark.redis
def test_acl_lets_the_worker_run_its_commands_on_streamnb_keys(prod_redis: ProductionRedis) -> None:
    w = prod_redis.client(username="streamnb-worker", client_name="streamnb-test-worker",
                          decode_responses=True)
    assert w.ping()
    assert w.xgroup_create(f"{M}:in", GROUP, id="0", mkstream=True)
    ids = [w.xadd(f"{M}:in", {"data": f"m{i}"}) for i in range(4)]
    got = w.xreadgroup(GROUP, "c1", {f"{M}:in": ">"}, count=2, block=10)
    assert [e for e, _ in got[0][1]] == ids[:2]
    assert w.xack(f"{M}:in", GROUP, ids[0]) == 1
    assert w.xpending(f"{M}:in", GROUP)["pending"] == 1
    assert len(w.xpending_range(f"{M}:in", GROUP, "-", "+", 10, consumername="c1")) == 1
    w.xreadgroup(GROUP, "c2", {f"{M}:in": ">"}, count=1)
    claimed = w.xautoclaim(f"{M}:in", GROUP, "c1", min_idle_time=0, start_id="0-0")
    assert ids[1] in [e for e, _ in claimed[1]]
    assert {g["name"] for g in w.xinfo_groups(f"{M}:in")} == {GROUP}
    assert w.xinfo_stream(f"{M}:in")["length"] == 4
    assert {c["name"] for c in w.xinfo_consumers(f"{M}:in", GROUP)} == {"c1", "c2"}
    assert w.xgroup_delconsumer(f"{M}:in", GROUP, "c2") == 0
    log_id = w.xadd(f"{M}:log", {"data": "delta"})
    assert w.xread({f"{M}:log": "0"})[0][1][0][0] == log_id
    assert w.xrange(f"{M}:log")[0][0] == w.xrevrange(f"{M}:log")[0][0] == log_id
    assert w.xlen(f"{M}:log") == 1 and w.xtrim(f"{M}:log", minid=log_id) == 0
    assert w.set(f"{M}:lease", "c1", nx=True, px=5000) and w.get(f"{M}:lease") == "c1"
    assert w.pexpire(f"{M}:lease", 4000)
    assert w.hset(f"{M}:snapshot", mapping={"log_id": log_id, "data": "s"}) == 2
    assert w.hget(f"{M}:snapshot", "log_id") == log_id
    assert w.hgetall(f"{M}:snapshot") == {"log_id": log_id, "data": "s"}
    assert w.hset(f"{M}:config", "kind", "multinomial") == 1
    assert w.hmget(f"{M}:config", ["kind", "none"]) == ["multinomial", None]
    assert w.hset(f"{M}:workers", "c1", "beat") == 1 and w.hdel(f"{M}:workers", "c1") == 1
    assert w.exists(f"{M}:config") == 1 and w.type(f"{M}:in") == "stream"
    assert w.get(f"{M}:none") is None
    assert w.incrby(f"{M}:learnt", 3) == 3
    assert w.delete(f"{M}:lease") == 1
    sha = w.script_load("return redis.call('XLEN', KEYS[1])")
    assert w.evalsha(sha, 1, f"{M}:in") == 4


@pytest.mark.redis
def test_acl_lets_the_worker_run_the_real_commit_script(prod_redis: ProductionRedis) -> None:
    k = ModelKeys("acl-commit")
    w = prod_redis.client(username="streamnb-worker")
    prod_redis.client().script_flush()  # so the commit takes the NOSCRIPT -> SCRIPT LOAD path
    w.xgroup_create(k.input, GROUP, id="0", mkstream=True)
    ids = [w.xadd(k.input, {"data": b"x"}).decode() for _ in range(3)]
    w.xreadgroup(GROUP, "w1", {k.input: ">"})
    req = CommitRequest(
        ids=ids, outputs=[b"p"] * 3, dead=[b"d"], log_data=b"delta", n_learnt=3,
        decay_every=2, decay_data=b"decay",
        cache_writes=[CacheWrite(k.cache_bucket(10, 1, 2), 60000, ["rm1", b"\x00\x00entry"])],
        cache_registry=(k.cache_buckets, "10", "80:1"),
    )
    result = commit_batch(w, k, "w1", req, out_maxlen=100, dead_maxlen=100)
    assert result.ok
    assert w.xpending(k.input, GROUP)["pending"] == 0
    assert (w.xlen(k.out), w.xlen(k.dead), w.xlen(k.log)) == (3, 1, 2)  # delta + 1 decay
    assert w.hget(k.cache_bucket(10, 1, 2), "rm1") == b"\x00\x00entry"
    assert 0 < prod_redis.client().pttl(k.cache_bucket(10, 1, 2)) <= 60000
    assert w.hget(k.cache_buckets, "10") == b"80:1"
    # a delayed label's look-up (workers/store/scripts/cache_get.lua), which also prunes the registry
    found = fetch_cached(w, k, ["m1"], 50)
    assert found == {"m1": None}  # (b"entry" is no entry: as good as expired)
    assert fetch_cached(w, k, ["m1"], 10**6) == {"m1": None}
    assert not w.exists(k.cache_buckets)  # pruned: nothing of width 10 can be left


@pytest.mark.redis
def test_acl_confines_the_worker_to_streamnb_keys_and_commands(prod_redis: ProductionRedis) -> None:
    admin = prod_redis.client(decode_responses=True)
    allowed = [("XADD", f"{M}:in", "*", "data", "x"), ("GET", f"{M}:lease"),
               ("EVALSHA", "0" * 40, "1", f"{M}:in"), ("HGETALL", f"{M}:snapshot")]
    for cmd in allowed:
        assert dryrun(admin, "streamnb-worker", *cmd) == "OK", cmd
    refused = [
        ("GET", "other:key"), ("XADD", "mail:in", "*", "data", "x"), ("SET", "streamnbx", "1"),
        ("FLUSHALL",), ("FLUSHDB",), ("KEYS", "*"), ("SCAN", "0"), ("CONFIG", "GET", "*"),
        ("SHUTDOWN",), ("DEBUG", "SLEEP", "0"), ("ACL", "LIST"), ("CLIENT", "KILL", "ID", "1"),
        ("PUBLISH", "streamnb:x", "m"), ("SUBSCRIBE", "streamnb:x"), ("MONITOR",),
        ("SCRIPT", "FLUSH"), ("FUNCTION", "FLUSH"), ("RENAME", f"{M}:in", f"{M}:x"),
        ("XGROUP", "DESTROY", f"{M}:in", GROUP), ("SAVE",), ("REPLICAOF", "NO", "ONE"),
    ]
    for cmd in refused:
        reply = dryrun(admin, "streamnb-worker", *cmd)
        assert reply != "OK" and "permission" in reply.lower(), (cmd, reply)
    # Scripts run with the caller's permissions: a script cannot reach other keys.
    w = prod_redis.client(username="streamnb-worker")
    admin.set("other:key", "secret")
    with pytest.raises(redis.ResponseError, match="(?i)permission|can't"):
        w.eval("return redis.call('GET', KEYS[1])", 1, "other:key")
    with pytest.raises(redis.exceptions.NoPermissionError):
        w.get("other:key")


@pytest.mark.redis
def test_acl_producer_scorer_trainer_and_keda_users_are_narrower(prod_redis: ProductionRedis) -> None:
    admin = prod_redis.client(decode_responses=True)
    ok = {
        "streamnb-producer": [("XADD", f"{M}:in", "*", "data", "x"), ("XREAD", "STREAMS", f"{M}:out", "0"),
                              ("XRANGE", f"{M}:dead", "-", "+"), ("EXISTS", f"{M}:config"),
                              ("SCAN", "0", "MATCH", "streamnb:{*}:config"),
                              ("HMGET", f"{M}:epochs", "imap")],
        "streamnb-keda": [("XINFO", "GROUPS", f"{M}:in"), ("XPENDING", f"{M}:in", GROUP),
                          ("XLEN", f"{M}:in")],
        "streamnb-scorer": [("XADD", f"{M}:in", "*", "data", "x"), ("XREAD", "STREAMS", f"{M}:out", "0"),
                            ("XRANGE", f"{M}:dead", "-", "+"), ("HMGET", f"{M}:config", "shards")],
        "streamnb-trainer": [("XADD", f"{M}:train", "*", "data", "x"), ("HMGET", f"{M}:keys", "k"),
                             ("HMGET", f"{M}:config", "training"), ("EXISTS", f"{M}:config")],
    }
    no = {
        "streamnb-producer": [("XADD", f"{M}:out", "*", "data", "x"), ("XADD", f"{M}:log", "*", "d", "x"),
                              ("HGETALL", f"{M}:snapshot"), ("XREADGROUP", "GROUP", GROUP, "p",
                                                              "STREAMS", f"{M}:in", ">")],
        "streamnb-keda": [("XADD", f"{M}:in", "*", "data", "x"), ("XINFO", "GROUPS", f"{M}:log"),
                          ("XRANGE", f"{M}:in", "-", "+"), ("GET", f"{M}:lease")],
        "streamnb-scorer": [("XADD", f"{M}:train", "*", "data", "x"), ("XRANGE", f"{M}:in", "-", "+"),
                            ("GET", f"{M}:traintoken"), ("HMGET", f"{M}:keys", "k"),
                            ("XADD", f"{M}:log", "*", "d", "x")],
        "streamnb-trainer": [("XADD", f"{M}:in", "*", "data", "x"), ("XREAD", "STREAMS", f"{M}:out", "0"),
                             ("XRANGE", f"{M}:dead", "-", "+"), ("XRANGE", f"{M}:train", "-", "+"),
                             ("GET", f"{M}:traintoken")],
    }
    for user, commands in ok.items():
        for cmd in commands:
            assert dryrun(admin, user, *cmd) == "OK", (user, cmd)
    for user, commands in no.items():
        for cmd in commands:
            assert dryrun(admin, user, *cmd) != "OK", (user, cmd)


#: What a worker process runs: the layers up to worker/ (client/, milter/ and cli/ run as
#: other users), and the Lua scripts.
WORKER_SOURCES = [p for layer in ("wire", "store", "observe", "replication", "worker")
                  for p in sorted((ROOT / "workers" / layer).rglob("*.py"))
                  + sorted((ROOT / "workers" / layer).rglob("*.lua"))]
_LUA_CALL = re.compile(r"redis\.(?:p?call)\(\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Za-z]+)')?")
_PY_CALL = re.compile(r"\.((?:x|h|script_|client_)[a-z_]*|evalsha|eval|incrby|incr|pexpire|expire"
                      r"|mget|exists|delete|ping|type|set|get)\(")
_MOVABLE_KEYS = {"XREADGROUP": ["GROUP", "g", "c", "STREAMS", f"{M}:in", ">"],
                 "XREAD": ["STREAMS", f"{M}:in", "0"],
                 "EVAL": ["return 1", "1", f"{M}:in"], "EVALSHA": ["0" * 40, "1", f"{M}:in"]}
_TWO_WORDS = ("xinfo_", "xgroup_", "script_", "client_")


def commands_in_worker_code() -> set[tuple[str, ...]]:
    """Redis commands the worker package sends: Lua redis.call(...) and redis-py methods."""
    found: set[tuple[str, ...]] = set()
    for path in WORKER_SOURCES:
        text = path.read_text()
        for c, sub in _LUA_CALL.findall(text):  # XGROUP DELCONSUMER & co.: two words
            two = f"{c.lower()}_" in _TWO_WORDS
            found.add((c.upper(), sub.upper()) if two else (c.upper(),))
        for name in _PY_CALL.findall(text):
            if not callable(getattr(redis.Redis, name, None)) or name in ("get", "set", "type"):
                continue  # dict.get & co. are indistinguishable here; GET/SET come from Lua
            if name.startswith(_TWO_WORDS):
                head, _, sub = name.partition("_")
                found.add((head.upper(), sub.upper()))
            elif name == "delete":
                found.add(("DEL",))
            elif name == "xpending_range":
                found.add(("XPENDING",))
            else:
                found.add((name.upper(),))
    return found


def dryrun_args(admin: redis.Redis, words: tuple[str, ...]) -> list[str]:
    """A syntactically plausible call of ``words`` on a streamnb key (arity from COMMAND INFO)."""
    if words[0] in _MOVABLE_KEYS:
        return [*words, *_MOVABLE_KEYS[words[0]]]
    name = "|".join(w.lower() for w in words)
    info = admin.execute_command("COMMAND", "INFO", name).get(name)
    assert info, f"Redis does not know the command {' '.join(words)}"
    arity = abs(int(info["arity"]))
    args = [*words, f"{M}:x"]
    return args + ["0"] * max(0, arity - len(args))


@pytest.mark.redis
def test_acl_allows_every_command_the_worker_code_sends(prod_redis: ProductionRedis) -> None:
    found = commands_in_worker_code()
    assert ("XACK",) in found and ("EVALSHA",) in found, found  # the extraction works
    admin = prod_redis.client(decode_responses=True)
    refused = {" ".join(w): r for w in sorted(found)
               if (r := dryrun(admin, "streamnb-worker", *dryrun_args(admin, w))) != "OK"}
    assert not refused, f"users.acl must grant streamnb-worker: {refused}"


def test_systemd_analyze_knows_every_directive(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / UNIT.name  # ExecStart pointed at a binary that exists here
    unit.write_text(re.sub(r"(?m)^ExecStart=\S+", "ExecStart=/bin/true", UNIT.read_text()))
    proc = subprocess.run([analyze, "verify", str(tmp_path / "streamnb-worker@spam.service")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "ignoring" not in proc.stderr.lower(), proc.stderr


def test_every_worker_deployment_declares_spam_and_ham(compose: dict[str, Any],
                                                       k8s: dict[str, dict[str, Any]]) -> None:
    """A mistyped label ("Spam") is a dead letter, not a third class, in every deployment:
    each one that starts a worker declares the classes, as the README's daemon does."""
    env = compose["services"]["worker"]["environment"]
    assert compose_default(env["STREAMNB_CLASSES"]) == "spam,ham"
    assert k8s["ConfigMap"]["data"]["STREAMNB_CLASSES"] == "spam,ham"
    assert re.search(r"^STREAMNB_CLASSES=spam,ham$", ENV_EXAMPLE.read_text(), re.M)
    readme = (ROOT / "README.md").read_text()
    daemon = readme[readme.index("## The daemon"):]
    first = daemon[daemon.index("streamnb worker"):daemon.index("streamnb produce")]
    assert "--classes spam,ham" in first
    args = build_parser().parse_args(["worker", "--model", "m", "--kind", "multinomial",
                                      "--classes", compose_default(env["STREAMNB_CLASSES"])])
    assert args.classes == ["spam", "ham"]
