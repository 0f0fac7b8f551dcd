"""The deployment files: Dockerfile, compose.yaml, deploy/nginx.conf, deploy/k8s/*.yaml.

Two kinds of test. The invariants (always run, PyYAML only) pin what the validators
cannot know: three independent fsync-always lock masters, a queue Redis that is not one
of them, one workspace per worker replica, grace periods in step with the worker pool.
The validator tests run hadolint, check-jsonschema and kubernetes-validate (the
``deploy`` extra, in the lock ``make install`` installs) on the real files, and on a broken
copy of each to show the validator really rejects what it should. No network.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboard.settings import WORKER_GRACE_DEFAULT
from workers.pool import STOP_MARGIN

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
K8S = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.30.0"

#: Seconds the orchestrator allows on top of the worker grace: the pool's margin
#: (workers/pool.py STOP_MARGIN: hand back, then kill the tree) plus 5 s to reap.
ORCHESTRATOR_MARGIN = STOP_MARGIN + 5


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def find(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, f"expected a duration in seconds, got {duration!r}"
    return float(match.group(1))


def redis_option(command: list[str], option: str) -> str:
    return command[command.index(option) + 1]


# ------------------------------------------------------------------ compose invariants


def test_compose_has_three_fsync_always_lock_masters_each_with_its_own_volume() -> None:
    services = compose()["services"]
    urls = services["web"]["environment"]["REDIS_URLS"].split(",")
    hosts = [re.match(r"redis://([^:/]+)", u).group(1) for u in urls]  # type: ignore[union-attr]
    assert len(set(hosts)) == 3
    volumes = set()
    for host in hosts:
        node = services[host]
        assert redis_option(node["command"], "--appendonly") == "yes"
        assert redis_option(node["command"], "--appendfsync") == "always"
        assert "replicaof" not in " ".join(node["command"])
        (mount,) = node["volumes"]
        name, path = mount.split(":")
        assert path == redis_option(node["command"], "--dir")
        volumes.add(name)
    assert len(volumes) == 3 and volumes <= set(compose()["volumes"])


def test_compose_queue_redis_is_not_a_lock_master() -> None:
    env = compose()["services"]["worker"]["environment"]
    assert env["REDIS_URL"] not in env["REDIS_URLS"].split(",")
    queue_host = re.match(r"redis://([^:/]+)", env["REDIS_URL"]).group(1)  # type: ignore[union-attr]
    assert queue_host in compose()["services"]


def test_compose_gives_every_worker_replica_its_own_workspace() -> None:
    worker = compose()["services"]["worker"]
    workspace = "/var/lib/gitward/workspace"
    assert worker["volumes"] == [workspace]  # anonymous: one per container
    assert "container_name" not in worker and "ports" not in worker  # --scale works
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"GITWARD_WORKSPACE={workspace}" in dockerfile
    assert f'VOLUME ["{workspace}"]' in dockerfile


def worker_grace(environment: dict[str, str]) -> float:
    """The ``GITWARD_WORKER_GRACE`` these files give workers (the setting's default if
    unset)."""
    return float(environment.get("GITWARD_WORKER_GRACE", WORKER_GRACE_DEFAULT))


def test_compose_stop_grace_is_the_worker_grace_plus_the_pool_margin() -> None:
    worker = compose()["services"]["worker"]
    assert worker["command"][0] == "worker"
    grace = worker_grace(worker["environment"])
    assert grace == WORKER_GRACE_DEFAULT  # the files show the default, spelled out
    assert seconds(worker["stop_grace_period"]) == grace + ORCHESTRATOR_MARGIN


def test_compose_runs_two_web_replicas_behind_a_websocket_proxy() -> None:
    services = compose()["services"]
    assert services["web"]["deploy"]["replicas"] == 2
    assert "ports" not in services["web"]
    (mount,) = services["proxy"]["volumes"]
    source = ROOT / mount.split(":")[0]
    conf = source.read_text()
    assert "proxy_set_header Upgrade $http_upgrade;" in conf
    assert "proxy_set_header Connection $connection_upgrade;" in conf
    assert "http://web:8000" in conf


def test_compose_migrates_once_before_web_and_workers() -> None:
    services = compose()["services"]
    assert services["migrate"]["command"] == ["migrate", "--noinput"]
    for name in ("web", "worker"):
        dep = services[name]["depends_on"]["migrate"]
        assert dep["condition"] == "service_completed_successfully"


# ------------------------------------------------------------------ image invariants


def test_the_image_is_non_root_and_checks_readiness() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)$", dockerfile, flags=re.M)
    assert stages == ["build", "runtime"] and "COPY --from=build" in dockerfile
    (user,) = re.findall(r"^USER (\S+)$", dockerfile, flags=re.M)
    assert user.split(":")[0].isdigit() and int(user.split(":")[0]) != 0
    assert re.search(r'HEALTHCHECK [^\n]*\\\n\s+CMD \["python", "-c", "[^\n]*/readyz', dockerfile)
    # Workers serve no HTTP: their containers check readiness with the command.
    worker = compose()["services"]["worker"]["healthcheck"]["test"]
    assert worker[:4] == ["CMD", "python", "manage.py", "ready"]
    assert "collectstatic" in dockerfile
    assert (ROOT / "dashboard" / "management" / "commands" / "ready.py").exists()


# ------------------------------------------------------------------ kubernetes invariants


def test_k8s_worker_grace_is_the_worker_grace_plus_the_pool_margin() -> None:
    worker = find("StatefulSet", "gitward-worker")["spec"]
    grace = worker["template"]["spec"]["terminationGracePeriodSeconds"]
    config = find("ConfigMap", "gitward-config")["data"]
    assert worker_grace(config) == WORKER_GRACE_DEFAULT
    assert grace == worker_grace(config) + ORCHESTRATOR_MARGIN
    assert grace == seconds(compose()["services"]["worker"]["stop_grace_period"])


def test_k8s_worker_pods_each_claim_their_own_workspace() -> None:
    spec = find("StatefulSet", "gitward-worker")["spec"]
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    (container,) = spec["template"]["spec"]["containers"]
    (mount,) = container["volumeMounts"]
    assert (mount["name"], mount["mountPath"]) == (
        claim["metadata"]["name"],
        "/var/lib/gitward/workspace",
    )
    assert "volumes" not in spec["template"]["spec"]  # nothing shared between pods


def test_the_green_worker_slot_is_the_blue_one_beside_it() -> None:
    """docs/rollouts.md#code-rollouts-bluegreen: the green slot runs the same workers (grace,
    workspace, probes, arguments, configuration) from another image, at 0 replicas between
    releases; its pods are selected by its own StatefulSet, Service and budget only, and
    Compose's green service is the worker service under a profile."""
    blue = find("StatefulSet", "gitward-worker")["spec"]
    green = find("StatefulSet", "gitward-worker-green")["spec"]
    assert green["replicas"] == 0 and blue["replicas"] > 0
    blue_pod, green_pod = blue["template"]["spec"], green["template"]["spec"]
    (blue_c,), (green_c,) = blue_pod["containers"], green_pod["containers"]
    assert green_c["image"] != blue_c["image"]
    assert {k: v for k, v in green_c.items() if k != "image"} == {
        k: v for k, v in blue_c.items() if k != "image"
    }
    assert {k: v for k, v in green_pod.items() if k != "containers"} == {
        k: v for k, v in blue_pod.items() if k != "containers"
    }
    assert green["volumeClaimTemplates"] == blue["volumeClaimTemplates"]
    blue_sel, green_sel = blue["selector"]["matchLabels"], green["selector"]["matchLabels"]
    assert blue_sel != green_sel
    assert not set(green_sel.items()) <= set(blue["template"]["metadata"]["labels"].items())
    assert not set(blue_sel.items()) <= set(green["template"]["metadata"]["labels"].items())
    for kind in ("Service", "PodDisruptionBudget"):
        selector = find(kind, "gitward-worker-green")["spec"]["selector"]
        assert selector.get("matchLabels", selector) == green_sel
    services = compose()["services"]
    worker, slot = services["worker"], services["worker-green"]
    assert slot["profiles"] == ["green"] and "profiles" not in worker
    assert slot["image"] != worker["image"]
    same = ("command", "healthcheck", "volumes", "stop_grace_period", "deploy", "environment")
    assert {k: slot[k] for k in same} == {k: worker[k] for k in same}


