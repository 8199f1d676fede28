"""Credentials at rest: encrypted, rotated to a new key without losing one, never readable
without a key that stored them."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from apps.accounts.models import AuditEvent
from apps.core import secrets
from apps.incidents.models import Webhook
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db


def test_a_secret_is_stored_encrypted_and_reads_back(settings):
    settings.FLEETDECK_ENCRYPTION_KEYS = ["old-key"]
    ciphertext = secrets.encrypt("ray-token-123")
    assert "ray-token-123" not in ciphertext and secrets.decrypt(ciphertext) == "ray-token-123"


def test_rotation_re_encrypts_every_stored_secret_under_the_new_key(settings, team, capsys):
    settings.FLEETDECK_ENCRYPTION_KEYS = ["old-key"]
    cluster = ClusterFactory(name="c", team=team, token_ciphertext=secrets.encrypt("tok"))
    hook = Webhook.objects.create(team=team, url="https://hooks.test/x", secret_ciphertext=secrets.encrypt("hmac"))

    settings.FLEETDECK_ENCRYPTION_KEYS = ["new-key", "old-key"]
    call_command("rotate_secrets")
    assert "clusters.Cluster.token_ciphertext: 1 re-encrypted" in capsys.readouterr().out
    assert AuditEvent.objects.filter(action="secrets.rotate").exists()

    # The old key can go: everything opens with the new one alone.
    settings.FLEETDECK_ENCRYPTION_KEYS = ["new-key"]
    cluster.refresh_from_db()
    hook.refresh_from_db()
    assert secrets.decrypt(cluster.token_ciphertext) == "tok" and secrets.decrypt(hook.secret_ciphertext) == "hmac"


def test_without_the_old_key_nothing_is_lost_and_the_operator_is_told(settings, team):
    settings.FLEETDECK_ENCRYPTION_KEYS = ["lost-key"]
    cluster = ClusterFactory(name="c", team=team, token_ciphertext=secrets.encrypt("tok"))
    settings.FLEETDECK_ENCRYPTION_KEYS = ["new-key"]
    with pytest.raises(CommandError, match="1 stored secret"):
        call_command("rotate_secrets")
    before = cluster.token_ciphertext
    cluster.refresh_from_db()
    assert cluster.token_ciphertext == before
    with pytest.raises(secrets.SecretUnreadable, match="Put the old key back"):
        secrets.decrypt(cluster.token_ciphertext)
