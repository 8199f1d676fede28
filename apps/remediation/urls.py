from django.urls import path

from apps.remediation import views

app_name = "remediation"
urlpatterns = [
    path("findings/", views.finding_list, name="findings"),
    path("findings/<int:pk>/mute/", views.finding_mute, name="mute"),
]
