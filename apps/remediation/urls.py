from django.urls import path

from apps.remediation import views

app_name = "remediation"
urlpatterns = [
    path("findings/", views.finding_list, name="findings"),
    path("findings/<int:pk>/mute/", views.finding_mute, name="mute"),
    path("wizards/", views.wizard_list, name="wizards"),
    path("wizards/start/", views.wizard_start, name="wizard_start"),
    path("wizards/<int:pk>/", views.wizard_detail, name="wizard"),
    path("wizards/<int:pk>/<slug:action>/", views.wizard_action, name="wizard_action"),
]
