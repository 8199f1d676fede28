"""What a team admin's kubeconfig may not make Fleetdeck do: send its credentials through a proxy
nothing vetted, read files on Fleetdeck's own machines, or borrow Fleetdeck's service account."""

from __future__ import annotations

import base64

import pytest
import urllib3
import yaml
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse

from apps.accounts.audit import Actor
from apps.core import secrets
from apps.kubernetes import discovery, services
from apps.kubernetes.adapters import adapter_for
from apps.kubernetes.models import KubeConnection
from integrations.kubernetes.adapter import KubeAdapter
from integrations.kubernetes.errors import KubeConfigInvalid
from tests.unit.integrations.test_kube_adapter import kubeconfig
from tests.yaml_aliases import alias_bomb, written_out

URL = "/api/v1/kube/connections/"
SERVER = "https://k8s.example.internal:6443"
METADATA_PROXY = "http://169.254.169.254:80"
INLINE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nnot checked offline\n-----END CERTIFICATE-----\n").decode()


def with_proxy(server: str = SERVER) -> dict:
    config = kubeconfig(server)
    config["clusters"][0]["cluster"]["proxy-url"] = METADATA_PROXY
    return config


def with_file(section: str, key: str, path: str, server: str = SERVER) -> dict:
    config = kubeconfig(server)
    config[f"{section}s"][0][section][key] = path
    return config


FILES = [
    ("user", "tokenFile", "token"),
    ("cluster", "certificate-authority", "certificate-authority-data"),
    ("user", "client-certificate", "client-certificate-data"),
    ("user", "client-key", "client-key-data"),
]


# --- the adapter, whatever stored the kubeconfig ----------------------------------------------


@pytest.mark.parametrize("allow_plugins", [False, True])
def test_a_proxy_url_is_refused_even_in_the_operators_own_kubeconfig(allow_plugins):
    with pytest.raises(KubeConfigInvalid, match="connects to the API server directly; remove proxy-url"):
        KubeAdapter.from_kubeconfig(with_proxy(), allow_plugins=allow_plugins)


def test_a_proxy_url_on_a_cluster_the_context_does_not_use_is_refused_too():
    config = kubeconfig(SERVER)
    config["clusters"].append({"name": "elsewhere", "cluster": {"server": SERVER, "proxy-url": METADATA_PROXY}})
    with pytest.raises(KubeConfigInvalid, match="cluster 'elsewhere'"):
        KubeAdapter.from_kubeconfig(config, context="ml")


@pytest.mark.parametrize("section, key, inline", FILES)
def test_a_local_file_reference_is_refused_before_the_file_is_read(tmp_path, section, key, inline):
    secret = tmp_path / "token"
    secret.write_text("fleetdeck-own-service-account-token")
    with pytest.raises(KubeConfigInvalid) as caught:
        KubeAdapter.from_kubeconfig(with_file(section, key, str(secret)))
    assert f"names a local file in {key}" in caught.value.message and f"in {inline} instead" in caught.value.message


def test_inline_certificates_and_keys_are_accepted():
    config = kubeconfig(SERVER)
    config["clusters"][0]["cluster"]["certificate-authority-data"] = INLINE
    config["users"][0]["user"] |= {"client-certificate-data": INLINE, "client-key-data": INLINE}
    KubeAdapter.from_kubeconfig(config).close()


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "https_proxy", "ALL_PROXY"])
def test_environment_proxies_are_not_used_for_the_api_server(monkeypatch, variable):
    monkeypatch.setenv(variable, METADATA_PROXY)
    with KubeAdapter.from_kubeconfig(kubeconfig(SERVER), pin=lambda host, port: "10.1.2.3") as adapter:
        assert adapter._api.configuration.proxy is None
        assert not isinstance(adapter._api.rest_client.pool_manager, urllib3.ProxyManager)


def kubeconfig_text(preferences: str, server: str = SERVER) -> str:
    return f"{yaml.safe_dump(kubeconfig(server))}preferences: {preferences}\n"


def test_a_kubeconfig_file_with_yaml_aliases_is_refused_before_it_is_used(tmp_path):
    path = tmp_path / "config"
    path.write_text(kubeconfig_text(alias_bomb()))
    with pytest.raises(KubeConfigInvalid, match=r"anchors and aliases \(&name / \*name\) are not accepted"):
        KubeAdapter.from_kubeconfig(path, allow_plugins=True)


def test_the_same_kubeconfig_file_written_out_without_aliases_is_used(tmp_path):
    path = tmp_path / "config"
    path.write_text(kubeconfig_text(written_out()))
    KubeAdapter.from_kubeconfig(path, allow_plugins=True).close()


# --- registration and stored rows --------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "config, message",
    [
        (with_proxy("https://127.0.0.1:6443"), "remove proxy-url"),
        *[
            (
                with_file(
                    section, key, "/var/run/secrets/kubernetes.io/serviceaccount/token", "https://127.0.0.1:6443"
                ),
                f"in {inline} instead",
            )
            for section, key, inline in FILES
        ],
    ],
)
def test_the_api_refuses_a_kubeconfig_with_a_proxy_or_a_local_file(api_as, config, message):
    response = api_as("admin").post(
        URL,
        {"name": "prod", "team": "vision", "kubeconfig": yaml.safe_dump(config), "context": "ml", "namespaces": ["ml"]},
        format="json",
    )
    assert response.status_code == 400 and message in str(response.json())
    assert not KubeConnection.objects.exists()


