from django.apps import AppConfig


class ChangesConfig(AppConfig):
    name = "apps.changes"
    label = "changes"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from apps.changes.presets import install_builtin_presets

        post_migrate.connect(install_builtin_presets, sender=self)
