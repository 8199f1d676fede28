from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_delete, post_save


class ClustersConfig(AppConfig):
    name = "apps.clusters"
    label = "clusters"

    def ready(self) -> None:
        from apps.clusters import network_policy
        from apps.clusters.models import EgressRule
        from integrations import egress

        # The outbound clients vet every address against the allow-list this app keeps, and read
        # every answer under the settings' limits.
        egress.use_policy(network_policy.current)
        egress.use_limits(
            egress.Limits(
                max_bytes=settings.FLEETDECK_OUTBOUND_MAX_BYTES, deadline_s=settings.FLEETDECK_OUTBOUND_DEADLINE_S
            )
        )

        # This process sees an allow-list edit at once; others within network_policy.CACHE_S.
        for signal in (post_save, post_delete):
            signal.connect(
                lambda **kwargs: network_policy.forget(),
                sender=EgressRule,
                weak=False,
                dispatch_uid=f"egress-rules-{signal is post_save}",
            )
