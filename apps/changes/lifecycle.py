"""Planning and verifying the creation and deletion of a whole Serve application: pure functions
over what a cluster runs, like `planner`. Ray's PUT is declarative for the whole cluster, so a new
application is the live config plus one entry, a deletion the live config minus one, and every
other application is sent exactly as it runs (Serve restarts nothing for an identical entry)."""

from __future__ import annotations

import copy

from apps.changes.planner import Plan, PlanError, Verdict, finish_plan, live_config, with_live_values
from integrations.ray.payloads import DeploymentStatus, ServeStatus

# Serve's default when an application config names no route prefix.
DEFAULT_ROUTE_PREFIX = "/"


def plan_create(serve: ServeStatus, app: dict) -> Plan:
    """Add `app` (already validated on its own) to the live config."""
    app = with_live_values(app, serve)
    base = live_config(serve)
    name = app["name"]
    if name in serve.applications:
        raise PlanError(f"An application named {name!r} already runs on this cluster: choose another name.")
    prefix = app.get("route_prefix", DEFAULT_ROUTE_PREFIX)
    holder = next(
        (
            other
            for other, route in sorted(route_prefixes(serve, base).items())
            if prefix is not None and route == prefix
        ),
        None,
    )
    if holder:
        raise PlanError(
            f"Route prefix {prefix!r} is taken by application {holder!r}: Serve refuses two applications on one "
            "route. Choose another route_prefix."
        )
    new = copy.deepcopy(base)
    new["applications"] = sorted([*new["applications"], copy.deepcopy(app)], key=lambda entry: entry["name"])
    return finish_plan(base, new, [f"Adds application {name} at {prefix if prefix is not None else 'no route'}."])


def route_prefixes(serve: ServeStatus, config: dict) -> dict[str, str | None]:
    """{application: its route prefix}, as Serve reports it, else as submitted (or Serve's default)."""
    submitted = {app["name"]: app.get("route_prefix", DEFAULT_ROUTE_PREFIX) for app in config["applications"]}
    return {
        name: (serve.applications[name].route_prefix if name in serve.applications else None) or submitted[name]
        for name in submitted
    }


def plan_delete(serve: ServeStatus, name: str) -> Plan:
    """Remove application `name` from the live config, refusing while another application is seen to call it."""
    base = live_config(serve)
    if name not in serve.applications:
        raise PlanError(
            f"No application {name!r} on this cluster (it has: {', '.join(sorted(serve.applications)) or 'none'})."
        )
    callers = callers_of(serve, name)
    if callers:
        raise PlanError(
            f"Application {name!r} is called by other applications, so deleting it would break them: "
            + "; ".join(callers)
            + ". Delete or change the callers first."
        )
    new = copy.deepcopy(base)
    new["applications"] = [app for app in new["applications"] if app["name"] != name]
    return finish_plan(base, new, [removes(serve, name)], deleting=frozenset({name}))


def removes(serve: ServeStatus, name: str) -> str:
    """What goes with the application: its deployments and their replica counts."""
    deployments = serve.applications[name].deployments
    listed = ", ".join(f"{dep.name} ({_replicas(_replica_count(dep))})" for dep in deployments.values())
    return f"Deletes application {name} and its deployments: {listed or 'none listed by Serve right now'}."


def _replica_count(dep: DeploymentStatus) -> int:
    return dep.target_num_replicas if dep.target_num_replicas is not None else len(dep.replicas)


def _replicas(count: int) -> str:
    return f"{count} replica" + ("" if count == 1 else "s")


def callers_of(serve: ServeStatus, name: str) -> list[str]:
    """Evidence, from what Serve exposes, that other applications call `name`: its deployment
    topology (handles a replica was given at bind time or created while it started) and an
    application's args naming it. Serve reads a replica's handles once, when it becomes
    ready: a handle the code creates later, on a request, shows nowhere, and no check here sees it."""
    evidence = []
    for other, app in sorted(serve.applications.items()):
        if other == name:
            continue
        if name in app.calls:
            evidence.append(f"{other} holds a handle to it (Serve's deployment topology)")
        args = (app.deployed_app_config or {}).get("args") or {}
        paths = _paths_naming(args, name, "args")
        if paths:
            evidence.append(f"{other}'s {', '.join(paths)} names it")
    return evidence


def _paths_naming(value, name: str, path: str) -> list[str]:
    if isinstance(value, dict):
        return [p for key, inner in value.items() for p in _paths_naming(inner, name, f"{path}.{key}")]
    if isinstance(value, list):
        return [p for i, inner in enumerate(value) for p in _paths_naming(inner, name, f"{path}[{i}]")]
    return [path] if value == name else []


def verify_gone(serve: ServeStatus, gone: list[str], config: dict) -> Verdict:
    """The applications in `gone` are no longer listed and every application of `config` (what
    should remain) still runs exactly its submitted config."""
    waiting = [
        f"{name}: still listed ({serve.applications[name].status})" for name in gone if name in serve.applications
    ]
    waiting += others_unchanged(serve, config)
    return Verdict(done=not waiting, waiting_for=waiting)


def others_unchanged(serve: ServeStatus, config: dict, *, besides: frozenset[str] = frozenset()) -> list[str]:
    """Why an application of `config` other than `besides` is not as it was: gone, or running another config."""
    waiting = []
    for app in config.get("applications", []):
        if app["name"] in besides:
            continue
        live = serve.applications.get(app["name"])
        if live is None:
            waiting.append(f"{app['name']}: no longer listed, though this change does not touch it")
        elif live.deployed_app_config != app:
            waiting.append(f"{app['name']}: its config changed, though this change does not touch it")
    return waiting
