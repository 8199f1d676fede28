from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path
from django.views.defaults import page_not_found
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from apps.accounts.api import AuditEventViewSet
from apps.calibration.api import CalibrationViewSet
from apps.changes.api import ChangeViewSet, PresetViewSet
from apps.changes.rollout_api import RolloutViewSet
from apps.clusters.api import ClusterViewSet
from apps.fleet.api import ApplicationViewSet, ConfigRevisionViewSet, DeploymentViewSet
from apps.incidents.api import IncidentViewSet, WebhookViewSet
from apps.kubernetes.api import KubeConnectionViewSet, KubeLinkViewSet
from apps.liveness import services as liveness
from apps.llm.api import PlanView
from apps.maintenance.api import ProfileViewSet, RunViewSet, ScheduleViewSet
from apps.remediation.api import FindingViewSet, WizardViewSet
from apps.scaler.api import DecisionViewSet, ScalerViewSet
from controlplane import metrics as fleet_metrics
from controlplane.api import versioning

router = DefaultRouter()
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("applications", ApplicationViewSet, basename="application")
router.register("deployments", DeploymentViewSet, basename="deployment")
router.register("config-revisions", ConfigRevisionViewSet, basename="configrevision")
router.register("audit-events", AuditEventViewSet, basename="auditevent")
router.register("presets", PresetViewSet, basename="preset")
router.register("changes", ChangeViewSet, basename="change")
router.register("rollouts", RolloutViewSet, basename="rollout")
router.register("maintenance/schedules", ScheduleViewSet, basename="recycleschedule")
router.register("maintenance/warmup-profiles", ProfileViewSet, basename="warmupprofile")
router.register("maintenance/runs", RunViewSet, basename="maintenancerun")
router.register("incidents", IncidentViewSet, basename="incident")
router.register("webhooks", WebhookViewSet, basename="webhook")
router.register("findings", FindingViewSet, basename="finding")
router.register("calibrations", CalibrationViewSet, basename="memorycalibration")
router.register("wizards", WizardViewSet, basename="wizard")
router.register("kube/connections", KubeConnectionViewSet, basename="kubeconnection")
router.register("kube/links", KubeLinkViewSet, basename="kubelink")
router.register("scalers", ScalerViewSet, basename="scaler")
router.register("scaler-decisions", DecisionViewSet, basename="scalerdecision")
# Endpoints that are no viewset, served beside the router's routes in both versions.
api_routes = [path("llm/plan/", PlanView.as_view(), name="llm-plan"), *router.urls]


def healthz(request):
    """Liveness for load balancers: the process answers and the database is reachable (reading the
    heartbeats proves it). It also reports whether the worker and beat keep ticking, for monitoring
    to alert on, without letting that change the status code: restarting web processes revives no
    worker."""
    beats = liveness.current()
    return JsonResponse(
        {
            "status": "ok",
            "worker": {"last_tick_at": beats.worker_at, "stale": beats.worker_stale},
            "beat": {"last_tick_sent_at": beats.beat_at, "stale": beats.beat_stale},
            # Names and counts only: the errors are in the worker's log, not on a public URL.
            "tick": {
                "failing_handlers": [
                    {"handler": name, "ticks_in_a_row": count, "last_failed_at": at}
                    for name, count, at in beats.failing_handlers
                ]
            },
        }
    )


def not_found(request, exception):
    """A URL no route matches: API clients get the API's error shape, people the site's page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": ["Not found."]}, status=404)
    return page_not_found(request, exception)


urlpatterns = [
    path("", include("apps.fleet.urls")),
    path("clusters/", include("apps.clusters.urls")),
    path("", include("apps.changes.urls")),
    path("", include("apps.maintenance.urls")),
    path("", include("apps.incidents.urls")),
    path("", include("apps.remediation.urls")),
    path("", include("apps.calibration.urls")),
    path("", include("apps.kubernetes.urls")),
    path("", include("apps.llm.urls")),
    path("", include("apps.scaler.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include(api_routes)),
    # The same routes, named in the `v2` namespace: controlplane.api.versioning tells the versions apart by it.
    path("api/v2/", include((api_routes, versioning.NAMESPACE))),
    path("api/schema/", SpectacularAPIView.as_view(api_version=versioning.V1), name="schema"),
    path("api/v2/schema/", SpectacularAPIView.as_view(api_version=versioning.V2), name="schema-v2"),
    # The split view serves Swagger UI's set-up as a script of its own, so no inline script is needed.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema-v2"), name="api-docs"),
    path("api/v1/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs-v1"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("metrics", fleet_metrics.metrics, name="metrics"),
]

handler404 = not_found
