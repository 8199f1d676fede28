"""The calibration job Ray runs: where it may run, what it imports, the memory it must stay
under, and its command line with the measuring script inline."""

from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError

from apps.calibration.curve import MIB
from apps.calibration.job_script import HEADERS_VAR
from apps.fleet.models import Deployment
from integrations.ray.payloads import NodeMemory

JOB_SCRIPT = Path(__file__).with_name("job_script.py")
# Ray's memory monitor kills at this share of a node's memory unless the cluster sets otherwise.
RAY_KILL_THRESHOLD = 0.95
# The share of the room below Ray's threshold a calibration may fill: the rest stays for the
# node's other work, which keeps moving while the job runs.
BUDGET_SHARE = 0.8


def _python() -> str:
    """The interpreter the job runs: the cluster's own Python, which has Ray and the app's code."""
    return settings.FLEETDECK_CALIBRATION_PYTHON


def stop_at_bytes(nodes: list[NodeMemory], cluster_name: str) -> int:
    """Node memory used that the job must not cross: on the tightest node it may run on, what is
    used now plus BUDGET_SHARE of the room below Ray's kill threshold."""
    if not nodes:
        raise ValidationError(
            f"Cluster {cluster_name} reports no node memory, so a calibration could not be kept below "
            "Ray's memory threshold: nothing was calibrated."
        )
    stops = []
    for node in nodes:
        used = node.total_bytes - node.available_bytes
        room = RAY_KILL_THRESHOLD * node.total_bytes - used
        if room <= 0:
            raise ValidationError(
                f"Node {node.node_ip or '?'} of {cluster_name} already uses {used / MIB:.0f} MiB of "
                f"{node.total_bytes / MIB:.0f} MiB, at or past Ray's memory threshold ({RAY_KILL_THRESHOLD:.0%}): a "
                "calibration there could only cause an OOM kill. Free memory first."
            )
        stops.append(int(used + BUDGET_SHARE * room))
    return min(stops)


def _fits(usage: dict[str, tuple[float, float]], needs: dict[str, float]) -> bool:
    return all(
        total - used >= amount
        for resource, amount in needs.items()
        if amount
        for used, total in [usage.get(resource, (0.0, 0.0))]
    )


def fitting_nodes(
    usage_by_node: dict[str, dict[str, tuple[float, float]]], needs: dict[str, float], cluster_name: str
) -> set[str]:
    """IPs of the nodes with `needs` free ("" for a cluster-wide report); none: a clear refusal,
    since the job would wait unscheduled until it timed out."""
    fitting = {ip for ip, usage in usage_by_node.items() if _fits(usage, needs)}
    if fitting:
        return fitting
    wanted = " and ".join(f"{amount:g} {resource}" for resource, amount in needs.items() if amount)
    in_use = "; ".join(
        ", ".join(
            f"{usage.get(resource, (0.0, 0.0))[0]:g} of {usage.get(resource, (0.0, 0.0))[1]:g} {resource} in use"
            for resource, amount in needs.items()
            if amount
        )
        + (f" on {ip}" if ip else "")
        for ip, usage in usage_by_node.items()
    )
    raise ValidationError(
        f"No node of {cluster_name} has {wanted} free for a calibration replica ({in_use}): free some, "
        "or calibrate when the cluster is quieter."
    )


def import_target(deployment: Deployment) -> str:
    """`module:DeploymentName` from the application's import path (`module:app` or `module.app`)."""
    application = deployment.application
    path = (application.import_path or "").strip()
    module = path.split(":", 1)[0] if ":" in path else path.rpartition(".")[0]
    if not module:
        raise ValidationError(
            f"The import path of application {application.name} is unknown"
            f"{f' ({path!r})' if path else ''}: sync the cluster, then calibrate."
        )
    return f"{module}:{deployment.name}"


def job_runtime_env(deployment: Deployment, request: dict | None = None, mix: list[dict] | None = None) -> dict | None:
    """The runtime_env the deployment's replicas get, so the job can import the same code:
    the application's, overlaid with the deployment's own (env_vars merged), as Serve does; with
    the headers of the representative `request`, or a list of those of each request of the `mix`,
    which stay off the job's command line."""
    app_env = (deployment.application.deployed_app_config or {}).get("runtime_env") or {}
    actor_options = (
        deployment.effective_config.get("ray_actor_options")
        or deployment.submitted_config.get("ray_actor_options")
        or {}
    )
    own_env = actor_options.get("runtime_env") or {}
    merged = {**app_env, **own_env}
    env_vars = {**(app_env.get("env_vars") or {}), **(own_env.get("env_vars") or {})}
    if mix:
        if any(entry["request"].get("headers") for entry in mix):
            env_vars[HEADERS_VAR] = json.dumps([entry["request"].get("headers") or {} for entry in mix])
    elif headers := (request or {}).get("headers"):
        env_vars[HEADERS_VAR] = json.dumps(headers)
    if env_vars:
        merged["env_vars"] = env_vars
    return merged or None


def build_entrypoint(
    import_path: str,
    *,
    user_config,
    call=None,
    levels: list[int],
    axis: str = "concurrency",
    python: str | None = None,
    request: dict | None = None,
    stop_at_bytes: int | None = None,
    route_prefix: str | None = None,
    app_name: str = "",
    deployment_name: str = "",
    mix: list[dict] | None = None,
) -> str:
    """The job's shell command: the measuring script shipped inline, so nothing is installed on the
    cluster beforehand. Every argument is shell-quoted. The request, or each request of a `mix`
    (which replaces it), goes without its headers' values: `job_runtime_env` passes them."""
    code = base64.b64encode(JOB_SCRIPT.read_bytes()).decode("ascii")
    loader = f"import base64,sys;exec(compile(base64.b64decode('{code}'),'fleetdeck_calibrate','exec'))"
    args = [
        python or _python(),
        "-c",
        loader,
        "--import-path",
        import_path,
        "--user-config",
        json.dumps(user_config),
        "--axis",
        axis,
        "--levels",
        ",".join(str(k) for k in levels),
    ]
    if call is not None:
        args += ["--call", json.dumps(call)]
    if mix:
        args += [
            "--mix",
            json.dumps([{"request": _without_headers(entry["request"]), "share": entry["share"]} for entry in mix]),
        ]
    elif request is not None:
        args += ["--request", json.dumps({**request, "headers": {}} if request.get("headers") else request)]
    if stop_at_bytes is not None:
        args += ["--stop-at-bytes", str(stop_at_bytes)]
    if route_prefix:
        args += ["--route-prefix", route_prefix]
    if app_name:
        args += ["--app-name", app_name]
    if deployment_name:
        args += ["--deployment-name", deployment_name]
    return shlex.join(args)


def _without_headers(request: dict) -> dict:
    return {**request, "headers": {}} if request.get("headers") else request
