from django.urls import path

from apps.changes import views

app_name = "changes"
urlpatterns = [
    path("changes/", views.change_list, name="list"),
    path("changes/<int:pk>/", views.detail, name="detail"),
    path("changes/<int:pk>/<str:action>/", views.change_action, name="action"),
    path("clusters/<int:cluster_pk>/changes/new/", views.plan, name="plan"),
    path("clusters/<int:cluster_pk>/applications/new/", views.deploy_application, name="deploy_application"),
    path("clusters/<int:cluster_pk>/applications/delete/", views.delete_application, name="delete_application"),
    path("rollouts/", views.rollout_list, name="rollouts"),
    path("rollouts/new/", views.rollout_create, name="rollout_create"),
    path("rollouts/<int:pk>/", views.rollout_detail, name="rollout"),
    path("rollouts/<int:pk>/<str:action>/", views.rollout_action, name="rollout_action"),
    path("revisions/<int:pk>/restore/", views.restore_revision, name="restore_revision"),
    path("presets/", views.preset_list, name="presets"),
    path("presets/new/", views.preset_create, name="preset_create"),
    path("presets/<int:pk>/edit/", views.preset_edit, name="preset_edit"),
    path("presets/<int:pk>/clone/", views.preset_clone, name="preset_clone"),
    path("presets/<int:pk>/delete/", views.preset_delete, name="preset_delete"),
]
