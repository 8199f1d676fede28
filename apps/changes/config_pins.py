"""Values every pushed config must carry that a plan cannot read from the live config. A
deployment whose replica count an outside scaler sets (Ray 2.60's scale API) runs the count the
scaler last sent, while the config still says the count it was handed over at: a push of that
config would reset the deployment to it. The app that owns such values (the scaler) registers a
pin here in its `ready()`; the protocol applies every pin to each config it builds to push."""

from __future__ import annotations

from collections.abc import Callable

from apps.clusters.models import Cluster

# (cluster, config) -> (the config to push, one note per value pinned)
Pin = Callable[[Cluster, dict], tuple[dict, list[str]]]

_pins: list[Pin] = []


def register(pin: Pin) -> None:
    if pin not in _pins:
        _pins.append(pin)


def pinned(cluster: Cluster, config: dict) -> tuple[dict, list[str]]:
    notes: list[str] = []
    for pin in _pins:
        config, said = pin(cluster, config)
        notes += said
    return config, notes
