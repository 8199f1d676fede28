from django.urls import path

from apps.scaler import views

app_name = "scaler"
urlpatterns = [
    path("deployments/<int:pk>/scaler/", views.scaler_create, name="create"),
    path("scalers/<int:pk>/<slug:action>/", views.scaler_action, name="action"),
]
