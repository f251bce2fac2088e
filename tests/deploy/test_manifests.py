"""deploy/compose.yaml and deploy/kubernetes/ tied to the program they run.

No container engine or cluster runs here, so each file is checked two ways: against its schema
offline (the Compose specification's JSON schema as check-jsonschema vendors it; the Kubernetes
OpenAPI schemas kubernetes-validate bundles, strict), and by running what it declares. Each
container's arguments (after the image's ENTRYPOINT from deploy/Dockerfile), its environment
(ConfigMap and env_file values resolved) and its declared ports and probe paths are run here as
real processes against the local PostgreSQL: the migration succeeds, the API answers its probes on
its declared port, two workers deliver to a real receiver and answer their probes on their
metrics ports, and SIGTERM lets an in-flight send finish within the declared grace period.

Exactly what is substituted, since a pod or a container is not this host:
- the image's ENTRYPOINT ``outbox`` becomes the installed console script next to this Python,
  and a Compose health check's ``python`` this Python;
- the database URL (the Secret ``outbox``'s ``database-url``; ``OUTBOX_DATABASE_URL`` in
  outbox.env, whose stand-in is outbox.env.example) becomes a fresh throwaway PostgreSQL database
  on 127.0.0.1, so its host, user and password are this host's;
- the metrics token (the Secret's ``metrics-token``) is secret.example.yaml's, as outbox.env's is
  outbox.env.example's, and /metrics is asked with it as Prometheus would send it;
- the second worker replica's metrics port (the declared one, wherever it is given) becomes a free
  port: on one host two processes cannot share it as two pods or containers do;
- the secrets key file (``OUTBOX_SECRETS_KEY_FILE``: where a pod mounts the Secret's
  ``secrets-key``, or Compose its secret ``outbox-secrets-key``) becomes a key file made here, the
  same for every process, as the Secret or the Compose secret is.
Everything else (arguments, every other variable, the API's port, the first worker's metrics port,
probe paths, grace periods) is used as declared.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from outbox import DestinationSpec, Outbox, Settings, Status
from outbox.grants import GrantSpec
from outbox.keyring import generate_key

from .. import pg
from ..acceptance.test_postgres_scale import pid_of
from ..conftest import SECRET, eventually, free_port
from ..receiver import Receiver, Reply
from .prometheus import promtool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose.yaml"
#: The Kubernetes release whose schemas (bundled by kubernetes-validate) the manifests must pass.
KUBERNETES_VERSION = "1.32.0"
#: The ``outbox`` console script installed with this Python: the image's ENTRYPOINT, here.
OUTBOX = str(Path(sys.executable).parent / "outbox")
#: A grace period must leave at least this much above OUTBOX_DRAIN_SECONDS for the exit itself.
GRACE_MARGIN = 5.0
#: How long the receiver holds the send that SIGTERM finds in flight.
HOLD_SECONDS = 3.0
#: How a process under uvicorn ends on SIGTERM once it has shut down: uvicorn re-raises the signal
#: after its shutdown (exit 143 in a container), or it returns 0. Either is a clean stop.
STOPPED = (0, -signal.SIGTERM)
SETTING_NAMES = {f"OUTBOX_{name.upper()}" for name in Settings.model_fields}


# -- what the files declare ---------------------------------------------------------------------


@dataclass(frozen=True)
class Container:
    """One container as its file declares it, in terms a process here can run."""

    name: str
    args: list[str]  # after the image's ENTRYPOINT
    env: dict[str, str]
    port: int | None = None  # the declared port it listens on
    probes: dict[str, str] = field(default_factory=dict)  # liveness/readiness/startup/healthcheck: path
    healthcheck: list[str] | None = None  # a Compose health check's CMD
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL
    replicas: int = 1


@dataclass(frozen=True)
class Declared:
    """The three roles every deployment file gives the outbox."""

    migrate: Container
    api: Container
    worker: Container


def entrypoint() -> list[str]:
    """deploy/Dockerfile's ENTRYPOINT (exec form)."""
    found = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)
    assert len(found) == 1, "deploy/Dockerfile has one ENTRYPOINT, in exec form"
    return list(json.loads(found[0]))


