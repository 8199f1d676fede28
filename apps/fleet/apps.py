from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "apps.fleet"
    label = "fleet"

    def ready(self) -> None:
        from apps.core import ticks
        from apps.fleet import retention, scaling_history, sync

        ticks.register("fleet.sync", 10, sync.due_syncs)
        ticks.register("fleet.scaling_history", 90, scaling_history.prune)
        ticks.register("fleet.revisions", 95, retention.prune_revisions)
