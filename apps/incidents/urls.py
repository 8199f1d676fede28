from django.urls import path

from apps.incidents import views

app_name = "incidents"
urlpatterns = [
    path("incidents/", views.incident_list, name="list"),
    path("incidents/<int:pk>/", views.incident_detail, name="detail"),
    path("incidents/<int:pk>/<str:action>/", views.incident_action, name="action"),
]
