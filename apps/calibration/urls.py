from django.urls import path

from apps.calibration import views

app_name = "calibration"
urlpatterns = [
    path("deployments/<int:deployment_pk>/calibration/", views.card, name="card"),
    path("deployments/<int:deployment_pk>/calibrate/", views.calibrate, name="calibrate"),
]
