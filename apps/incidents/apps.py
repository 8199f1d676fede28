from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    name = "apps.incidents"
    label = "incidents"

    def ready(self) -> None:
        from apps.clusters.pod_kill_events import ray_pods_oom_killed
        from apps.core import ticks
        from apps.fleet import holds
        from apps.fleet.signals import batch_synced, cluster_synced
        from apps.incidents import metrics_jobs, retention, services, webhooks
        from apps.incidents.pod_kills import on_ray_pods_oom_killed
        from apps.incidents.services import recycle_hold

        ray_pods_oom_killed.connect(on_ray_pods_oom_killed, dispatch_uid="incidents.on_ray_pods_oom_killed")
        holds.register("incidents.open_incident", recycle_hold)
        cluster_synced.connect(services.on_cluster_synced, dispatch_uid="incidents.on_cluster_synced")
        cluster_synced.connect(metrics_jobs.on_cluster_synced, dispatch_uid="incidents.request_metrics")
        batch_synced.connect(services.on_batch_synced, dispatch_uid="incidents.on_batch_synced")
        ticks.register("incidents.webhooks", 50, webhooks.lost_deliveries)
        ticks.register("incidents.alerts_still_open", 55, webhooks.alerts_still_open)
        ticks.register("incidents.windows", 98, retention.prune_windows)
