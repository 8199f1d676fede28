from django.apps import AppConfig


class CalibrationConfig(AppConfig):
    name = "apps.calibration"
    label = "calibration"
    verbose_name = "Memory calibration"

    def ready(self) -> None:
        from apps.calibration import services
        from apps.core import ticks

        ticks.register("calibration.polls", 60, services.stale_polls)
