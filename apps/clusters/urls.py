from django.urls import path

from apps.clusters import views

app_name = "clusters"
urlpatterns = [
    path("new/", views.cluster_create, name="create"),
    path("<int:pk>/edit/", views.cluster_edit, name="edit"),
    path("<int:pk>/delete/", views.cluster_delete, name="delete"),
    path("<int:pk>/sync/", views.cluster_sync, name="sync"),
]
