from django.apps import AppConfig


class LivenessConfig(AppConfig):
    name = "apps.liveness"
    label = "liveness"
    verbose_name = "Worker and beat liveness"
