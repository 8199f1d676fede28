"""What the wizard tests share: the replayed OOM-killed cluster, a calibration, and small readers
of a wizard's steps."""

from __future__ import annotations

from django.utils import timezone

from apps.accounts.audit import Actor
from apps.calibration.models import MemoryCalibration
from apps.changes.models import Change, ChangeState
from apps.changes.signals import change_finished
from apps.remediation.models import Wizard, WizardStep
from tests.conftest import ray_fixture

LIVE = "serve_applications_oom_t2_demo_via_ingress_after_recovery.json"
DEAD = "state_actors_dead_oom_t2_demo_via_ingress_detail.json"


class Live:
    """The dashboard's Serve payload, editable as if someone changed the cluster."""

    def __init__(self):
        self.payload = ray_fixture(LIVE)

    def __call__(self, request):
        import httpx

        return httpx.Response(200, json=self.payload)

    def model(self) -> dict:
        return self.payload["applications"]["demo"]["deployments"]["Model"]["deployment_config"]


MIB = 2**20


def calibrate(
    cluster, *, baseline_mib=200, per_request_mib=800, levels=(1, 2, 4), service_s=(1.0, 1.0, 1.02)
) -> MemoryCalibration:
    """A finished calibration of demo/Model, as the job reports one."""
    deployment = incidents_deployment(cluster)
    return MemoryCalibration.objects.create(
        deployment=deployment,
        cluster=cluster,
        application_name="demo",
        deployment_name="Model",
        submission_id=f"cal-{levels}",
        state="succeeded",
        axis="concurrency",
        device="cpu",
        shape="handle",
        baseline_bytes=baseline_mib * MIB,
        levels=list(levels),
        points=[
            {"x": k, "peak_bytes": (baseline_mib + k * per_request_mib) * MIB, "service_s": t}
            for k, t in zip(levels, service_s, strict=True)
        ],
        monotone=True,
        finished_at=timezone.now(),
    )


def incidents_deployment(cluster):
    from apps.fleet.models import Deployment

    return Deployment.objects.get(application__cluster=cluster, application__name="demo", name="Model")


def actor(people, who="operator") -> Actor:
    return Actor(user=people[who], via="api")


def by_remedy(wizard: Wizard) -> dict[str, WizardStep]:
    return {s.remedy: s for s in wizard.steps.all() if s.remedy}


def finish(change: Change, state=ChangeState.SUCCEEDED) -> None:
    Change.objects.filter(pk=change.pk).update(state=state, started_at=timezone.now(), finished_at=timezone.now())
    change.refresh_from_db()
    change_finished.send(sender=Change, change=change)
