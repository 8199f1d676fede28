"""Planning a change: pure functions from what a cluster runs to the full config to push.

Ray's PUT replaces every application at once, so a plan always starts from the live config of
*all* applications and changes only what it names. Nothing here does I/O."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from apps.changes.serve_options import (
    DICT_OPTIONS,
    OMITTED_WHEN_NULL,
    autoscaling_defaults,
    for_version,
    unknown_fields,
    unknown_nulls,
    without_unknown,
)
from apps.changes.validation import conflicts
from apps.core.redaction import PlaceholderUnmatched, restore_placeholders, secret_values
from apps.fleet.configs import config_hash, unified_diff
from integrations.ray.payloads import ServeStatus


class PlanError(ValueError):
    """The plan cannot be made; the message says why, for a person."""


@dataclass
class Plan:
    base_config: dict
    base_hash: str
    new_config: dict
    new_hash: str
    json_patch: list
    warnings: list[str] = field(default_factory=list)

    @property
    def diff(self) -> list[str]:
        return unified_diff(self.base_config, self.new_config, old_label="live", new_label="planned")

    @property
    def changes_anything(self) -> bool:
        return self.base_hash != self.new_hash


def live_config(serve: ServeStatus) -> dict:
    """The config that reproduces what runs now: every application as it was submitted."""
    imperative = sorted(name for name, app in serve.applications.items() if app.deployed_app_config is None)
    if imperative:
        raise PlanError(
            f"Application(s) {', '.join(imperative)} were deployed from Python (serve.run), not from a config: "
            "a declarative push would delete them. Redeploy them with a config first."
        )
    config: dict[str, Any] = {
        "applications": [
            copy.deepcopy(serve.applications[name].deployed_app_config) for name in sorted(serve.applications)
        ]
    }
    if serve.target_capacity is not None:
        config["target_capacity"] = serve.target_capacity
    return config


def with_live_values(value: Any, serve: ServeStatus) -> Any:
    """`value` (options or an application config sent back to Fleetdeck) with the secrets its
    placeholders stand for, as the cluster holds them: a config read from Fleetdeck shows
    placeholders, and Ray must get the values. One that stands for none is refused."""
    running = [app.deployed_app_config for app in serve.applications.values()]
    running += [dep.deployment_config for app in serve.applications.values() for dep in app.deployments.values()]
    try:
        return restore_placeholders(value, secret_values(running))
    except PlaceholderUnmatched as exc:
        raise PlanError(str(exc)) from exc


def plan_patch(serve: ServeStatus, targets: list[dict], options: dict, ray_version: str) -> Plan:
    """Apply `options` to each target deployment, merging into its effective options."""
    options = with_live_values(options, serve)
    base = live_config(serve)
    new = copy.deepcopy(base)
    warnings: list[str] = []
    apps = {app["name"]: app for app in new["applications"]}
    for target in targets:
        app_name, dep_name = target["application"], target["deployment"]
        if app_name not in apps:
            raise PlanError(
                f"No application {app_name!r} on this cluster (it has: {', '.join(sorted(apps)) or 'none'})."
            )
        observed = serve.applications[app_name].deployments.get(dep_name)
        if observed is None:
            known = ", ".join(sorted(serve.applications[app_name].deployments)) or "none listed right now"
            raise PlanError(f"No deployment {dep_name!r} in application {app_name!r} (it has: {known}).")
        entries = apps[app_name].setdefault("deployments", [])
        entry = next((d for d in entries if d.get("name") == dep_name), None)
        if entry is None:
            entry = {"name": dep_name}
            entries.append(entry)
        warnings += [
            f"{app_name}/{dep_name}: {problem} (already in its config; left as is)"
            for problem in unknown_fields({k: v for k, v in entry.items() if k != "name"})
        ]
        try:
            merged, notes = merge_options(entry, observed.deployment_config, options)
        except PlanError as exc:
            raise PlanError(f"{app_name}/{dep_name}: {exc}") from exc
        warnings += [f"{app_name}/{dep_name}: {note}" for note in notes]
        problems = conflicts(resulting_options(observed.deployment_config, merged))
        if problems:
            raise PlanError(f"{app_name}/{dep_name}: " + " ".join(problems))
        entry.clear()
        entry.update(for_version(merged, ray_version))
    return finish_plan(base, new, warnings)


def plan_restore(serve: ServeStatus, app_configs: dict[str, dict]) -> Plan:
    """Put back the named applications' configs (from a revision or a change's base)."""
    app_configs = with_live_values(app_configs, serve)
    base = live_config(serve)
    new = copy.deepcopy(base)
    by_name = {app["name"]: i for i, app in enumerate(new["applications"])}
    for name, app_config in app_configs.items():
        if name in by_name:
            new["applications"][by_name[name]] = copy.deepcopy(app_config)
        else:
            new["applications"].append(copy.deepcopy(app_config))
    new["applications"].sort(key=lambda app: app["name"])
    return finish_plan(base, new, [])


def plan_scaler(serve: ServeStatus, application: str, deployment: str, *, external: bool, options: dict) -> Plan:
    """Hand a deployment's replica count to an outside scaler (`external`: the application's
    external_scaler_enabled on, `options` a fixed num_replicas) or back to Serve's autoscaler (the
    flag off, `options` an autoscaling_config). The flag is the application's, and Ray refuses it
    while any of its deployments autoscales, so another deployment that does refuses the plan."""
    app_status = serve.applications.get(application)
    if app_status is None:
        raise PlanError(f"No application {application!r} on this cluster.")
    if external:
        autoscaled = sorted(
            name
            for name, dep in app_status.deployments.items()
            if name != deployment and isinstance(dep.deployment_config.get("autoscaling_config"), dict)
        )
        if autoscaled:
            raise PlanError(
                f"{application}'s deployment(s) {', '.join(autoscaled)} use Serve's autoscaling_config. An outside "
                "scaler is turned on for a whole application (external_scaler_enabled), and Ray refuses it while any "
                "of its deployments autoscales: give them a fixed num_replicas (or scalers of their own) first."
            )
    plan = plan_patch(serve, [{"application": application, "deployment": deployment}], options, "")
    new = copy.deepcopy(plan.new_config)
    app = next(a for a in new["applications"] if a["name"] == application)
    if external:
        app["external_scaler_enabled"] = True
    else:
        # False is Serve's default: leaving the key out says the same and keeps the config as written.
        app.pop("external_scaler_enabled", None)
    return finish_plan(plan.base_config, new, plan.warnings)


def finish_plan(base: dict, new: dict, warnings: list[str], *, deleting: frozenset[str] = frozenset()) -> Plan:
    """The plan from `base` to `new`; only the applications in `deleting` may go."""
    dropped = dropped_applications(base, new, named=set(deleting))
    if dropped:
        raise PlanError(f"The plan would delete application(s) {', '.join(dropped)}; Fleetdeck never does that.")
    return Plan(
        base_config=base,
        base_hash=config_hash(base),
        new_config=new,
        new_hash=config_hash(new),
        json_patch=jsonpatch.make_patch(base, new).patch,
        warnings=warnings,
    )


def dropped_applications(base: dict, new: dict, named: set[str]) -> list[str]:
    before = {app["name"] for app in base.get("applications", [])}
    after = {app["name"] for app in new.get("applications", [])}
    return sorted(before - after - named)


def merge_options(entry: dict, effective: dict, options: dict) -> tuple[dict, list[str]]:
    """The deployment entry after `options`. Serve replaces ray_actor_options, autoscaling_config
    and user_config wholesale, so those start from the *effective* values (which include what the
    code's decorator set), or setting num_cpus would silently drop num_gpus.

    A null is a value like any other: it is sent as null, which Serve keeps (validation refuses
    the nulls it would not). It never removes an option Serve knows: a removed option falls back
    to what the code sets, which Fleetdeck cannot see, so neither the diff nor the verification
    could say what the deployment would run. A null for a name Serve does not know (a legacy
    max_concurrent_queries) removes it: Serve ignores it either way, and the config stops saying
    one thing while the replicas run another."""
    merged = copy.deepcopy(entry)
    autoscaled = _autoscales(entry, effective)
    removals = unknown_nulls(options)
    # Turning autoscaling off gets a note of its own, below.
    notes = [
        f"{path} set to null (sent as null, not removed)."
        for path in _null_paths(options)
        if not (autoscaled and path == "autoscaling_config") and path not in removals
    ]
    notes += [f"{path} removed: Serve does not know it and ignored it, so a null removes it." for path in removals]
    for key, value in options.items():
        if key in DICT_OPTIONS and isinstance(value, dict):
            merged[key] = _deep_merge(_effective_dict(key, entry, effective), value)
        else:
            merged[key] = copy.deepcopy(value)
    for path in removals:
        home, _, inner = path.partition(".")
        if inner and isinstance(merged.get(home), dict):
            merged[home].pop(inner, None)
        elif not inner:
            merged.pop(home, None)
    if isinstance(options.get("autoscaling_config"), dict) and isinstance(merged.get("num_replicas"), int):
        notes.append(f"num_replicas ({merged.pop('num_replicas')}) removed: autoscaling now sets the replica count.")
    if isinstance(options.get("num_replicas"), int) and _autoscales(merged, effective):
        # A null, not a removal: without the key Serve would keep the autoscaling the code sets.
        merged["autoscaling_config"] = None
    if autoscaled and "autoscaling_config" in merged and merged["autoscaling_config"] is None:
        if not isinstance(merged.get("num_replicas"), int):
            raise PlanError(
                "autoscaling_config: null turns autoscaling off, and Serve then runs the replica count the "
                "deployment's code sets (or 1), which Fleetdeck cannot see. Add num_replicas to say how many "
                "replicas it keeps."
            )
        notes.append(
            f"autoscaling_config set to null: autoscaling off, num_replicas fixed at {merged['num_replicas']}."
        )
    return merged, notes


def _autoscales(entry: dict, effective: dict) -> bool:
    if "autoscaling_config" in entry:
        return isinstance(entry["autoscaling_config"], dict)
    return isinstance(effective.get("autoscaling_config"), dict)


def _null_paths(options: dict, prefix: str = ""):
    for key, value in options.items():
        if value is None:
            yield f"{prefix}{key}"
        elif isinstance(value, dict):
            yield from _null_paths(value, f"{prefix}{key}.")


def resulting_options(effective: dict, entry: dict) -> dict:
    """What the deployment will run with: its effective options overlaid with the new entry.
    Conflicts are judged on this, since a value set in code counts as much as a submitted one."""
    result = copy.deepcopy(effective)
    for key, value in entry.items():
        if key == "name":
            continue
        result[key] = (
            _deep_merge(result[key], value)
            if isinstance(value, dict) and isinstance(result.get(key), dict)
            else copy.deepcopy(value)
        )
    if isinstance(entry.get("autoscaling_config"), dict) and "num_replicas" not in entry:
        result.pop("num_replicas", None)
    if "num_replicas" in entry and "autoscaling_config" not in entry:
        result.pop("autoscaling_config", None)
    return result


def _effective_dict(key: str, entry: dict, effective: dict) -> dict:
    """What Serve holds for a wholesale-replaced option before the patch. A submitted dict
    already replaced the code's value, so it is the truth; otherwise the effective value (set
    by the code's decorator) counts, minus what Serve fills in by default: re-sending defaults
    such as the autoscaling `policy` makes Serve rebuild the application's other deployments."""
    if isinstance(entry.get(key), dict):
        return copy.deepcopy(entry[key])
    value = effective.get(key)
    current = value if isinstance(value, dict) else {}
    base = copy.deepcopy(current)
    if key == "ray_actor_options":
        # The effective runtime_env includes what the application level contributes; copying it
        # down would pin those values on the deployment.
        base.pop("runtime_env", None)
    if key == "autoscaling_config":
        defaults = autoscaling_defaults()
        base = {k: v for k, v in base.items() if defaults.get(k, object()) != v}
    return base


def _deep_merge(base: dict, patch: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# --- verification (pure) -------------------------------------------------------------------


@dataclass
class Verdict:
    done: bool
    failure: str = ""
    waiting_for: list[str] = field(default_factory=list)


def expected_deployments(new_config: dict, targets: list, kind: str) -> dict[tuple[str, str], dict]:
    """(application, deployment) -> options the effective config must hold once applied."""
    wanted: dict[tuple[str, str], dict] = {}
    names = {(t["application"], t["deployment"]) for t in targets if isinstance(t, dict)}
    apps = {t if isinstance(t, str) else t["application"] for t in targets}
    for app in new_config.get("applications", []):
        if app["name"] not in apps:
            continue
        for entry in app.get("deployments", []):
            key = (app["name"], entry["name"])
            if kind in ("restore", "create_app") or key in names:
                # A name Serve does not know (left in a config by an older push) is never reported
                # back: expecting it would keep the change from ever verifying.
                wanted[key] = without_unknown({k: v for k, v in entry.items() if k != "name"})
    return wanted


def expected_applications(new_config: dict, applications: list[str]) -> dict[str, dict]:
    """Application -> the application-level fields its status must report once applied: whether
    an outside scaler sets its replica counts (a deployment's options cannot show it)."""
    return {
        app["name"]: {"external_scaler_enabled": bool(app.get("external_scaler_enabled"))}
        for app in new_config.get("applications", [])
        if app["name"] in applications
    }


def verify(
    serve: ServeStatus,
    expected: dict[tuple[str, str], dict],
    base_deploy_times: dict[str, float | None],
    applications: dict[str, dict] | None = None,
) -> Verdict:
    waiting: list[str] = []
    for app_name, fields in sorted((applications or {}).items()):
        app = serve.applications.get(app_name)
        wanted = fields.get("external_scaler_enabled")
        # None: a Ray that does not report the flag, which cannot have it set either.
        if app is not None and app.external_scaler_enabled is not None and app.external_scaler_enabled != wanted:
            waiting.append(f"{app_name}: external_scaler_enabled is not {str(wanted).lower()} yet")
    for app_name in sorted({app for app, _ in expected} | set(base_deploy_times)):
        app = serve.applications.get(app_name)
        if app is None:
            waiting.append(f"{app_name}: not listed yet")
            continue
        # Ray stamps every application with a new deploy time when it takes a declarative
        # config, so an unchanged stamp means our push has not been applied yet.
        redeployed = app.last_deployed_time_s != base_deploy_times.get(app_name)
        if app.status == "DEPLOY_FAILED" and redeployed:
            return Verdict(done=False, failure=f"{app_name} is DEPLOY_FAILED: {app.message.strip()[-2000:]}")
        if app_name in base_deploy_times and not redeployed:
            waiting.append(f"{app_name}: Ray has not applied the push yet")
        elif app.status != "RUNNING":
            waiting.append(f"{app_name}: {app.status}")
    for (app_name, dep_name), options in sorted(expected.items()):
        app = serve.applications.get(app_name)
        dep = app.deployments.get(dep_name) if app else None
        if dep is None:
            waiting.append(f"{app_name}/{dep_name}: not listed yet")
        elif dep.status != "HEALTHY":
            waiting.append(f"{app_name}/{dep_name}: {dep.status}")
        else:
            missing = not_taken(options, dep.deployment_config)
            if missing:
                waiting.append(f"{app_name}/{dep_name}: effective config does not hold {', '.join(missing)} yet")
    return Verdict(done=not waiting, waiting_for=waiting)


def not_taken(wanted: dict, effective: dict, prefix: str = "", exact: bool = False) -> list[str]:
    """Paths of wanted values the effective config does not (yet) hold. A null is held only by a
    null, or, for the options Ray's effective config leaves out when null, by their absence: a
    key Ray does not report is never taken for a null. Serve hands user_config to the replicas
    verbatim, so inside it a key the change does not have is not taken either (`exact`)."""
    missing = []
    for key, value in wanted.items():
        path = f"{prefix}{key}"
        if key not in effective:
            if not (value is None and not prefix and key in OMITTED_WHEN_NULL):
                missing.append(path)
        elif isinstance(value, dict) and isinstance(effective[key], dict):
            missing += not_taken(value, effective[key], f"{path}.", exact or (not prefix and key == "user_config"))
        elif effective[key] != value:
            missing.append(path)
    if exact:
        missing += [f"{prefix}{key}" for key in effective if key not in wanted]
    return missing