def test_k8s_probes_use_readyz_the_ready_command_and_healthz() -> None:
    web = find("Deployment", "gitward-web")["spec"]["template"]["spec"]["containers"][0]
    worker = find("StatefulSet", "gitward-worker")["spec"]["template"]["spec"]["containers"][0]
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert worker["readinessProbe"]["exec"]["command"][:3] == ["python", "manage.py", "ready"]
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    host = {h["name"]: h["value"] for h in web["livenessProbe"]["httpGet"]["httpHeaders"]}["Host"]
    config = find("ConfigMap", "gitward-config")["data"]
    assert host in config["GITWARD_ALLOWED_HOSTS"].split(",")


def test_one_image_runs_every_role_configured_by_a_configmap_and_a_secret() -> None:
    """Compose and Kubernetes run web, workers and the migration from the same image,
    the role picked by the command (the image's entrypoint is ``python manage.py``); every
    gitward pod takes its configuration from the ConfigMap and the Secret."""
    services = compose()["services"]
    roles = {name: services[name] for name in ("web", "worker", "migrate")}
    assert {s["image"] for s in roles.values()} == {"gitward:latest"}
    assert [roles[n]["command"][0] for n in ("web", "worker", "migrate")] == [
        "up", "worker", "migrate"]  # fmt: skip
    pods = {
        "web": find("Deployment", "gitward-web")["spec"]["template"]["spec"],
        "worker": find("StatefulSet", "gitward-worker")["spec"]["template"]["spec"],
        "migrate": find("Job", "gitward-migrate")["spec"]["template"]["spec"],
    }
    containers = {role: spec["containers"][0] for role, spec in pods.items()}
    assert len({c["image"] for c in containers.values()}) == 1
    assert containers["web"]["args"][:3] == ["up", "--workers", "0"]
    assert containers["worker"]["args"][0] == "worker"
    assert containers["migrate"]["args"][0] == "migrate"
    for c in containers.values():
        refs = {next(iter(r)): next(iter(r.values()))["name"] for r in c["envFrom"]}
        assert refs == {"configMapRef": "gitward-config", "secretRef": "gitward-secrets"}
    assert find("ConfigMap", "gitward-config") and find("Secret", "gitward-secrets")
    # The web Service sends traffic to the web pods' named port, and only to them.
    service = find("Service", "gitward-web")["spec"]
    labels = find("Deployment", "gitward-web")["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert service["selector"]["app.kubernetes.io/component"] == "web"
    ports = {p["name"] for p in containers["web"]["ports"]}
    assert {p["targetPort"] for p in service["ports"]} <= ports
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["tini", "--", "python", "manage.py"]' in dockerfile


def test_k8s_has_three_separate_lock_master_statefulsets_and_budgets() -> None:
    config = find("ConfigMap", "gitward-config")["data"]
    hosts = [re.match(r"redis://([^:/]+)", u).group(1) for u in config["REDIS_URLS"].split(",")]  # type: ignore[union-attr]
    assert len(set(hosts)) == 3
    for host in hosts:
        spec = find("StatefulSet", host)["spec"]
        assert spec["replicas"] == 1 and spec["volumeClaimTemplates"]
        command = spec["template"]["spec"]["containers"][0]["args"]
        assert redis_option(command, "--appendfsync") == "always"
        assert find("Service", host)
    assert config["REDIS_URL"] not in config["REDIS_URLS"].split(",")
    budgets = {d["metadata"]["name"] for d in manifests() if d["kind"] == "PodDisruptionBudget"}
    assert {"gitward-web", "gitward-worker", "redis-lock-masters"} <= budgets
    assert find("Service", "postgres")["spec"]["type"] == "ExternalName"


# ------------------------------------------------------------------ the validators


def tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} not installed (make install: the deploy extra is in the lock)")
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_hadolint_passes_the_dockerfile_and_catches_a_bad_one(tmp_path: Path) -> None:
    hadolint = tool("hadolint")
    good = run(hadolint, "Dockerfile")
    assert good.returncode == 0, good.stdout + good.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text((ROOT / "Dockerfile").read_text().replace("--no-install-recommends ", ""))
    failed = run(hadolint, str(bad))
    assert failed.returncode != 0 and "DL3015" in failed.stdout


