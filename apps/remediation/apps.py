from django.apps import AppConfig


class RemediationConfig(AppConfig):
    name = "apps.remediation"
    label = "remediation"

    def ready(self) -> None:
        from apps.changes.signals import change_finished
        from apps.kubernetes.signals import kube_findings_checked
        from apps.remediation.findings import on_kube_findings_checked
        from apps.remediation.wizards import on_change_finished

        change_finished.connect(on_change_finished, dispatch_uid="remediation.on_change_finished")
        kube_findings_checked.connect(on_kube_findings_checked, dispatch_uid="remediation.on_kube_findings_checked")
