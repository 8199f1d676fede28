from django.urls import path

from apps.llm import views

app_name = "llm"
urlpatterns = [
    path("llm/planner/", views.planner, name="planner"),
]
