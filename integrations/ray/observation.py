"""What one sync reads from a dashboard, kept as the bytes the dashboard sent.

A sync compares `digest` with the one it stored after the last sync it applied: when they match,
nothing is parsed. The bodies parse on demand, with the errors the blocking client raises."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from integrations.ray.dashboard import (
    CLUSTER_STATUS_PATH,
    SERVE_PATH,
    VERSION_PATH,
    StateQuery,
    actors_page,
    json_body,
    resource_usage,
    serve_status,
    version_info,
)
from integrations.ray.errors import RayError
from integrations.ray.payloads import ServeStatus, StatePage, VersionInfo

# What OOM detection reads: every dead actor with its death cause (the Serve API shows no kills).
DEAD_ACTORS: StateQuery = {"filters": [("state", "=", "DEAD")], "detail": True, "limit": 10_000}


@dataclass(frozen=True)
class Observation:
    # None when the digest matched the one the sync expected, so the version was not asked: a new
    # session (a restart) shows in the Serve status too, as a new controller (see apps/fleet/sync.py).
    version_body: bytes | None
    serve_body: bytes
    # None when the state API did not answer: detection then has no evidence, the sync goes on.
    dead_actors_body: bytes | None
    # The nodes' resources (`/api/cluster_status`), read only when the sync asked for them: left
    # out of the digest, since free resources move with every placement and say nothing new.
    # None: not asked; an error: asked, and the dashboard did not answer.
    resources_body: bytes | RayError | None = None

    @cached_property
    def digest(self) -> str:
        hashed = hashlib.blake2b(digest_size=20)
        for body in (self.serve_body, self.dead_actors_body):
            # Lengths first, so no two different pairs hash alike; a missing page differs from an empty one.
            hashed.update(b"-" if body is None else len(body).to_bytes(8, "big"))
            hashed.update(body or b"")
        return hashed.hexdigest()

    def version(self) -> VersionInfo:
        if self.version_body is None:
            raise ValueError("the version was not read: the answers were expected unchanged")
        return version_info(json_body(VERSION_PATH, self.version_body, "application/json"))

    def serve(self) -> ServeStatus:
        return serve_status(json_body(SERVE_PATH, self.serve_body, "application/json"))

    def resources(self) -> dict[str, dict[str, tuple[float, float]]] | None:
        """The nodes' resources when they were asked for; the read's error raised as it would be."""
        if isinstance(self.resources_body, RayError):
            raise self.resources_body
        if self.resources_body is None:
            return None
        return resource_usage(json_body(CLUSTER_STATUS_PATH, self.resources_body, "application/json"))

    def dead_actors(self) -> StatePage | None:
        if self.dead_actors_body is None:
            return None
        return actors_page(json_body("/api/v0/actors", self.dead_actors_body, "application/json"))
