from django.apps import AppConfig


class MaintenanceConfig(AppConfig):
    name = "apps.maintenance"
    label = "maintenance"

    def ready(self) -> None:
        from apps.changes.signals import change_finished
        from apps.core import ticks
        from apps.fleet import activity, vouched_requests
        from apps.maintenance import periodic
        from apps.maintenance.dispatch import warm_after_change
        from apps.maintenance.history import runs_since
        from apps.maintenance.schedules import first_warmup_request, warmup_requests

        change_finished.connect(warm_after_change, dispatch_uid="maintenance.warm_after_change")
        activity.register("maintenance.runs", runs_since)
        ticks.register("maintenance.runs", 40, periodic.due_runs)
        vouched_requests.register("maintenance.warmup_profiles", first_warmup_request)
        vouched_requests.register_mix("maintenance.warmup_profiles", warmup_requests)
