"""API tokens expire FLEETDECK_API_TOKEN_TTL_DAYS after they are issued, and whoever holds an
expired one is told when it expired and how to get a new one."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.authtoken.models import Token

pytestmark = pytest.mark.django_db

URL = "/api/v1/clusters/"


def token_issued_days_ago(user, days: float) -> Token:
    token = Token.objects.create(user=user)
    Token.objects.filter(pk=token.pk).update(created=timezone.now() - timedelta(days=days))
    return token


def get_with(client, token: Token):
    return client.get(URL, HTTP_AUTHORIZATION=f"Token {token.key}")


def test_a_token_older_than_its_lifetime_is_refused_with_the_date_and_how_to_get_a_new_one(client, people, settings):
    settings.FLEETDECK_API_TOKEN_TTL_DAYS = 90
    token = token_issued_days_ago(people["viewer"], 91)

    response = get_with(client, token)

    assert response.status_code == 401
    expired_on = timezone.localdate(Token.objects.get(pk=token.pk).created + timedelta(days=90))
    assert response.json()["detail"] == [
        f"This API token expired on {expired_on:%Y-%m-%d}; ask for a new one with "
        "`make token USER=<username>` or `manage.py create_api_token <username>`."
    ]


def test_a_token_within_its_lifetime_works(client, people, settings):
    settings.FLEETDECK_API_TOKEN_TTL_DAYS = 90
    assert get_with(client, token_issued_days_ago(people["viewer"], 89)).status_code == 200
    assert get_with(client, Token.objects.create(user=people["operator"])).status_code == 200


def test_the_lifetime_setting_decides_for_tokens_already_issued(client, people, settings):
    token = token_issued_days_ago(people["viewer"], 10)

    settings.FLEETDECK_API_TOKEN_TTL_DAYS = 7
    assert get_with(client, token).status_code == 401
    settings.FLEETDECK_API_TOKEN_TTL_DAYS = 30
    assert get_with(client, token).status_code == 200


def test_create_api_token_prints_the_token_alone_and_when_it_expires_on_stderr(people, settings):
    settings.FLEETDECK_API_TOKEN_TTL_DAYS = 30
    out, err = StringIO(), StringIO()

    call_command("create_api_token", "viewer", stdout=out, stderr=err)

    token = Token.objects.get(user=people["viewer"])
    assert out.getvalue() == f"{token.key}\n"
    expires = timezone.localdate(token.created + timedelta(days=30))
    assert f"This token expires on {expires:%Y-%m-%d}, 30 days after it was issued" in err.getvalue()
