"""Secrets of stored configs are ciphertext in the database and the real values in Python: a
database dump or backup holds no credential, and a push still sends what the cluster had."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from apps.changes.models import Change, Preset
from apps.core import sealed
from apps.fleet.models import Application, ConfigRevision, Deployment
from apps.maintenance.models import WarmupProfile
from tests.factories import ChangeFactory, ClusterFactory

pytestmark = pytest.mark.django_db

TOKEN = "hf_live_sealed_secret_123"
ENV = {"HF_TOKEN": TOKEN, "FLEETDECK_RECYCLE_GENERATION": "3"}
CONFIG = {
    "applications": [
        {
            "name": "demo",
            "import_path": "demo_app:app",
            "runtime_env": {"env_vars": ENV},
            "deployments": [{"name": "Model", "ray_actor_options": {"runtime_env": {"env_vars": {"KEY": TOKEN}}}}],
        }
    ]
}


def stored_text(model, field: str, pk: int) -> str:
    """The column as the database holds it."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT CAST({field} AS TEXT) FROM {model._meta.db_table} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


@pytest.fixture
def deployment():
    cluster = ClusterFactory()
    application = Application.objects.create(cluster=cluster, name="demo", deployed_app_config=CONFIG)
    return Deployment.objects.create(
        application=application, name="Model", effective_config=CONFIG, submitted_config=CONFIG
    )


def test_a_stored_config_holds_ciphertext_where_its_secrets_were_and_reads_back_whole(deployment):
    for model, field, pk in (
        (Application, "deployed_app_config", deployment.application_id),
        (Deployment, "effective_config", deployment.pk),
        (Deployment, "submitted_config", deployment.pk),
    ):
        text = stored_text(model, field, pk)
        assert TOKEN not in text and "sealed:" in text, (field, text)
        assert getattr(model.objects.get(pk=pk), field) == CONFIG
    # Its own recycle counter is no secret, and stays readable in the database too.
    assert "FLEETDECK_RECYCLE_GENERATION" in stored_text(Deployment, "effective_config", deployment.pk)


def test_a_change_seals_its_configs_patch_and_json_patch_and_pushes_the_real_values():
    change = ChangeFactory(
        base_config=CONFIG,
        new_config=CONFIG,
        patch={"ray_actor_options": {"runtime_env": {"env_vars": {"KEY": TOKEN}}}},
        json_patch=[{"op": "replace", "path": "/applications/0/runtime_env/env_vars/HF_TOKEN", "value": TOKEN}],
    )
    for field in ("base_config", "new_config", "patch", "json_patch"):
        assert TOKEN not in stored_text(Change, field, change.pk), field
    fresh = Change.objects.get(pk=change.pk)
    assert fresh.new_config == CONFIG and fresh.json_patch[0]["value"] == TOKEN
    assert list(Change.objects.filter(pk=change.pk).values_list("base_config", flat=True)) == [CONFIG]


def test_presets_revisions_and_warmup_headers_are_sealed_too(deployment):
    preset = Preset.objects.create(
        slug="p", name="p", options={"ray_actor_options": {"runtime_env": {"env_vars": ENV}}}
    )
    revision = ConfigRevision.objects.create(
        cluster=deployment.application.cluster,
        application=deployment.application,
        config_hash="h",
        config={"submitted": CONFIG["applications"][0]},
    )
    profile = WarmupProfile.objects.create(
        application=deployment.application,
        name="w",
        path="/demo",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert TOKEN not in stored_text(Preset, "options", preset.pk)
    assert TOKEN not in stored_text(ConfigRevision, "config", revision.pk)
    headers = stored_text(WarmupProfile, "headers", profile.pk)
    assert TOKEN not in headers and "application/json" in headers
    assert WarmupProfile.objects.get(pk=profile.pk).headers["Authorization"] == f"Bearer {TOKEN}"


def test_a_config_without_secrets_is_stored_as_it_was():
    change = ChangeFactory(base_config={"applications": []}, new_config={"applications": [{"name": "x"}]})
    assert "sealed:" not in stored_text(Change, "new_config", change.pk)


def test_rotation_seals_again_under_the_first_key_and_the_old_key_can_go(deployment, settings):
    settings.FLEETDECK_ENCRYPTION_KEYS = ["old-key"]
    Deployment.objects.filter(pk=deployment.pk).update(effective_config=CONFIG, submitted_config=CONFIG)
    Application.objects.filter(pk=deployment.application_id).update(deployed_app_config=CONFIG)
    before = stored_text(Deployment, "effective_config", deployment.pk)

    settings.FLEETDECK_ENCRYPTION_KEYS = ["new-key", "old-key"]
    counts = sealed.reseal()
    assert counts["unreadable"] == 0 and counts["fleet.Deployment.effective_config"] == 1

    settings.FLEETDECK_ENCRYPTION_KEYS = ["new-key"]
    assert stored_text(Deployment, "effective_config", deployment.pk) != before
    assert Deployment.objects.get(pk=deployment.pk).effective_config == CONFIG


def test_a_secret_no_key_opens_is_counted_and_left_sealed(deployment, settings):
    settings.FLEETDECK_ENCRYPTION_KEYS = ["lost-key"]
    Deployment.objects.filter(pk=deployment.pk).update(submitted_config=CONFIG)
    settings.FLEETDECK_ENCRYPTION_KEYS = ["new-key"]
    # The fixture's rows were sealed under the default key, which is not listed either.
    assert sealed.reseal()["unreadable"] == 3
    assert sealed.is_sealed(
        Deployment.objects.get(pk=deployment.pk).submitted_config["applications"][0]["runtime_env"]["env_vars"][
            "HF_TOKEN"
        ]
    )


@pytest.mark.django_db(transaction=True)
def test_the_migration_seals_what_was_stored_in_plain_json_and_undoing_it_opens_it():
    executor = MigrationExecutor(connection)
    executor.migrate([("changes", "0006_redacted_drift")])
    old = executor.loader.project_state([("changes", "0006_redacted_drift")]).apps
    cluster = old.get_model("clusters", "Cluster").objects.create(
        name="c", team_id=_team(old), dashboard_url="http://x"
    )
    Preset = old.get_model("changes", "Preset")
    preset = Preset.objects.create(slug="p", name="p", options={"runtime_env": {"env_vars": {"K": TOKEN}}})
    assert TOKEN in stored_text(Preset, "options", preset.pk)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("changes", "0007_sealed_secrets")])
    assert TOKEN not in stored_text(Preset, "options", preset.pk)

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("changes", "0006_redacted_drift")])
    assert TOKEN in stored_text(Preset, "options", preset.pk)
    cluster.delete()

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


def _team(old_apps) -> int:
    return old_apps.get_model("accounts", "Team").objects.create(name="T", slug="t").pk
