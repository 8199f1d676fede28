"""The deployment manifests under deploy/: valid Kubernetes objects against the published
schemas (offline, through kubernetes-validate), and the properties that keep Fleetdeck and the
reference RayService safe to run.

Each property is a `*_problems` function that returns what is wrong; the tests assert the real
manifests have none, and that a deliberately broken copy is caught, so no check passes by
construction."""

from __future__ import annotations

import ast
import copy
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from django.conf import settings

from apps.demo.management.commands.runlocal import Command
from integrations.kubernetes.kinds import READS, WRITES

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUBERAY = DEPLOY / "kuberay"
SETTINGS = ROOT / "controlplane" / "settings.py"
ENV_EXAMPLE = DEPLOY / ".env.example"
# The oldest Kubernetes the manifests promise to work on, and the newest schemas shipped.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Not Kubernetes API objects (Kustomization) or custom resources without a published schema
# (RayService, the Prometheus Operator's ServiceMonitor and PrometheusRule): checked structurally below.
NO_SCHEMA = {"Kustomization", "RayService", "ServiceMonitor", "PrometheusRule"}
SECRET_TEMPLATE = "secret.example.yaml"
READ_VERBS = {"get", "list", "watch"}


@dataclass(frozen=True)
class Doc:
    path: Path
    index: int
    data: dict

    @property
    def id(self) -> str:
        where = self.path.relative_to(DEPLOY) if self.path.is_relative_to(DEPLOY) else self.path.name
        return f"{where}#{self.index}:{self.data.get('kind')}/{self.name}"

    @property
    def name(self) -> str:
        return (self.data.get("metadata") or {}).get("name", "")


def load_docs(*folders: Path, recursive: bool = True) -> list[Doc]:
    docs = []
    for folder in folders:
        pattern = "**/*.y*ml" if recursive else "*.y*ml"
        for path in sorted(folder.glob(pattern)):
            for index, data in enumerate(yaml.safe_load_all(path.read_text())):
                if data is not None:
                    docs.append(Doc(path, index, data))
    return docs


DOCS = load_docs(K8S, KUBERAY)


def kind(docs: list[Doc], name: str) -> list[Doc]:
    return [doc for doc in docs if doc.data.get("kind") == name]


def one(docs: list[Doc], kind_name: str, name: str) -> dict:
    found = [doc.data for doc in kind(docs, kind_name) if doc.name == name]
    assert len(found) == 1, f"expected one {kind_name}/{name}, found {len(found)}"
    return found[0]


def settings_env_vars() -> set[str]:
    """The variables controlplane/settings.py reads, found in its source, not in a list kept by hand."""
    helpers = {"env_str", "env_bool", "env_int", "env_float", "env_list", "getenv"}
    names = set()
    for node in ast.walk(ast.parse(SETTINGS.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        from_environ = (
            isinstance(func, ast.Attribute) and func.attr == "get" and getattr(func.value, "attr", "") == "environ"
        )
        first = node.args[0]
        if (called in helpers or from_environ) and isinstance(first, ast.Constant) and isinstance(first.value, str):
            names.add(first.value)
    return names


SETTINGS_VARS = settings_env_vars()


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "m": 10**-3}


def quantity(value) -> float:
    """A Kubernetes resource quantity ("16Gi", "500m", 2) as a number of bytes or cores."""
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match, f"not a quantity: {value!r}"
    number, suffix = float(match.group(1)), match.group(2)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    assert suffix == "", f"unknown quantity suffix in {value!r}"
    return number


def pod_specs(docs: list[Doc]) -> list[tuple[str, dict]]:
    """Every pod spec, wherever it sits: Deployments, Jobs, and the RayService's groups."""
    found = []
    for doc in docs:
        spec = doc.data.get("spec") or {}
        if doc.data.get("kind") in {"Deployment", "Job"}:
            found.append((doc.id, spec["template"]["spec"]))
        elif doc.data.get("kind") == "RayService":
            cluster = spec["rayClusterConfig"]
            found.append((f"{doc.id} head", cluster["headGroupSpec"]["template"]["spec"]))
            for group in cluster.get("workerGroupSpecs", []):
                found.append((f"{doc.id} {group['groupName']}", group["template"]["spec"]))
    return found


def containers(spec: dict) -> list[dict]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def fleetdeck_docs() -> list[Doc]:
    return load_docs(K8S)


def rayservice_docs() -> list[Doc]:
    return kind(load_docs(KUBERAY), "RayService")


# --- Schemas -------------------------------------------------------------------------------------


def test_the_manifests_exist_where_the_readme_says():
    assert (K8S / "kustomization.yaml").is_file()
    assert (KUBERAY / "rayservice.yaml").is_file()
    assert kind(DOCS, "RayService"), "deploy/kuberay has no RayService"
    assert len([doc for doc in DOCS if doc.data.get("kind") not in NO_SCHEMA]) >= 10


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("doc", [doc for doc in DOCS if doc.data.get("kind") not in NO_SCHEMA], ids=lambda doc: doc.id)
def test_every_kubernetes_object_validates_against_the_strict_schema(doc, version):
    # Strict schemas refuse unknown fields, so a misspelled key fails here instead of being
    # dropped by the API server.
    kubernetes_validate.validate(doc.data, version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_rayservice_pod_templates_validate_as_kubernetes_pod_templates(version):
    # The CRD has no published schema, but its head and worker templates are plain PodTemplateSpecs.
    for doc in rayservice_docs():
        cluster = doc.data["spec"]["rayClusterConfig"]
        groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
        for group in groups:
            wrapped = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": "check"},
                "template": group["template"],
            }
            kubernetes_validate.validate(wrapped, version, strict=True)
        resources = cluster["autoscalerOptions"]["resources"]
        wrapped = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "check"},
            "template": {"spec": {"containers": [{"name": "autoscaler", "image": "ray", "resources": resources}]}},
        }
        kubernetes_validate.validate(wrapped, version, strict=True)


