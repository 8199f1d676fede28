"""The deployment page's scaler card, rendered by the app that owns it."""

from django import template

from apps.accounts.models import Role
from apps.accounts.permissions import has_role
from apps.scaler import comparison
from apps.scaler.models import Scaler

register = template.Library()

# The card shows the last few; the API pages through the rest.
SHOWN = 5


@register.inclusion_tag("scaler/partials/card.html", takes_context=True)
def scaler_card(context, deployment):
    scaler = Scaler.objects.filter(deployment=deployment).first()
    decisions = list(scaler.decisions.order_by("-at", "-id")[:SHOWN]) if scaler is not None else []
    request = context.get("request")
    user = getattr(request, "user", None)
    return {
        "scaler": scaler,
        "decisions": decisions,
        # Beside Serve's autoscaler over the last day: what an operator weighs before "Let it scale".
        "comparison": comparison.for_scaler(scaler) if scaler is not None and decisions else None,
        "deployment": deployment,
        "can_operate": user is not None and has_role(user, deployment.application.cluster.team, Role.OPERATOR),
        "csrf_token": context.get("csrf_token"),
    }
