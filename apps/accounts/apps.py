from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "apps.accounts"
    label = "accounts"

    def ready(self) -> None:
        from apps.accounts import retention, signals  # noqa: F401  (signals: login/logout audit)
        from apps.core import ticks

        ticks.register("accounts.audit", 97, retention.prune_audit)
