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
    """The destinations allowed. Nothing listed allows nothing: a Fleetdeck that may call any
    address lets whoever registers a URL read the services around it (SSRF)."""

    networks: tuple[Network, ...] = ()
    hosts: tuple[str, ...] = ()
    # Whose list this is, for the refusal's advice: "" for every team's.
    scope: str = ""
    loaded_at: float = field(default=0.0, compare=False)

    def allows_host(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host.endswith(rule[1:]) if rule.startswith("*.") else host == rule for rule in self.hosts)

    def refusal(self, host: str, raw_address: str) -> str | None:
        """Why `host`, resolved to `raw_address`, may not be called; None when it may."""
        address = ipaddress.ip_address(raw_address)
        if _never(address):
            return f"{host} resolves to {address}, an address Fleetdeck never calls."
        if self.allows_host(host) or any(address in network for network in self.networks):
            return None
        whose = f"{self.scope}'s network allow-list" if self.scope else "the network allow-list"
        entry = f"{address}/{address.max_prefixlen}"
        name = "" if _is_literal(host) else f" or a host entry {host.lower().rstrip('.')}"
        return (
            f"{host} resolves to {address}, which {whose} does not cover, so Fleetdeck did not call it. "
            f"To allow it, an administrator adds a network entry {entry}{name}"
            + (f" for {self.scope}" if self.scope else "")
            + " (Admin › Network allow-list), or lists the network in FLEETDECK_CLUSTER_NETWORKS."
        )


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _never(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    never = address.is_link_local or address.is_multicast or address.is_unspecified
    # Python counts ::1 as reserved; loopback is a legitimate local dashboard.
    never = never or (address.is_reserved and not address.is_loopback) or address in METADATA_ADDRESSES
    mapped = getattr(address, "ipv4_mapped", None)
    return never or (mapped is not None and (mapped.is_link_local or mapped in METADATA_ADDRESSES))


_lock = threading.Lock()
_cached: dict[object, NetworkPolicy] = {}
# The key of the policy every connection is checked against: any destination some team may call.
EVERY_TEAM = "every team"


def current() -> NetworkPolicy:
    """What a connection may reach: the environment's networks and every allow-list entry.
    Which team may register what is narrower (`for_team`); a connection is checked against this
    as well, address by address, so a name that changes address later is still caught."""
    return _cached_or(EVERY_TEAM, lambda: _build(EgressRule.objects.all(), environment=True))


def for_team(team) -> NetworkPolicy:
    """What `team` may point a URL at: its own entries once it has any, else the entries for every
    team and the environment's networks."""
    if team is None:
        return _cached_or(None, lambda: _build(EgressRule.objects.filter(team__isnull=True), environment=True))

    def build() -> NetworkPolicy:
        own = EgressRule.objects.filter(team_id=team.pk)
        if own.exists():
            return _build(own, environment=False, scope=team.name)
        return _build(EgressRule.objects.filter(team__isnull=True), environment=True)

    return _cached_or(team.pk, build)


def _cached_or(key, build) -> NetworkPolicy:
    key = (key, tuple(settings.FLEETDECK_CLUSTER_NETWORKS))
    with _lock:
        policy = _cached.get(key)
        if policy is not None and time.monotonic() - policy.loaded_at < CACHE_S:
            return policy
    policy = build()
    with _lock:
        _cached[key] = policy
    return policy


def _build(rules, *, environment: bool, scope: str = "") -> NetworkPolicy:
    networks = (
        [ipaddress.ip_network(cidr, strict=False) for cidr in settings.FLEETDECK_CLUSTER_NETWORKS]
        if environment
        else []
    )
    hosts = []
    for kind, value in rules.values_list("kind", "value"):
        if kind == EgressRule.Kind.NETWORK:
            networks.append(ipaddress.ip_network(value, strict=False))
        else:
            hosts.append(value)
    return NetworkPolicy(tuple(networks), tuple(hosts), scope=scope, loaded_at=time.monotonic())


def forget() -> None:
    """Drop the cached policies: the next connection reads the rules again."""
    with _lock:
        _cached.clear()
