"""The Ray dashboard client's errors. Transient ones (unreachable, timeout, 5xx) may be retried;
permanent ones (auth refused, not a Ray dashboard, validation) need a person."""

from __future__ import annotations

from integrations.errors import AdapterError


class RayError(AdapterError):
    """Any error of the Ray dashboard client."""


class RayUnreachable(RayError):
    transient = True


class RayTimeout(RayError):
    transient = True


class RayAuthRefused(RayError):
    pass


class RayBadResponse(RayError):
    """The server answered, but not like a Ray dashboard (wrong URL, proxy page, garbage, 5xx)."""


class RayValidationError(RayError):
    """Ray refused a request body; `message` is Ray's own (plain-text pydantic) explanation."""


class RayJobNotFound(RayBadResponse):
    """The jobs API has no job with this id (HTTP 404): never submitted, or deleted since."""

    def __init__(self, submission_id: str):
        super().__init__(f"Ray has no job {submission_id!r} (HTTP 404).", status=404)
        self.submission_id = submission_id


class RayScaleUnsupported(RayError):
    """The cluster's Ray predates the scale API (`POST /api/v1/applications/{app}/deployments/{dep}/scale`,
    new in Ray 2.60): an upgrade, not a retry, makes it work."""


class RayExternalScalerDisabled(RayError):
    """Ray refused to scale (HTTP 412): the application was not deployed with
    `external_scaler_enabled: true`, or the deployment is being deleted. `message` is Ray's reason."""


class RayDeploymentNotFound(RayError):
    """The scale API knows no such application or deployment (HTTP 404 with Ray's JSON error)."""


class RayControllerUnavailable(RayError):
    """The Serve controller could not take the request (HTTP 503): Serve is not running, or the
    controller failed on the call; it may answer once it has (re)started."""

    transient = True
