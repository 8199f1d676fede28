from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver

from apps.accounts.audit import Actor, record


@receiver(user_logged_in)
def _audit_login(sender, request, user, **kwargs):
    record(Actor.from_request(request), "auth.login", user, object_repr=user.get_username())


@receiver(user_logged_out)
def _audit_logout(sender, request, user, **kwargs):
    if user is not None:
        record(Actor.from_request(request), "auth.logout", user, object_repr=user.get_username())


@receiver(user_login_failed)
def _audit_login_failed(sender, credentials, request=None, **kwargs):
    if request is not None:
        username = str(credentials.get("username", ""))[:150]
        record(Actor.from_request(request), "auth.login_failed", object_repr=username)
