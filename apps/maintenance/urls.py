from django.urls import path

from apps.maintenance import views

app_name = "maintenance"
urlpatterns = [
    path("deployments/<int:deployment_pk>/recycle-schedule/", views.schedule_edit, name="schedule"),
    path("deployments/<int:deployment_pk>/recycle/", views.recycle_now, name="recycle"),
    path("applications/<int:application_pk>/warmups/", views.warmups, name="warmups"),
    path("warmups/<int:pk>/run/", views.warmup_run, name="warmup_run"),
    path("maintenance/runs/<int:pk>/", views.run_detail, name="run"),
]
