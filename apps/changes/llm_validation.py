"""serve.llm applications in a config about to be pushed: what serve.llm itself would refuse at deploy time.

Serve's PUT accepts any `args`; a serve.llm builder only reads them on the cluster, where an unknown
engine argument or LLMConfig field fails the application seconds after the push (DEPLOY_FAILED with
"Unknown engine argument"). The same checks run here first, so such a config is never pushed."""

from __future__ import annotations

from typing import Any

from apps.llm.recognise import recognise_app_config


def llm_config_problems(app_config: dict[str, Any]) -> list[str]:
    """What serve.llm would refuse in one application config; [] for any other application."""
    recognised = recognise_app_config(app_config)
    # Recognised only by its deployment names, the app builds its LLMConfigs in code Fleetdeck cannot read.
    if recognised is None or recognised.recognised_by != "import_path":
        return []
    name = app_config.get("name") or "the application"
    errors = [*recognised.errors, *(e for model in recognised.models for e in model.errors)]
    return [f"{name}: {error}" for error in errors]


def changed_llm_problems(base_config: dict, new_config: dict) -> list[str]:
    """Problems of the serve.llm applications that the push would add or change; untouched ones are not judged."""
    before = {app.get("name"): app for app in base_config.get("applications") or ()}
    problems: list[str] = []
    for app in new_config.get("applications") or ():
        if before.get(app.get("name")) != app:
            problems += llm_config_problems(app)
    return problems
