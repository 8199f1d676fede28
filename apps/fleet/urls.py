from django.urls import path

from apps.fleet import views

app_name = "fleet"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("clusters/<int:pk>/", views.cluster_detail, name="cluster"),
    path("clusters/<int:pk>/status/", views.cluster_status, name="cluster_status"),
    path("deployments/<int:pk>/", views.deployment_detail, name="deployment"),
    path("deployments/<int:pk>/llm-inputs/", views.llm_plan_inputs, name="llm_inputs"),
    path("deployments/<int:pk>/size-metric/", views.size_metric, name="size_metric"),
    path("applications/<int:pk>/history/", views.application_history, name="history"),
    path("revisions/<int:pk>/", views.revision_detail, name="revision"),
]
