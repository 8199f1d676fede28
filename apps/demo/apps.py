from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The local demo's commands (runlocal, demo_config): they drive every app, so they sit above all."""

    name = "apps.demo"
    label = "demo"
    verbose_name = "Local demo"
