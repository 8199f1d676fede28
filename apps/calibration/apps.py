from django.apps import AppConfig


class CalibrationConfig(AppConfig):
    name = "apps.calibration"
    label = "calibration"
    verbose_name = "Memory calibration"
