from django.apps import AppConfig


class RemediationConfig(AppConfig):
    name = "apps.remediation"
    label = "remediation"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from apps.changes.signals import change_finished
        from apps.core import ticks
        from apps.fleet.signals import cluster_synced
        from apps.incidents.signals import metrics_collected
        from apps.kubernetes.signals import kube_findings_checked
        from apps.maintenance.models import RecycleSchedule, WarmupProfile
        from apps.remediation import findings, verification, wizards

        change_finished.connect(wizards.on_change_finished, dispatch_uid="remediation.on_change_finished")
        kube_findings_checked.connect(
            findings.on_kube_findings_checked, dispatch_uid="remediation.on_kube_findings_checked"
        )
        cluster_synced.connect(findings.on_cluster_synced, dispatch_uid="remediation.on_cluster_synced")
        metrics_collected.connect(findings.on_metrics_collected, dispatch_uid="remediation.on_metrics_collected")
        ticks.register("remediation.verification", 70, verification.evaluate_due)
        ticks.register("remediation.calibrations", 80, wizards.settle_awaiting)
        ticks.register("remediation.orphaned_steps", 85, wizards.settle_orphaned_steps)
        for model in (RecycleSchedule, WarmupProfile):
            for signal in (post_save, post_delete):
                signal.connect(
                    findings.on_recycle_or_warmup_changed, sender=model, dispatch_uid=f"remediation.{model.__name__}"
                )