def test_a_misspelled_field_is_refused_by_the_strict_schema():
    deployment = copy.deepcopy(one(DOCS, "Deployment", "fleetdeck-web"))
    deployment["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


# --- Kustomization -------------------------------------------------------------------------------


def kustomization_problems(folder: Path) -> list[str]:
    problems = []
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    listed = kustomization.get("resources", [])
    for resource in listed:
        if not (folder / resource).exists():
            problems.append(f"{folder.name}: lists {resource}, which does not exist")
    if SECRET_TEMPLATE in listed:
        problems.append(f"{folder.name}: applies the Secret template; real secrets are created outside the repository")
    on_disk = {path.name for path in folder.glob("*.yaml")} - {"kustomization.yaml", SECRET_TEMPLATE}
    for name in sorted(on_disk - set(listed)):
        problems.append(f"{folder.name}: {name} is not listed in kustomization.yaml and would never be applied")
    namespace = kustomization.get("namespace")
    if namespace:
        for doc in load_docs(folder, recursive=False):
            meta = doc.data.get("metadata") or {}
            if doc.data.get("kind") in {"Namespace", "ClusterRole", "ClusterRoleBinding", "Kustomization"}:
                continue
            if meta.get("namespace") != namespace:
                problems.append(f"{doc.id}: namespace {meta.get('namespace')!r}, kustomization sets {namespace!r}")
    images = {image["name"] for image in kustomization.get("images", [])}
    for where, spec in pod_specs(load_docs(folder, recursive=False)):
        for container in containers(spec):
            if images and container["image"] not in images:
                problems.append(f"{where}: image {container['image']!r} is not set by the kustomization's images")
    return problems


def test_each_kustomization_applies_every_manifest_in_its_folder_and_nothing_missing():
    folders = sorted({path.parent for path in DEPLOY.rglob("kustomization.yaml")})
    assert K8S in folders
    for folder in folders:
        assert kustomization_problems(folder) == []


def test_a_manifest_left_out_of_the_kustomization_is_caught(tmp_path):
    for path in K8S.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "forgotten.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: fleetdeck}\n"
    )
    assert any("forgotten.yaml" in problem for problem in kustomization_problems(tmp_path))


# --- Environment variables -----------------------------------------------------------------------


