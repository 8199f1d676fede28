from django.apps import AppConfig


class ScalerConfig(AppConfig):
    name = "apps.scaler"
    label = "scaler"
    verbose_name = "Replica scalers"

    def ready(self) -> None:
        from apps.core import ticks
        from apps.scaler import retention, shadow

        # After the syncs and their metrics readings have gone out, beside the other periodic reads.
        ticks.register("scaler.shadow", 75, shadow.decide_shadows)
        ticks.register("scaler.decisions", 92, retention.prune_decisions)
