from django.urls import path

from apps.kubernetes import views

app_name = "kubernetes"
urlpatterns = [
    path("kubernetes/", views.connection_list, name="connections"),
    path("kubernetes/new/", views.connection_create, name="connection_create"),
    path("kubernetes/<int:pk>/", views.connection_detail, name="connection"),
    path("kubernetes/<int:pk>/edit/", views.connection_edit, name="connection_edit"),
    path("kubernetes/<int:pk>/delete/", views.connection_delete, name="connection_delete"),
    path("kubernetes/<int:pk>/register/", views.register, name="register"),
    path("kubernetes/<int:pk>/link/", views.link, name="link"),
    path("clusters/<int:cluster_pk>/kubernetes/unlink/", views.unlink, name="unlink"),
    path("clusters/<int:cluster_pk>/kubernetes/inspect/", views.inspect, name="inspect"),
]
