from django.apps import AppConfig


class MaintenanceConfig(AppConfig):
    name = "apps.maintenance"
    label = "maintenance"

    def ready(self) -> None:
        from apps.changes.signals import change_finished
        from apps.maintenance.services import warm_after_change

        change_finished.connect(warm_after_change, dispatch_uid="maintenance.warm_after_change")
