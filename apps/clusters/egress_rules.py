"""The canonical form of a network allow-list entry (an EgressRule's value), pure so that the model
can check its own value without reading the policy."""

from __future__ import annotations

import ipaddress
import re

from django.core.exceptions import ValidationError

HOST_RULE = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


def normalize_rule(kind: str, raw: str) -> str:
    """The canonical form of an allow-list entry, or ValidationError saying what is wrong."""
    value = (raw or "").strip().lower().rstrip(".")
    if kind == "network":
        try:
            network = ipaddress.ip_network(value, strict=False)
        except ValueError as exc:
            raise ValidationError(
                {"value": f"{raw!r} is not a network: write it as an address or CIDR, e.g. 10.20.0.0/16."}
            ) from exc
        if network.prefixlen == 0:
            # Allowing everything is what an empty list already does, and hides the list's purpose.
            raise ValidationError(
                {"value": "A network of every address allows everything: delete the entries instead."}
            )
        return str(network)
    if kind == "host":
        try:
            ipaddress.ip_address(value.strip("[]"))
        except ValueError:
            pass
        else:
            raise ValidationError({"value": "That is an address: add it as a network (e.g. 10.0.0.7/32)."})
        if not HOST_RULE.match(value) or len(value) > 253:
            raise ValidationError(
                {
                    "value": f"{raw!r} is not a host name: letters, digits, dashes and dots, "
                    "optionally starting with '*.' for every name under a domain."
                }
            )
        return value
    raise ValidationError({"kind": "Choose network or host."})