def env_problems(docs: list[Doc]) -> list[str]:
    problems = []
    configmaps = {doc.name: doc.data for doc in kind(docs, "ConfigMap")}
    secrets = {doc.name: doc.data for doc in kind(docs, "Secret")}
    for name, configmap in configmaps.items():
        for key in configmap.get("data", {}):
            if key not in SETTINGS_VARS:
                problems.append(f"ConfigMap {name}: {key} is not read by controlplane/settings.py")
    for name, secret in secrets.items():
        for key in {**secret.get("stringData", {}), **secret.get("data", {})}:
            if key not in SETTINGS_VARS:
                problems.append(f"Secret {name}: {key} is not read by controlplane/settings.py")
    for where, spec in pod_specs(docs):
        for container in containers(spec):
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef") or source.get("secretRef") or {}
                known = configmaps if "configMapRef" in source else secrets
                if ref.get("name") not in known:
                    problems.append(f"{where} {container['name']}: envFrom {ref.get('name')!r} is not defined here")
            for var in container.get("env", []):
                if var["name"] not in SETTINGS_VARS:
                    problems.append(
                        f"{where} {container['name']}: {var['name']} is not read by controlplane/settings.py"
                    )
                ref = (var.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    secret = secrets.get(ref["name"])
                    keys = {**secret.get("stringData", {}), **secret.get("data", {})} if secret else {}
                    if ref["key"] not in keys:
                        problems.append(
                            f"{where} {container['name']}: secret key {ref['name']}/{ref['key']} is not in the template"
                        )
                    if ref.get("optional"):
                        problems.append(
                            f"{where} {container['name']}: {var['name']} is optional; a missing value must stop the pod"
                        )
    return problems


def test_every_variable_the_manifests_set_is_one_the_settings_read():
    assert {"FLEETDECK_SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL"} <= SETTINGS_VARS
    assert env_problems(fleetdeck_docs()) == []


def test_a_variable_the_settings_do_not_read_is_caught():
    docs = fleetdeck_docs()
    configmap = kind(docs, "ConfigMap")[0].data
    configmap["data"]["FLEETDECK_DEBUGG"] = "0"
    assert any("FLEETDECK_DEBUGG" in problem for problem in env_problems(docs))


def test_the_secret_template_holds_the_secrets_and_only_placeholders():
    secret = one(fleetdeck_docs(), "Secret", "fleetdeck-secrets")
    values = secret["stringData"]
    assert {"FLEETDECK_SECRET_KEY", "FLEETDECK_ENCRYPTION_KEY", "DATABASE_URL", "CELERY_BROKER_URL"} <= set(values)
    assert all("REPLACE-ME" in value for value in values.values())
    assert values["DATABASE_URL"].startswith("postgres://")
    assert values["CELERY_BROKER_URL"].startswith(("redis://", "rediss://", "amqp://"))


def test_every_fleetdeck_container_gets_every_secret_key_from_the_secret():
    docs = fleetdeck_docs()
    keys = set(one(docs, "Secret", "fleetdeck-secrets")["stringData"])
    for where, spec in pod_specs(docs):
        for container in containers(spec):
            from_secret = {
                var["name"]
                for var in container.get("env", [])
                if (var.get("valueFrom") or {}).get("secretKeyRef", {}).get("name") == "fleetdeck-secrets"
            }
            assert from_secret == keys, f"{where} {container['name']}"
            assert {"configMapRef": {"name": "fleetdeck-config"}} in container["envFrom"], (
                f"{where} {container['name']}"
            )


def test_the_configmap_is_a_production_configuration():
    data = one(fleetdeck_docs(), "ConfigMap", "fleetdeck-config")["data"]
    assert all(isinstance(value, str) for value in data.values())
    assert data["FLEETDECK_DEBUG"] in {"0", "false", "no", "off"}
    assert data.get("FLEETDECK_ALLOW_DEV_SECRET", "0") in {"0", "false", "no", "off"}
    assert data.get("FLEETDECK_TASKS_EAGER", "0") in {"0", "false", "no", "off"}
    # Processes share nothing on disk: a VAR_DIR elsewhere would be a read-only path.
    assert data["FLEETDECK_VAR_DIR"] == "/tmp"


def test_the_env_example_lists_exactly_the_variables_the_settings_read():
    listed, commented = [], set()
    previous = ""
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.match(r"^([A-Z][A-Z0-9_]*)=", line)
        if match:
            listed.append(match.group(1))
            if previous.startswith("# "):
                commented.add(match.group(1))
        previous = line
    assert len(listed) == len(set(listed)), "a variable is listed twice"
    assert set(listed) == SETTINGS_VARS
    assert commented == SETTINGS_VARS, "every variable has its one-line comment right above it"


# --- Workloads -----------------------------------------------------------------------------------


def resource_problems(docs: list[Doc]) -> list[str]:
    problems = []
    for where, spec in pod_specs(docs):
        for container in containers(spec):
            resources = container.get("resources") or {}
            for part in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    if resource not in (resources.get(part) or {}):
                        problems.append(f"{where} {container['name']}: no {resource} {part}")
            memory = [(resources.get(part) or {}).get("memory") for part in ("requests", "limits")]
            if None not in memory and quantity(memory[0]) != quantity(memory[1]):
                # Memory promised by a request but taken by a limit is what the kernel reclaims
                # by OOM-killing the pod when the node runs short.
                problems.append(f"{where} {container['name']}: memory request {memory[0]} != limit {memory[1]}")
    return problems


def test_every_container_has_requests_and_limits_with_memory_requests_equal_to_limits():
    assert resource_problems(DOCS) == []


def test_a_container_without_limits_is_caught():
    docs = fleetdeck_docs()
    worker = one(docs, "Deployment", "fleetdeck-worker")
    del worker["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert any("fleetdeck-worker" in problem and "limits" in problem for problem in resource_problems(docs))


def security_problems(docs: list[Doc]) -> list[str]:
    problems = []
    for where, spec in pod_specs(docs):
        pod = spec.get("securityContext") or {}
        if pod.get("runAsNonRoot") is not True:
            problems.append(f"{where}: runAsNonRoot is not true")
        if (pod.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: no RuntimeDefault seccomp profile")
        for container in containers(spec):
            context = container.get("securityContext") or {}
            if context.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where} {container['name']}: privilege escalation allowed")
            if "ALL" not in ((context.get("capabilities") or {}).get("drop") or []):
                problems.append(f"{where} {container['name']}: capabilities not dropped")
    return problems


def test_every_pod_runs_as_non_root_without_privileges():
    assert security_problems(DOCS) == []


def test_a_pod_that_may_run_as_root_is_caught():
    docs = fleetdeck_docs()
    one(docs, "Deployment", "fleetdeck-beat")["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] = False
    assert any("fleetdeck-beat" in problem for problem in security_problems(docs))


def readonly_problems(docs: list[Doc]) -> list[str]:
    problems = []
    for where, spec in pod_specs(docs):
        empty_dirs = {volume["name"] for volume in spec.get("volumes", []) if "emptyDir" in volume}
        for container in containers(spec):
            if (container.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where} {container['name']}: root filesystem is writable")
            tmp = [mount for mount in container.get("volumeMounts", []) if mount["mountPath"] == "/tmp"]
            if not tmp or tmp[0]["name"] not in empty_dirs:
                problems.append(f"{where} {container['name']}: /tmp is not an emptyDir")
    return problems


def test_fleetdeck_containers_have_a_read_only_root_and_an_empty_dir_tmp():
    # Ray's containers write under /tmp/ray and the image's home; only Fleetdeck's are read-only.
    assert readonly_problems(fleetdeck_docs()) == []


def test_a_writable_root_filesystem_is_caught():
    docs = fleetdeck_docs()
    web = one(docs, "Deployment", "fleetdeck-web")["spec"]["template"]["spec"]["containers"][0]
    web["securityContext"] = {**web["securityContext"], "readOnlyRootFilesystem": False}
    assert any("fleetdeck-web" in problem for problem in readonly_problems(docs))


def web_probe_problems(docs: list[Doc]) -> list[str]:
    from django.urls import Resolver404, resolve

    problems = []
    config = one(docs, "ConfigMap", "fleetdeck-config")["data"]
    allowed_hosts = [host.strip() for host in config.get("FLEETDECK_ALLOWED_HOSTS", "").split(",")]
    spec = one(docs, "Deployment", "fleetdeck-web")["spec"]["template"]["spec"]
    web = next(container for container in spec["containers"] if container["name"] == "web")
    ports = {port.get("name") for port in web.get("ports", [])} | {
        port["containerPort"] for port in web.get("ports", [])
    }
    for probe_name in ("readinessProbe", "livenessProbe"):
        http = (web.get(probe_name) or {}).get("httpGet")
        if not http:
            problems.append(f"web: no HTTP {probe_name}")
            continue
        try:
            resolve(http["path"])
        except Resolver404:
            problems.append(f"web: {probe_name} path {http['path']} is not in the URLconf")
        if http["port"] not in ports:
            problems.append(f"web: {probe_name} port {http['port']!r} is not a container port")
        headers = {header["name"].lower(): header["value"] for header in http.get("httpHeaders", [])}
        # Django answers 400 to a Host it does not know, and the kubelet sends the pod IP.
        if headers.get("host") not in allowed_hosts:
            problems.append(f"web: {probe_name} Host {headers.get('host')!r} is not in FLEETDECK_ALLOWED_HOSTS")
        redirects = config.get("FLEETDECK_SSL_REDIRECT", "0") in {"1", "true", "yes", "on"}
        trusts_proxy = config.get("FLEETDECK_BEHIND_TLS_PROXY", "0") in {"1", "true", "yes", "on"}
        if redirects and not (trusts_proxy and headers.get("x-forwarded-proto") == "https"):
            # A 301 counts as success for the kubelet without the view ever running.
            problems.append(f"web: {probe_name} would be answered by the HTTPS redirect")
    return problems


def test_the_web_probes_reach_the_health_view_through_the_host_and_https_checks():
    assert web_probe_problems(fleetdeck_docs()) == []


def test_a_probe_on_a_missing_path_or_a_disallowed_host_is_caught():
    docs = fleetdeck_docs()
    web = one(docs, "Deployment", "fleetdeck-web")["spec"]["template"]["spec"]["containers"][0]
    web["readinessProbe"]["httpGet"] = {**web["readinessProbe"]["httpGet"], "path": "/health"}
    web["livenessProbe"]["httpGet"] = {
        **web["livenessProbe"]["httpGet"],
        "httpHeaders": [{"name": "Host", "value": "10.0.0.7"}],
    }
    problems = web_probe_problems(docs)
    assert any("/health " in problem for problem in problems)
    assert any("10.0.0.7" in problem for problem in problems)


def test_beat_runs_exactly_once_and_is_recreated_not_rolled():
    beat = one(fleetdeck_docs(), "Deployment", "fleetdeck-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    command = beat["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "beat" in command and "worker" not in command


def test_no_other_workload_runs_celery_beat():
    for doc in kind(fleetdeck_docs(), "Deployment"):
        if doc.name != "fleetdeck-beat":
            for container in containers(doc.data["spec"]["template"]["spec"]):
                assert "beat" not in container.get("command", []), doc.id
                assert "-B" not in container.get("command", []), doc.id


def test_worker_and_beat_commands_name_the_project_celery_app():
    for name, role in (("fleetdeck-worker", "worker"), ("fleetdeck-beat", "beat")):
        command = one(fleetdeck_docs(), "Deployment", name)["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[:3] == ["python", "-m", "celery"] and role in command
        app_module = command[command.index("-A") + 1]
        assert hasattr(importlib.import_module(f"{app_module}.celery"), "app")


def consumed_queues(command: list[str]) -> set[str]:
    for flag in ("--queues", "-Q"):
        if flag in command:
            return set(command[command.index(flag) + 1].split(","))
    return {queue.name for queue in settings.CELERY_TASK_QUEUES}


def test_every_queue_has_a_worker_and_long_waits_have_their_own():
    containers = one(fleetdeck_docs(), "Deployment", "fleetdeck-worker")["spec"]["template"]["spec"]["containers"]
    local = Command()._commands(8000)
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values()}
    for commands in ([c["command"] for c in containers], [cmd for name, cmd in local.items() if "worker" in name]):
        consumed = [consumed_queues(command) for command in commands]
        assert set().union(*consumed) == {queue.name for queue in settings.CELERY_TASK_QUEUES} >= routed
        # The processes that wait minutes on Ray take nothing else, and nothing of theirs goes elsewhere.
        assert {"long"} in consumed and all("long" not in queues or queues == {"long"} for queues in consumed)


def test_workers_outlive_the_longest_change_verification_on_shutdown():
    docs = fleetdeck_docs()
    config = one(docs, "ConfigMap", "fleetdeck-config")["data"]
    verify_s = int(config.get("FLEETDECK_CHANGE_VERIFY_TIMEOUT_S") or 180)
    grace = one(docs, "Deployment", "fleetdeck-worker")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > verify_s


def test_selectors_match_their_pods():
    docs = fleetdeck_docs()
    for doc in kind(docs, "Deployment"):
        labels = doc.data["spec"]["template"]["metadata"]["labels"]
        assert doc.data["spec"]["selector"]["matchLabels"].items() <= labels.items(), doc.id
    web = one(docs, "Deployment", "fleetdeck-web")["spec"]["template"]
    service = one(docs, "Service", "fleetdeck-web")["spec"]
    assert service["selector"].items() <= web["metadata"]["labels"].items()
    port_names = {port["name"] for port in web["spec"]["containers"][0]["ports"]}
    assert all(port["targetPort"] in port_names for port in service["ports"])
    pdb = one(docs, "PodDisruptionBudget", "fleetdeck-web")["spec"]
    assert pdb["selector"]["matchLabels"].items() <= web["metadata"]["labels"].items()


def test_only_pods_that_call_kubernetes_get_the_service_account_token():
    docs = fleetdeck_docs()
    accounts = {doc.name for doc in kind(docs, "ServiceAccount")}
    for doc in [*kind(docs, "Deployment"), *kind(docs, "Job")]:
        spec = doc.data["spec"]["template"]["spec"]
        if doc.name in {"fleetdeck-web", "fleetdeck-worker"}:
            assert spec["serviceAccountName"] in accounts, doc.id
        else:
            assert spec.get("automountServiceAccountToken") is False, doc.id


# --- RBAC ----------------------------------------------------------------------------------------


def rules_of(docs: list[Doc], role_kind: str, name: str) -> list[dict]:
    return one(docs, role_kind, name)["rules"]


def reader_problems(rules: list[dict]) -> list[str]:
    problems = []
    for rule in rules:
        if set(rule["verbs"]) - READ_VERBS:
            problems.append(f"write verbs {sorted(set(rule['verbs']) - READ_VERBS)} on {rule['resources']}")
        if "*" in rule["resources"] or "*" in rule.get("apiGroups", []):
            problems.append(f"wildcard in {rule}")
        if "secrets" in rule["resources"]:
            problems.append("reads secrets")
    # Exactly what the adapter calls: a missing grant breaks a feature, an extra one is unused access.
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if verb in READ_VERBS
    }
    needed = {(group, resource, verb) for (group, resource), verbs in READS.items() for verb in verbs}
    problems += [f"cannot {verb} {group or 'core'}/{resource}" for group, resource, verb in sorted(needed - granted)]
    problems += [
        f"grants {verb} on {group or 'core'}/{resource}, which Fleetdeck never calls"
        for group, resource, verb in sorted(granted - needed)
    ]
    return problems


def test_the_reader_role_reads_what_the_checks_need_and_writes_nothing():
    assert reader_problems(rules_of(fleetdeck_docs(), "ClusterRole", "fleetdeck-reader")) == []


def test_a_write_verb_in_the_reader_role_is_caught():
    rules = copy.deepcopy(rules_of(fleetdeck_docs(), "ClusterRole", "fleetdeck-reader"))
    rules[0]["verbs"].append("delete")
    assert reader_problems(rules) == ["write verbs ['delete'] on ['pods', 'events']"]


def test_a_missing_or_unused_read_in_the_reader_role_is_caught():
    rules = copy.deepcopy(rules_of(fleetdeck_docs(), "ClusterRole", "fleetdeck-reader"))
    rules[0]["verbs"] = ["list", "watch"]
    rules[-1]["verbs"] = []
    assert reader_problems(rules) == [
        "cannot list keda.sh/scaledobjects",
        "grants watch on core/events, which Fleetdeck never calls",
        "grants watch on core/pods, which Fleetdeck never calls",
    ]


def test_the_optional_writer_may_only_patch_rayservices():
    docs = load_docs(DEPLOY / "k8s" / "optional")
    rules = rules_of(docs, "ClusterRole", "fleetdeck-rayservice-writer")
    assert rules == [
        {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
        for (group, resource), verbs in WRITES.items()
    ]
    assert rules == [{"apiGroups": ["ray.io"], "resources": ["rayservices"], "verbs": ["patch"]}]
    # The writer is opt-in: the base kustomization must not grant it.
    assert not [doc for doc in fleetdeck_docs() if doc.name == "fleetdeck-rayservice-writer" and doc.path.parent == K8S]


def test_every_binding_grants_an_existing_role_to_the_fleetdeck_service_account():
    docs = load_docs(K8S)
    roles = {(doc.data["kind"], doc.name) for doc in docs if doc.data["kind"] in {"ClusterRole", "Role"}}
    account = one(docs, "ServiceAccount", "fleetdeck")
    bindings = [*kind(docs, "ClusterRoleBinding"), *kind(docs, "RoleBinding")]
    assert bindings
    for doc in bindings:
        ref = doc.data["roleRef"]
        assert (ref["kind"], ref["name"]) in roles, doc.id
        assert doc.data["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": account["metadata"]["name"],
                "namespace": account["metadata"]["namespace"],
            }
        ], doc.id


def test_the_writer_binding_covers_the_reference_rayservice_namespace():
    binding = one(load_docs(K8S / "optional"), "RoleBinding", "fleetdeck-rayservice-writer")
    namespaces = {doc.data["metadata"]["namespace"] for doc in rayservice_docs()}
    assert namespaces == {binding["metadata"]["namespace"]}


# --- The reference RayService --------------------------------------------------------------------


def rayservice() -> dict:
    docs = rayservice_docs()
    assert len(docs) == 1
    return docs[0].data


def serve_config(service: dict) -> dict:
    raw = service["spec"]["serveConfigV2"]
    # KubeRay takes serveConfigV2 as a string: a mapping here is refused by the CRD.
    assert isinstance(raw, str)
    return yaml.safe_load(raw)


def test_the_rayservice_is_a_ray_io_v1_rayservice_for_the_reference_app():
    service = rayservice()
    assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"
    apps = serve_config(service)["applications"]
    assert [(app["name"], app["import_path"], app["route_prefix"]) for app in apps] == [
        ("reference", "reference_app:app", "/reference")
    ]
    assert [deployment["name"] for deployment in apps[0]["deployments"]] == ["Generator"]


def test_the_serve_config_is_accepted_by_serve_and_by_fleetdeck():
    from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema

    from apps.changes.validation import validate_options

    config = serve_config(rayservice())
    ServeDeploySchema.model_validate(config)
    for app in config["applications"]:
        # Serve drops unknown keys silently, so its own schema passing proves little.
        assert set(app) <= set(ServeApplicationSchema.model_fields), app["name"]
        for deployment in app["deployments"]:
            validate_options({key: value for key, value in deployment.items() if key != "name"})


def playbook_problems(deployment: dict) -> list[str]:
    problems = []
    cap = deployment.get("max_ongoing_requests")
    auto = deployment.get("autoscaling_config") or {}
    if cap not in (1, 2):
        problems.append(f"R1: max_ongoing_requests {cap}, not 1-2")
    if auto.get("target_ongoing_requests") != 1:
        problems.append(f"R2: target_ongoing_requests {auto.get('target_ongoing_requests')}, not 1")
    if (auto.get("min_replicas") or 0) < 2:
        problems.append(f"R2/LAT-1: min_replicas {auto.get('min_replicas')}, below 2")
    if not 0 < (auto.get("upscale_delay_s") or 0) <= 5:
        problems.append(f"R2: upscale_delay_s {auto.get('upscale_delay_s')}, not about 5 s")
    if (auto.get("downscale_delay_s") or 0) < 60:
        problems.append(f"R2: downscale_delay_s {auto.get('downscale_delay_s')}, below 60 s")
    queued = deployment.get("max_queued_requests", -1)
    bound = max(8, 4 * (cap or 5) * (auto.get("max_replicas") or 1))
    if not 1 <= queued <= bound:
        problems.append(f"R10: max_queued_requests {queued}, not bounded within 1..{bound}")
    if (auto.get("max_replicas") or 0) < (auto.get("min_replicas") or 0):
        problems.append("max_replicas below min_replicas")
    return problems


def test_the_generator_follows_the_heavy_model_playbook():
    deployment = serve_config(rayservice())["applications"][0]["deployments"][0]
    assert playbook_problems(deployment) == []
    assert deployment["max_ongoing_requests"] == 2
    assert deployment["autoscaling_config"]["min_replicas"] == 2
    assert deployment["autoscaling_config"]["upscale_delay_s"] == 5
    assert deployment["autoscaling_config"]["downscale_delay_s"] == 300


@pytest.mark.parametrize(
    "change, remedy",
    [
        ({"max_ongoing_requests": 8}, "R1"),
        ({"max_queued_requests": -1}, "R10"),
        ({"autoscaling_config": {"min_replicas": 1}}, "LAT-1"),
        ({"autoscaling_config": {"downscale_delay_s": 10}}, "downscale"),
    ],
)
def test_a_serve_config_off_the_playbook_is_caught(change, remedy):
    deployment = copy.deepcopy(serve_config(rayservice())["applications"][0]["deployments"][0])
    for key, value in change.items():
        if isinstance(value, dict):
            deployment[key].update(value)
        else:
            deployment[key] = value
    assert any(remedy in problem for problem in playbook_problems(deployment))


def ray_groups(service: dict) -> list[tuple[str, dict]]:
    cluster = service["spec"]["rayClusterConfig"]
    return [("head", cluster["headGroupSpec"]), *[(group["groupName"], group) for group in cluster["workerGroupSpecs"]]]


def ray_memory_problems(service: dict) -> list[str]:
    """K1: Ray's view of memory fits the container it runs in (OOM-6)."""
    problems = []
    for name, group in ray_groups(service):
        found = len(problems)
        params = group.get("rayStartParams") or {}
        ray_container = group["template"]["spec"]["containers"][0]
        resources = ray_container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        if "memory" not in limits:
            problems.append(f"{name}: no memory limit")
            continue
        limit = quantity(limits["memory"])
        if quantity(requests.get("memory", 0)) != limit:
            problems.append(f"{name}: memory request {requests.get('memory')} != limit {limits['memory']}")
        for param in ("memory", "object-store-memory"):
            value = params.get(param)
            # rayStartParams is a map of strings; KubeRay refuses numbers.
            if not (isinstance(value, str) and value.isdigit() and int(value) > 0):
                problems.append(f"{name}: rayStartParams {param} is {value!r}, not a byte count")
        if len(problems) == found:
            heap, store = int(params["memory"]), int(params["object-store-memory"])
            if heap + store > limit:
                problems.append(f"{name}: memory {heap} + object store {store} exceed the {limits['memory']} limit")
    return problems


def test_every_ray_container_fits_rays_memory_inside_its_limit():
    assert ray_memory_problems(rayservice()) == []


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (lambda group: group["rayStartParams"].pop("object-store-memory"), "object-store-memory"),
        (lambda group: group["rayStartParams"].update({"memory": str(16 * 2**30)}), "exceed"),
        (
            lambda group: group["template"]["spec"]["containers"][0]["resources"]["requests"].update({"memory": "8Gi"}),
            "!= limit",
        ),
        (lambda group: group["rayStartParams"].update({"memory": 10737418240}), "not a byte count"),
    ],
    ids=["object-store-unsized", "heap-fills-the-limit", "request-below-limit", "number-not-string"],
)
def test_ray_sizes_that_do_not_fit_the_container_are_caught(breakage, expected):
    service = copy.deepcopy(rayservice())
    breakage(service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0])
    assert any(expected in problem for problem in ray_memory_problems(service))