def argv(container: Container) -> list[str]:
    """The container's command line, with the image's ENTRYPOINT replaced by the installed script."""
    assert entrypoint() == ["outbox"], "the image's entrypoint is the outbox console script"
    return [OUTBOX, *container.args]


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())


def resources() -> list[dict[str, Any]]:
    """Every resource kustomization.yaml applies."""
    return [doc for name in kustomization()["resources"] for doc in documents(KUBERNETES / name)]


def one(kind: str, name: str) -> dict[str, Any]:
    found = [r for r in resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"one {kind} {name} in the kustomization"
    return found[0]


def kubernetes_container(kind: str, name: str, secrets: dict[tuple[str, str], str]) -> Container:
    """The single container of a Job or Deployment, its environment resolved: ConfigMaps from the
    kustomization, Secret keys from ``secrets`` (a reference to anything else fails)."""
    workload = one(kind, name)
    pod = workload["spec"]["template"]["spec"]
    (spec,) = pod["containers"]
    assert "command" not in spec, "containers keep the image's ENTRYPOINT and give args"
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        env.update(one("ConfigMap", source["configMapRef"]["name"])["data"])
    for var in spec.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "configMapKeyRef" in (ref := var["valueFrom"]):
            env[var["name"]] = one("ConfigMap", ref["configMapKeyRef"]["name"])["data"][ref["configMapKeyRef"]["key"]]
        else:
            key = ref["secretKeyRef"]
            env[var["name"]] = secrets[key["name"], key["key"]]
    ports = {p["name"]: p["containerPort"] for p in spec.get("ports", [])}
    probes: dict[str, str] = {}
    declared_port = None
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        if probe in spec:
            get = spec[probe]["httpGet"]
            port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
            assert declared_port in (None, port), f"{name}'s probes ask one port"
            declared_port = port
            probes[probe.removesuffix("Probe")] = get["path"]
    return Container(name=spec["name"], args=list(spec["args"]), env=env, port=declared_port, probes=probes,
                     grace=float(pod.get("terminationGracePeriodSeconds", 30)),
                     replicas=workload["spec"].get("replicas", 1))


def secret_example() -> dict[str, str]:
    """The keys and stand-in values of the Secret ``outbox`` (secret.example.yaml)."""
    return dict(documents(KUBERNETES / "secret.example.yaml")[0]["stringData"])


def with_key_file(declared: Declared, key_file: Path | None) -> Declared:
    """``declared`` with each container's OUTBOX_SECRETS_KEY_FILE (which every one sets) made
    ``key_file``, when given."""
    for container in (declared.migrate, declared.api, declared.worker):
        assert container.env.get("OUTBOX_SECRETS_KEY_FILE", "").startswith("/"), f"{container.name} names its key"
    if key_file is None:
        return declared
    return Declared(*(replace(c, env={**c.env, "OUTBOX_SECRETS_KEY_FILE": str(key_file)})
                      for c in (declared.migrate, declared.api, declared.worker)))


def from_kubernetes(database_url: str, key_file: Path | None = None) -> Declared:
    secrets = {("outbox", key): value for key, value in secret_example().items()}
    secrets["outbox", "database-url"] = database_url
    return with_key_file(Declared(migrate=kubernetes_container("Job", "outbox-migrate", secrets),
                                  api=kubernetes_container("Deployment", "outbox-api", secrets),
                                  worker=kubernetes_container("Deployment", "outbox-worker", secrets)), key_file)


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def env_file(path: str) -> dict[str, str]:
    """A Compose env_file's variables, read from its committed ``.example``."""
    lines = (DEPLOY / f"{path}.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def duration(text: str) -> float:
    """A Compose duration such as ``30s`` or ``1m30s``, in seconds."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", text)
    assert parts and text, f"a duration in minutes and seconds: {text!r}"
    return int(parts.group(1) or 0) * 60 + int(parts.group(2) or 0)


def compose_service(name: str, database_url: str) -> Container:
    """A Compose service as a container: env_file values (the DB URL substituted), then environment."""
    service = compose()["services"][name]
    env: dict[str, str] = {}
    for entry in service.get("env_file", []):
        env.update(env_file(entry["path"] if isinstance(entry, dict) else entry))
    assert "OUTBOX_DATABASE_URL" in env, f"{name} gets the database URL from its env_file"
    env["OUTBOX_DATABASE_URL"] = database_url
    env.update({k: str(v) for k, v in service.get("environment", {}).items()})
    ports = [int(str(p).rsplit(":", 1)[-1]) for p in (*service.get("ports", []), *service.get("expose", []))]
    assert len(ports) <= 1, f"{name} declares at most one port"
    healthcheck = service.get("healthcheck", {}).get("test")
    probes = {}
    if healthcheck is not None:
        assert healthcheck[0] == "CMD" and healthcheck[1] == "python", "health checks run the image's python"
        url = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", " ".join(healthcheck))
        assert url and ports == [int(url.group(1))], f"{name}'s health check asks its declared port"
        probes["healthcheck"] = url.group(2)
        healthcheck = [sys.executable, *healthcheck[2:]]
    return Container(name=name, args=list(service["command"]), env=env, port=ports[0] if ports else None,
                     probes=probes, healthcheck=healthcheck,
                     grace=duration(service.get("stop_grace_period", "10s")),
                     replicas=service.get("deploy", {}).get("replicas", 1))


def from_compose(database_url: str, key_file: Path | None = None) -> Declared:
    return with_key_file(Declared(migrate=compose_service("migrate", database_url),
                                  api=compose_service("api", database_url),
                                  worker=compose_service("worker", database_url)), key_file)


def both(database_url: str = "postgresql://outbox@db.example/outbox") -> list[Declared]:
    return [from_kubernetes(database_url), from_compose(database_url)]


# -- the files on their own ---------------------------------------------------------------------


def test_every_outbox_variable_they_set_is_a_setting() -> None:
    """The program ignores an OUTBOX_* variable it does not know: a renamed setting that the files
    do not follow would silently fall back to its default."""
    for declared in both():
        for container in (declared.migrate, declared.api, declared.worker):
            named = {k for k in container.env if k.startswith("OUTBOX_")}
            assert named <= SETTING_NAMES, f"{container.name}: not settings: {named - SETTING_NAMES}"
    assert set(one("ConfigMap", "outbox-config")["data"]) <= SETTING_NAMES


def test_grace_periods_leave_the_drain_and_a_margin() -> None:
    for declared in both():
        for container in (declared.api, declared.worker):
            drain = float(container.env.get("OUTBOX_DRAIN_SECONDS", Settings.model_fields["drain_seconds"].default))
            assert container.grace >= drain + GRACE_MARGIN, (container.name, container.grace, drain)


def test_secrets_are_referenced_never_written_in() -> None:
    # Kubernetes: the database URL comes from the Secret "outbox", whose example provides the key.
    example = documents(KUBERNETES / "secret.example.yaml")[0]
    assert example["kind"] == "Secret" and example["metadata"]["name"] == "outbox"
    assert not [r for r in resources() if r["kind"] == "Secret"], "no Secret with values is applied"
    for config in (r for r in resources() if r["kind"] == "ConfigMap"):  # (a *_FILE setting is a path)
        assert not any(re.search(r"URL|PASSWORD|TOKEN|SECRET", k) and not k.endswith("_FILE")
                       for k in config["data"]), config["data"]
    for workload in (r for r in resources() if r["kind"] in ("Job", "Deployment")):
        for spec in workload["spec"]["template"]["spec"]["containers"]:
            refs = {(v["valueFrom"]["secretKeyRef"]["name"], v["valueFrom"]["secretKeyRef"]["key"])
                    for v in spec["env"] if "secretKeyRef" in v.get("valueFrom", {})}
            # every pod needs the database; the ones serving /metrics its token too (the secrets
            # key is mounted as a file, never an environment variable)
            serves = workload["kind"] == "Deployment"
            assert refs == {("outbox", "database-url"), *([("outbox", "metrics-token")] if serves else [])}
    assert set(example["stringData"]) == {"database-url", "metrics-token", "secrets-key"}
    # Compose: secrets only in env files (committed as .example), never in `environment`.
    for name, service in compose()["services"].items():
        inline = {k for k in service.get("environment", {})
                  if re.search(r"PASSWORD|DATABASE_URL|TOKEN|SECRET", k) and not k.endswith("_FILE")}
        assert not inline, f"{name} writes secrets inline: {inline}"
        for entry in service.get("env_file", []):
            assert (DEPLOY / f"{entry['path']}.example").is_file()


def test_every_process_reads_the_secrets_key_from_a_secret_mounted_read_only() -> None:
    """Kubernetes: OUTBOX_SECRETS_KEY_FILE names the Secret "outbox"'s key secrets-key as each pod
    mounts it (read-only, readable by the pod's group only). Compose: it names the secret
    outbox-secrets-key as Compose mounts it, from deploy/secrets.key, which git ignores."""
    path = Path(one("ConfigMap", "outbox-config")["data"]["OUTBOX_SECRETS_KEY_FILE"])
    for workload in (r for r in resources() if r["kind"] in ("Job", "Deployment")):
        pod = workload["spec"]["template"]["spec"]
        (spec,) = pod["containers"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for m in spec["volumeMounts"] if Path(m["mountPath"]) == path.parent]
        secret = volumes[mount["name"]]["secret"]
        assert mount["readOnly"] is True and secret["secretName"] == "outbox", workload["metadata"]["name"]
        assert secret["items"] == [{"key": "secrets-key", "path": path.name}]
        assert secret["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 10001
    services = compose()["services"]
    for name in ("migrate", "api", "worker"):
        assert services[name]["secrets"] == ["outbox-secrets-key"], name
        assert services[name]["environment"]["OUTBOX_SECRETS_KEY_FILE"] == "/run/secrets/outbox-secrets-key"
    assert compose()["secrets"]["outbox-secrets-key"] == {"file": "./secrets.key"}
    holders = {name for name, service in services.items() if "outbox-secrets-key" in service.get("secrets", [])}
    assert holders == {"migrate", "api", "worker"}, "only the outbox's own processes get the key"
    assert "secrets.key" in (DEPLOY / ".gitignore").read_text().split()


def test_pods_run_unprivileged_with_resources_and_probes() -> None:
    for workload in (r for r in resources() if r["kind"] in ("Job", "Deployment")):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
        scratch = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for spec in pod["containers"]:
            security = spec["securityContext"]
            assert security["capabilities"]["drop"] == ["ALL"] and security["allowPrivilegeEscalation"] is False
            assert security["readOnlyRootFilesystem"] is True
            assert {m["name"] for m in spec.get("volumeMounts", []) if m["mountPath"] == "/tmp"} <= scratch
            if workload["kind"] == "Deployment":  # a writable /tmp, and only there
                assert any(m["mountPath"] == "/tmp" for m in spec["volumeMounts"]), spec["name"]
            assert {"cpu", "memory"} <= set(spec["resources"]["requests"]) and "memory" in spec["resources"]["limits"]
            if workload["kind"] == "Deployment":
                assert {"livenessProbe", "readinessProbe"} <= set(spec), spec["name"]
                port = workload["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
                assert int(port) in {p["containerPort"] for p in spec["ports"]}, "scraped where it listens"


def test_service_and_disruption_budgets_select_the_deployments() -> None:
    deployments = {r["metadata"]["name"]: r for r in resources() if r["kind"] == "Deployment"}

    def selected(selector: dict[str, str]) -> set[str]:
        return {name for name, d in deployments.items()
                if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()}

    service = one("Service", "outbox-api")
    assert selected(service["spec"]["selector"]) == {"outbox-api"}
    (api,) = deployments["outbox-api"]["spec"]["template"]["spec"]["containers"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= {p["name"] for p in api["ports"]}
    budgets = [r for r in resources() if r["kind"] == "PodDisruptionBudget"]
    assert sorted(n for b in budgets for n in selected(b["spec"]["selector"]["matchLabels"])) == sorted(deployments)
    # a node drain keeps one API pod and stops one worker at a time
    assert one("PodDisruptionBudget", "outbox-api")["spec"]["minAvailable"] == 1
    assert one("PodDisruptionBudget", "outbox-worker")["spec"]["maxUnavailable"] == 1


def test_kustomization_lists_every_manifest_but_the_examples() -> None:
    manifests = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    examples = {name for name in manifests if ".example." in name}
    assert examples == {"secret.example.yaml"}
    assert sorted(kustomization()["resources"]) == sorted(manifests - examples)


@pytest.mark.parametrize("name", sorted(p.name for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml"))
def test_kubernetes_manifest_passes_the_bundled_schema(name: str) -> None:
    for doc in documents(KUBERNETES / name):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_kubernetes_schema_check_can_fail() -> None:
    """A typo'd field is refused, so the strict schemas do check the manifests' fields."""
    doc = documents(KUBERNETES / "worker-deployment.yaml")[0]
    doc["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run([str(script), "--builtin-schema", "vendor.compose-spec", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_compose_file_passes_the_compose_specification(tmp_path: Path) -> None:
    checked = check_compose(COMPOSE)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = compose()
    broken["services"]["worker"]["stop_grace_periods"] = "30s"
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(broken))
    assert check_compose(tmp_path / "compose.yaml").returncode != 0, "the schema refuses unknown keys"


def test_compose_wires_postgres_migration_monitoring() -> None:
    services = compose()["services"]
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]
    assert any(v.endswith(":/var/lib/postgresql/data") and not v.startswith((".", "/"))
               for v in services["postgres"]["volumes"]), "PostgreSQL keeps its data in a named volume"
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("api", "worker"):
        assert services[name]["depends_on"] == {"migrate": {"condition": "service_completed_successfully"}}
        assert services[name]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    for name in ("migrate", "api", "worker"):  # read-only, no capabilities, no privilege escalation
        assert services[name]["read_only"] is True and services[name]["cap_drop"] == ["ALL"], name
        assert services[name]["security_opt"] == ["no-new-privileges:true"], name
    mounts = {v.split(":")[0]: v.split(":")[1] for v in services["prometheus"]["volumes"]}
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    rules = Path(mounts["./prometheus/prometheus.yml"]).parent / config["rule_files"][0]
    assert mounts["./prometheus/alerts.yml"] == str(rules), "Prometheus loads the mounted alert rules"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # Prometheus sends the metrics token from a Compose secret, a file kept out of git, the same
    # value as OUTBOX_METRICS_TOKEN in outbox.env
    (secret,) = services["prometheus"]["secrets"]
    assert compose()["secrets"][secret] == {"file": secret}
    assert secret in (DEPLOY / ".gitignore").read_text().split()
    assert {job["authorization"]["credentials_file"] for job in jobs.values()} == {f"/run/secrets/{secret}"}
    api, worker = compose_service("api", ""), compose_service("worker", "")
    assert jobs["outbox-api"]["static_configs"][0]["targets"] == [f"api:{api.port}"]
    assert jobs["outbox-worker"]["dns_sd_configs"][0] == {**jobs["outbox-worker"]["dns_sd_configs"][0],
                                                          "names": ["worker"], "port": worker.port}
    grafana = {v.split(":")[0]: v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert grafana["./grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/outbox.yaml").read_text())
    assert Path(grafana["./grafana/outbox.json"]).parent == Path(provider["providers"][0]["options"]["path"])
    source = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090" and source["datasources"][0]["isDefault"]
    dashboard = json.loads((DEPLOY / "grafana" / "outbox.json").read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == source["datasources"][0]["type"], "the dashboard picks the provisioned source"
    assert "9090:9090" in services["prometheus"]["ports"]


# -- the files run ------------------------------------------------------------------------------


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return f"--- {self.name} ---\n" + "\n".join(self.log.read_text().splitlines()[-30:])


def environment(container: Container) -> dict[str, str]:
    """This process's environment without any OUTBOX_* variable, plus the container's."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}, **container.env}


@contextmanager
def running(tmp_path: Path, name: str, container: Container) -> Iterator[Process]:
    """The container's command line as a process here (in its own directory, as a container
    would be in its WORKDIR); killed on leaving if still running."""
    home = tmp_path / name
    home.mkdir()
    log = home / "output.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv(container), env=environment(container), cwd=home, stdout=out,
                                stderr=subprocess.STDOUT)
    process = Process(name, proc, log)
    try:
        yield process
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for(url: str, process: Process, timeout: float = 30.0, headers: dict[str, str] | None = None,
             ) -> httpx.Response:
    """GET ``url`` until it answers 200; fails with the process's output if it dies or never does."""
    deadline = time.monotonic() + timeout
    answer: httpx.Response | Exception | None = None
    while time.monotonic() < deadline and process.proc.poll() is None:
        try:
            answer = httpx.get(url, timeout=2, headers=headers)
        except httpx.TransportError as exc:
            answer = exc
        else:
            if answer.status_code == 200:
                return answer
            if answer.status_code == 404:  # a path the program does not have: waiting will not help
                break
        time.sleep(0.1)
    pytest.fail(f"{url} did not answer 200 (last: {answer!r}; exit code {process.proc.poll()})\n{process.tail()}")


def probe(container: Container, process: Process, port: int) -> None:
    """Every probe path the file declares answers 200 on the port it declares without a token,
    and /metrics too with the metrics token (and 401 without it); a Compose health check's own
    command succeeds."""
    assert container.probes, f"{container.name} declares probes"
    for path in container.probes.values():
        wait_for(f"http://127.0.0.1:{port}{path}", process)
    token = container.env.get("OUTBOX_METRICS_TOKEN")
    assert token, f"{container.name} serves /metrics, whose labels name destinations: it needs a metrics token"
    wait_for(f"http://127.0.0.1:{port}/metrics", process, headers={"Authorization": f"Bearer {token}"})
    assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 401
    if container.healthcheck is not None and port == container.port:
        checked = subprocess.run(container.healthcheck, capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stderr


def free(port: int) -> int:
    """``port``, after checking nothing here listens on it (the declared ports are used as is, so
    two runs of these tests at once on one host collide; say so rather than fail obscurely)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as exc:
            pytest.fail(f"port {port}, which the files declare, is in use on this host ({exc}): "
                        "another process, or another run of this test, listens there")
    return port


def replica(worker: Container, index: int) -> tuple[Container, int]:
    """The ``index``th worker replica and its metrics port: the declared one for the first, a free
    one (substituted wherever the declared port is given) for the others."""
    assert worker.port is not None, "a worker declares its metrics port"
    if index == 0:
        return worker, free(worker.port)
    port, declared = free_port(), str(worker.port)
    args = [str(port) if a == declared else a for a in worker.args]
    env = {k: str(port) if v == declared else v for k, v in worker.env.items()}
    assert (args, env) != (worker.args, worker.env), "the metrics port is given in args or env"
    return replace(worker, args=args, env=env), port


async def prepare(url: str, receiver: Receiver) -> None:
    """Destinations at the receiver and a grant for scope ``acme`` (the files leave the authority
    at its default, grants)."""
    async with await Outbox.open(url) as box:
        for name in ("hook", "slow"):
            await box.put_destination(name, DestinationSpec(url=f"{receiver.url}/{name}", secret=SECRET,
                                                            allow_private_network=True, timeout_seconds=30))
        await box.put_grant("acme", GrantSpec(scope="acme", destination="*"))


async def outcomes(url: str, ids: list[str]) -> dict[str, tuple[Status, set[str]]]:
    """Each intent's status and the workers that attempted it."""
    async with await Outbox.open(url) as box:
        found = {}
        for action_id in ids:
            history = await box.history(action_id)
            found[action_id] = ((await box.get(action_id)).status, {a.worker for a in history.attempts})
        return found


async def delivered(url: str, ids: list[str]) -> bool:
    """Whether every intent of ``ids`` is delivered."""
    return all(status is Status.DELIVERED for status, _ in (await outcomes(url, ids)).values())


@pytest.mark.acceptance
@pytest.mark.parametrize("source", ["kubernetes", "compose"])
def test_declared_commands_migrate_serve_deliver_and_drain(source: str, tmp_path: Path, receiver: Receiver,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    with ExitStack() as stack:
        url = asyncio.run(pg.create_database())
        stack.callback(lambda: asyncio.run(pg.drop_database(url)))
        key_file = tmp_path / "secrets.key"  # the Secret's secrets-key, or deploy/secrets.key
        key_file.write_text(generate_key() + "\n")
        monkeypatch.setenv("OUTBOX_SECRETS_KEY_FILE", str(key_file))  # this test's own outbox, too
        declared = from_kubernetes(url, key_file) if source == "kubernetes" else from_compose(url, key_file)

        # The migration: runs to completion with exit code 0.
        with running(tmp_path, "migrate", declared.migrate) as migrate:
            assert migrate.proc.wait(60) == 0, migrate.tail()

        # The API: its probes (and /metrics) on the declared port.
        assert declared.api.port is not None
        free(declared.api.port)
        api = stack.enter_context(running(tmp_path, "api", declared.api))
        probe(declared.api, api, declared.api.port)
        base = f"http://127.0.0.1:{declared.api.port}"

        # The workers, each answering its probes on its metrics port.
        workers = []
        for index in range(declared.worker.replicas):
            container, port = replica(declared.worker, index)
            workers.append(stack.enter_context(running(tmp_path, f"worker-{index}", container)))
            probe(declared.worker, workers[-1], port)
        assert len(workers) == 2, "two worker replicas"

        # A producer's token, made as an operator would in the API's container (kubectl exec).
        operator = replace(declared.api, args=["tokens", "create", "--role", "producer", "--scope", "acme", "--json"])
        made = subprocess.run(argv(operator), env=environment(operator), capture_output=True, text=True, timeout=30)
        assert made.returncode == 0, made.stderr
        headers = {"Authorization": f"Bearer {json.loads(made.stdout)['token']}"}
        asyncio.run(prepare(url, receiver))

        # Intents enqueued over the API are delivered by the workers.
        receiver.script("/hook", Reply(200))
        ids = [f"deploy-{n}" for n in range(12)]
        for action_id in ids:
            created = httpx.post(f"{base}/v1/intents", headers=headers, timeout=10, json={
                "action_id": action_id, "scope": "acme", "destination": "hook", "payload": {"id": action_id}})
            assert created.status_code == 201, created.text
        receiver.wait_for_requests_blocking(len(ids), "/hook", timeout=30)
        pids = {w.proc.pid for w in workers}
        assert asyncio.run(eventually(lambda: delivered(url, ids), timeout=30)), "\n".join(w.tail() for w in workers)
        assert {pid_of(w) for _, by in asyncio.run(outcomes(url, ids)).values() for w in by} <= pids

        # SIGTERM while a send is held: it finishes and is recorded, and each worker stops cleanly
        # within the declared grace period (after which a pod or container is killed).
        receiver.script("/slow", Reply(200, delay=HOLD_SECONDS))
        created = httpx.post(f"{base}/v1/intents", headers=headers, timeout=10, json={
            "action_id": "deploy-slow", "scope": "acme", "destination": "slow", "payload": {}})
        assert created.status_code == 201, created.text
        receiver.wait_for_requests_blocking(1, "/slow", timeout=30)
        stopped_at = time.monotonic()
        for worker in workers:
            worker.proc.send_signal(signal.SIGTERM)
        for worker in workers:
            left = declared.worker.grace - (time.monotonic() - stopped_at)
            assert worker.proc.wait(max(left, 0.1)) in STOPPED, worker.tail()
        ((status, by),) = asyncio.run(outcomes(url, ["deploy-slow"])).values()
        assert status is Status.DELIVERED and {pid_of(w) for w in by} <= pids, (status, by)
        assert time.monotonic() - stopped_at >= HOLD_SECONDS - 0.5, "a worker waited for its send"

        # The API stops within its grace period too.
        api.proc.send_signal(signal.SIGTERM)
        assert api.proc.wait(declared.api.grace) in STOPPED, api.tail()


def test_kustomize_builds_what_the_kustomization_lists() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its kustomize builds deploy/kubernetes/ offline)")
    built = subprocess.run([kubectl, "kustomize", str(KUBERNETES)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    rendered = [doc for doc in yaml.safe_load_all(built.stdout) if doc is not None]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == \
        sorted((r["kind"], r["metadata"]["name"]) for r in resources())
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "outbox" for d in rendered)


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    """promtool reads the files the config names: the alert rules beside it, and the metrics token
    (in the container, the Compose secret), which here is a file of the example's value."""
    token = tmp_path / "metrics-token"
    token.write_text(env_file("outbox.env")["OUTBOX_METRICS_TOKEN"])
    config = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    assert config.count("/run/secrets/metrics-token") == 2
    (tmp_path / "prometheus.yml").write_text(config.replace("/run/secrets/metrics-token", str(token)))
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    checked = subprocess.run([promtool(), "check", "config", str(tmp_path / "prometheus.yml")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
