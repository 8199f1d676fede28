from django.apps import AppConfig


class ScalerConfig(AppConfig):
    name = "apps.scaler"
    label = "scaler"
    verbose_name = "Replica scalers"

    def ready(self) -> None:
        from apps.changes import config_pins
        from apps.changes.signals import change_finished
        from apps.core import ticks
        from apps.scaler import control, retention, shadow

        # After the syncs and their metrics readings have gone out, beside the other periodic reads.
        ticks.register("scaler.shadow", 75, shadow.decide_shadows)
        ticks.register("scaler.decisions", 92, retention.prune_decisions)
        # Every config the push protocol builds keeps an active scaler's count.
        config_pins.register(control.pin_targets)
        change_finished.connect(control.on_change_finished, dispatch_uid="scaler.on_change_finished")