def test_the_minimum_replicas_fit_in_the_minimum_worker_pods():
    service = rayservice()
    deployment = serve_config(service)["applications"][0]["deployments"][0]
    per_replica = deployment["ray_actor_options"]["memory"]
    workers = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    # Ray places a replica only on a node with that much `memory` resource free.
    fit = sum((int(group["rayStartParams"]["memory"]) // per_replica) * group["minReplicas"] for group in workers)
    assert fit >= deployment["autoscaling_config"]["min_replicas"]
    cpus_needed = deployment["ray_actor_options"]["num_cpus"]
    assert all(
        quantity(group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]) >= cpus_needed
        for group in workers
    )


def test_the_head_runs_no_replicas():
    head = rayservice()["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"


def test_ray_containers_carry_kuberays_probes():
    for name, group in ray_groups(rayservice()):
        container = group["template"]["spec"]["containers"][0]
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        readiness = " ".join(container["readinessProbe"]["exec"]["command"])
        liveness = " ".join(container["livenessProbe"]["exec"]["command"])
        assert "api/local_raylet_healthz" in readiness and "api/local_raylet_healthz" in liveness, name
        if name == "head":
            assert "api/gcs_healthz" in readiness and "api/gcs_healthz" in liveness
        else:
            # Workers leave the serve Service when their proxy is unhealthy; they are not restarted for it.
            assert f"localhost:{ports['serve']}/-/healthz" in readiness
            assert "-/healthz" not in liveness
            assert container["readinessProbe"]["failureThreshold"] == 1


def test_the_autoscaler_sidecar_has_memory_requests_equal_to_limits():
    resources = rayservice()["spec"]["rayClusterConfig"]["autoscalerOptions"]["resources"]
    assert quantity(resources["requests"]["memory"]) == quantity(resources["limits"]["memory"])
    assert "cpu" in resources["requests"] and "cpu" in resources["limits"]


def test_the_user_config_names_only_settings_the_reference_app_knows():
    # The app refuses unknown user_config keys, which Serve reports only as DEPLOY_FAILED later.
    source = ast.parse((DEPLOY / "reference_app" / "reference_app.py").read_text())
    settings_class = next(node for node in source.body if isinstance(node, ast.ClassDef) and node.name == "Settings")
    known = {node.target.id for node in settings_class.body if isinstance(node, ast.AnnAssign)}
    deployment = serve_config(rayservice())["applications"][0]["deployments"][0]
    assert deployment["user_config"]
    assert set(deployment["user_config"]) <= known


# --- the monitoring overlay ----------------------------------------------------------------------


def test_the_operator_alert_rules_are_the_tested_rules_file():
    rule = one(load_docs(K8S / "optional" / "monitoring"), "PrometheusRule", "fleetdeck")
    tested = yaml.safe_load((DEPLOY / "monitoring" / "fleetdeck-rules.yml").read_text())
    assert rule["spec"] == tested, "copy deploy/monitoring/fleetdeck-rules.yml's groups into prometheusrule.yaml"


def test_the_service_monitor_scrapes_the_web_service_with_the_token_the_web_pods_get():
    overlay = load_docs(K8S / "optional" / "monitoring")
    monitor = one(overlay, "ServiceMonitor", "fleetdeck")["spec"]
    web = one(fleetdeck_docs(), "Service", "fleetdeck-web")
    assert monitor["selector"]["matchLabels"].items() <= web["metadata"]["labels"].items()
    [endpoint] = monitor["endpoints"]
    assert endpoint["port"] in {port["name"] for port in web["spec"]["ports"]} and endpoint["path"] == "/metrics"
    [patch] = one(overlay, "Kustomization", "")["patches"]
    [operation] = yaml.safe_load(patch["patch"])
    env = operation["value"]
    assert env["name"] == "FLEETDECK_METRICS_TOKEN" and env["name"] in settings_env_vars()
    assert env["valueFrom"]["secretKeyRef"] == endpoint["authorization"]["credentials"]
