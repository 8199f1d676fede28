"""Encryption at rest for cluster credentials."""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


class SecretUnreadable(Exception):
    pass


def _fernet() -> Fernet:
    material = settings.FLEETDECK_ENCRYPTION_KEY or f"fleetdeck-token-key:{settings.SECRET_KEY}"
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(material.encode()).digest()))


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode() if plaintext else ""


def decrypt(ciphertext: str) -> str:
    if not ciphertext:
        return ""
    try:
        return _fernet().decrypt(ciphertext.encode()).decode()
    except InvalidToken as exc:
        raise SecretUnreadable(
            "The stored token cannot be decrypted: FLEETDECK_ENCRYPTION_KEY (or SECRET_KEY) changed. "
            "Enter the cluster's token again."
        ) from exc
