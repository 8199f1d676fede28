from django.apps import AppConfig


class ChangesConfig(AppConfig):
    name = "apps.changes"
    label = "changes"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from apps.changes import protocol, retention, rollouts
        from apps.changes.presets import install_builtin_presets
        from apps.changes.signals import change_finished
        from apps.core import ticks

        post_migrate.connect(install_builtin_presets, sender=self)
        change_finished.connect(rollouts.on_change_finished, dispatch_uid="changes.rollouts.on_change_finished")
        ticks.register("changes.reconcile", 20, protocol.due_reconciles)
        ticks.register("changes.rollouts", 30, rollouts.advance_running)
        ticks.register("changes.step_logs", 96, retention.prune_step_logs)
