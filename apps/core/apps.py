from django.apps import AppConfig
from django.db.backends.signals import connection_created


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"
    verbose_name = "Shared plumbing"

    def ready(self) -> None:
        from apps.core import timestamps

        connection_created.connect(timestamps.read_with_fromisoformat, dispatch_uid="core.timestamps")
