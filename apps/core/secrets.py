"""Encryption at rest for credentials (cluster tokens, webhook URLs and secrets, Kubernetes credentials),
with key rotation: the first key of FLEETDECK_ENCRYPTION_KEYS encrypts, every listed key
decrypts, and `manage.py rotate_secrets` re-encrypts everything stored under the first key."""

from __future__ import annotations

import base64
import functools
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.apps import apps
from django.conf import settings

# Every model field holding ciphertext: the rotation command walks these.
ENCRYPTED_FIELDS: list[tuple[str, str]] = [
    ("clusters.Cluster", "token_ciphertext"),
    ("incidents.Webhook", "url_ciphertext"),
    ("incidents.Webhook", "secret_ciphertext"),
    ("kubernetes_link.KubeConnection", "kubeconfig_ciphertext"),
    ("calibration.MemoryCalibration", "headers_ciphertext"),
]


class SecretUnreadable(Exception):
    pass


def _key(material: str) -> Fernet:
    # Any passphrase works as a key: it is stretched to the 32 bytes Fernet needs.
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(material.encode()).digest()))


def _fernet() -> MultiFernet:
    # The key derived from SECRET_KEY serves development and throwaway machines only: with debug
    # off, settings refuse to start without FLEETDECK_ENCRYPTION_KEY(S).
    keys = tuple(settings.FLEETDECK_ENCRYPTION_KEYS) or (f"fleetdeck-token-key:{settings.SECRET_KEY}",)
    return _fernet_of(keys)


@functools.lru_cache(maxsize=8)
def _fernet_of(keys: tuple[str, ...]) -> MultiFernet:
    # Built once per key list: a list page opens a sealed secret per env var of every row it shows.
    return MultiFernet([_key(k) for k in keys])


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode() if plaintext else ""


def decrypt(ciphertext: str) -> str:
    if not ciphertext:
        return ""
    try:
        return _fernet().decrypt(ciphertext.encode()).decode()
    except InvalidToken as exc:
        raise SecretUnreadable(
            "A stored credential cannot be decrypted: none of FLEETDECK_ENCRYPTION_KEYS (or SECRET_KEY) "
            "is the key it was stored with. Put the old key back in the list, or enter the credential again."
        ) from exc


def rotate() -> dict[str, int]:
    """Re-encrypt every stored secret under the first key. Returns rows rewritten per field;
    a secret no listed key opens is left as it is and counted under "unreadable"."""
    fernet = _fernet()
    counts: dict[str, int] = {"unreadable": 0}
    for label, field in ENCRYPTED_FIELDS:
        model = apps.get_model(label)
        rewritten = 0
        for pk, ciphertext in model.objects.exclude(**{field: ""}).values_list("pk", field).iterator():
            try:
                fresh = fernet.rotate(ciphertext.encode()).decode()
            except InvalidToken:
                counts["unreadable"] += 1
                continue
            model.objects.filter(pk=pk, **{field: ciphertext}).update(**{field: fresh})
            rewritten += 1
        counts[f"{label}.{field}"] = rewritten
    return counts
