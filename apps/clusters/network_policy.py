"""Which destinations Fleetdeck may call: the allow-list administrators keep (EgressRule rows),
the networks of FLEETDECK_CLUSTER_NETWORKS, and the addresses that are always refused.

Registration forms check a URL against it once; every connection checks each resolved address
again (integrations/egress.py, which this app points at `current`). A policy is read once per
client, never per connection, so an HTTP client used from worker threads never touches the database."""

from __future__ import annotations

import ipaddress
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings

from apps.clusters.models import EgressRule

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Cloud metadata services that are not link-local (AWS over IPv6, Alibaba Cloud).
METADATA_ADDRESSES = {ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")}
# Rules change rarely; worker processes see an edit within this many seconds.
CACHE_S = 5.0


@dataclass(frozen=True)
class NetworkPolicy:
    networks: tuple[Network, ...] = ()
    hosts: tuple[str, ...] = ()
    loaded_at: float = field(default=0.0, compare=False)

    @property
    def restricted(self) -> bool:
        return bool(self.networks or self.hosts)

    def allows_host(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host.endswith(rule[1:]) if rule.startswith("*.") else host == rule for rule in self.hosts)

    def refusal(self, host: str, raw_address: str) -> str | None:
        """Why `host`, resolved to `raw_address`, may not be called; None when it may."""
        address = ipaddress.ip_address(raw_address)
        if _never(address):
            return f"{host} resolves to {address}, an address Fleetdeck never calls."
        if not self.restricted or self.allows_host(host) or any(address in network for network in self.networks):
            return None
        return (
            f"{host} resolves to {address}, outside the networks and hosts this Fleetdeck may reach: "
            "an administrator can add it to the network allow-list."
        )


def _never(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    never = address.is_link_local or address.is_multicast or address.is_unspecified
    # Python counts ::1 as reserved; loopback is a legitimate local dashboard.
    never = never or (address.is_reserved and not address.is_loopback) or address in METADATA_ADDRESSES
    mapped = getattr(address, "ipv4_mapped", None)
    return never or (mapped is not None and (mapped.is_link_local or mapped in METADATA_ADDRESSES))


_lock = threading.Lock()
_cached: dict[tuple, NetworkPolicy] = {}


def current() -> NetworkPolicy:
    """The policy in force: the environment's networks and the administrators' rules."""
    key = tuple(settings.FLEETDECK_CLUSTER_NETWORKS)
    with _lock:
        policy = _cached.get(key)
        if policy is not None and time.monotonic() - policy.loaded_at < CACHE_S:
            return policy
    networks = [ipaddress.ip_network(cidr, strict=False) for cidr in key]
    hosts = []
    for kind, value in EgressRule.objects.values_list("kind", "value"):
        if kind == EgressRule.Kind.NETWORK:
            networks.append(ipaddress.ip_network(value, strict=False))
        else:
            hosts.append(value)
    policy = NetworkPolicy(tuple(networks), tuple(hosts), loaded_at=time.monotonic())
    with _lock:
        _cached.clear()
        _cached[key] = policy
    return policy


def forget() -> None:
    """Drop the cached policy: the next connection reads the rules again."""
    with _lock:
        _cached.clear()