@pytest.mark.django_db
def test_the_service_refuses_a_token_file_with_what_to_do_instead(team, people):
    text = yaml.safe_dump(with_file("user", "tokenFile", "/var/run/secrets/kubernetes.io/serviceaccount/token"))
    with pytest.raises(ValidationError, match="put the token itself in token instead"):
        services.create_connection(
            Actor(user=people["admin"]), team=team, name="prod", namespaces="ml", kubeconfig=text
        )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "config",
    [with_proxy(), with_file("user", "tokenFile", "/var/run/secrets/kubernetes.io/serviceaccount/token")],
    ids=["proxy-url", "tokenFile"],
)
def test_a_kubeconfig_stored_before_the_checks_is_never_used(team, config):
    stored = KubeConnection.objects.create(
        team=team,
        name="old",
        context="ml",
        namespaces=["ml"],
        kubeconfig_ciphertext=secrets.encrypt(yaml.safe_dump(config)),
    )
    with pytest.raises(KubeConfigInvalid):
        adapter_for(stored)
    found = discovery.discover(stored)
    assert found.resources == [] and ("proxy-url" in found.error or "tokenFile" in found.error)


@pytest.mark.django_db
def test_a_kubeconfig_stored_with_yaml_aliases_is_never_used(team):
    stored = KubeConnection.objects.create(
        team=team,
        name="old",
        context="ml",
        namespaces=["ml"],
        kubeconfig_ciphertext=secrets.encrypt(kubeconfig_text(alias_bomb())),
    )
    with pytest.raises(KubeConfigInvalid, match=r"Connection old: .*anchors and aliases"):
        adapter_for(stored)
    assert "anchors and aliases" in discovery.discover(stored).error


@pytest.mark.django_db
def test_a_stored_kubeconfig_that_is_a_path_is_never_read_as_a_file(team, tmp_path):
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig("https://127.0.0.1:6443")))
    stored = KubeConnection.objects.create(
        team=team, name="old", context="ml", namespaces=["ml"], kubeconfig_ciphertext=secrets.encrypt(str(path))
    )
    with pytest.raises(KubeConfigInvalid, match="Connection old: the stored kubeconfig is not a mapping"):
        adapter_for(stored)


# --- Fleetdeck's own service account -----------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("who, status", [("admin", 403), ("root", 201)])
def test_only_superusers_create_in_cluster_connections_through_the_api(api_as, who, status):
    response = api_as(who).post(
        URL, {"name": "prod", "team": "vision", "in_cluster": True, "namespaces": ["ml"]}, format="json"
    )
    assert response.status_code == status, response.content
    if status == 403:
        assert "Only a Fleetdeck superuser" in response.json()["detail"][0]
    assert KubeConnection.objects.filter(in_cluster=True).exists() == (status == 201)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "actor", [lambda people: Actor(user=people["admin"]), lambda people: Actor.system()], ids=["admin", "system"]
)
def test_the_service_refuses_in_cluster_credentials_to_anyone_but_a_superuser(team, people, actor):
    with pytest.raises(PermissionDenied, match="Only a Fleetdeck superuser"):
        services.create_connection(actor(people), team=team, name="prod", namespaces="ml", in_cluster=True)
    assert not KubeConnection.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("who, status", [("admin", 403), ("root", 200)])
def test_only_superusers_move_an_in_cluster_connection_to_other_namespaces(api_as, team, who, status):
    shared = KubeConnection.objects.create(team=team, name="shared", in_cluster=True, namespaces=["ml"])
    response = api_as(who).patch(f"{URL}{shared.pk}/", {"namespaces": ["other-team"]}, format="json")
    assert response.status_code == status, response.content
    shared.refresh_from_db()
    assert shared.namespaces == (["other-team"] if status == 200 else ["ml"])
    # What does not widen its reach stays with the team's admins.
    assert api_as("admin").patch(f"{URL}{shared.pk}/", {"read_only": False}, format="json").status_code == 200


@pytest.mark.django_db
def test_the_form_offers_in_cluster_credentials_to_superusers_only(client, people, team):
    label = "Use Fleetdeck&#x27;s own service account"
    client.force_login(people["admin"])
    assert label not in client.get(reverse("kubernetes:connection_create")).content.decode()
    response = client.post(
        reverse("kubernetes:connection_create"),
        {"name": "prod", "team": team.pk, "in_cluster": "on", "namespaces": "ml"},
    )
    assert response.status_code == 200 and "Paste the kubeconfig" in response.content.decode()
    assert not KubeConnection.objects.exists()

    client.force_login(people["root"])
    assert label in client.get(reverse("kubernetes:connection_create")).content.decode()
    response = client.post(
        reverse("kubernetes:connection_create"),
        {"name": "prod", "team": team.pk, "in_cluster": "on", "namespaces": "ml"},
    )
    assert response.status_code == 302 and KubeConnection.objects.get().in_cluster is True


@pytest.mark.django_db
def test_an_in_cluster_connection_a_team_admin_added_before_the_rule_is_never_used(people, team, monkeypatch):
    from apps.kubernetes.adapters import adapter_for
    from integrations.kubernetes.adapter import KubeAdapter
    from integrations.kubernetes.errors import KubeConfigInvalid

    built = []
    monkeypatch.setattr(
        KubeAdapter, "in_cluster", classmethod(lambda cls, **options: built.append(options) or "adapter")
    )
    legacy = KubeConnection.objects.create(
        team=team, name="legacy", in_cluster=True, namespaces=["ml"], created_by=people["admin"]
    )
    with pytest.raises(KubeConfigInvalid, match="not added by a superuser"):
        adapter_for(legacy)
    assert built == []

    granted = KubeConnection.objects.create(
        team=team, name="granted", in_cluster=True, namespaces=["ml"], created_by=people["root"]
    )
    assert adapter_for(granted) == "adapter" and len(built) == 1