def test_compose_matches_the_compose_specification(tmp_path: Path) -> None:
    check = tool("check-jsonschema")
    schema = "deploy/schema/compose-spec.json"
    good = run(check, "--schemafile", schema, "compose.yaml")
    assert good.returncode == 0, good.stdout + good.stderr
    bad = tmp_path / "compose.yaml"
    bad.write_text((ROOT / "compose.yaml").read_text().replace("stop_grace_period:", "stop_grace:"))
    failed = run(check, "--schemafile", schema, str(bad))
    assert failed.returncode != 0 and "stop_grace" in failed.stdout


def test_k8s_manifests_match_the_kubernetes_api(tmp_path: Path) -> None:
    validate = tool("kubernetes-validate")
    files = sorted(str(p) for p in K8S.glob("*.yaml"))
    assert len(files) >= 6
    good = run(validate, "--strict", "--quiet", "-k", K8S_VERSION, *files)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = tmp_path / "worker.yaml"
    bad.write_text(
        (K8S / "worker.yaml")
        .read_text()
        .replace("terminationGracePeriodSeconds:", "terminationGracePeriod:")
    )
    failed = run(validate, "--strict", "--quiet", "-k", K8S_VERSION, str(bad))
    assert failed.returncode != 0
    assert "terminationGracePeriod" in failed.stdout + failed.stderr


def test_the_makefile_and_ci_run_the_same_checks() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = makefile.split("\ndeploy-check:")[1].split("\n\n")[0]
    assert "hadolint Dockerfile" in target
    assert "check-jsonschema --schemafile deploy/schema/compose-spec.json compose.yaml" in target
    assert f"K8S_VERSION  ?= {K8S_VERSION}" in makefile
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("\nmake deploy-check\n") < ci.index("\nmake test\n")
    # Both suites over two xdist processes (docs/testing.md#how-long-it-takes), set before
    # any make so every suite of the run gets it.
    assert ci.index('\nexport TEST_JOBS="${TEST_JOBS:-2}"\n') < ci.index("\nmake lint\n")
