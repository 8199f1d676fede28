"""The deployment page's scaler card, rendered by the app that owns it."""

from django import template

from apps.scaler.models import Scaler

register = template.Library()

# The card shows the last few; the API pages through the rest.
SHOWN = 5


@register.inclusion_tag("scaler/partials/card.html")
def scaler_card(deployment):
    scaler = Scaler.objects.filter(deployment=deployment).first()
    decisions = list(scaler.decisions.order_by("-at", "-id")[:SHOWN]) if scaler is not None else []
    return {"scaler": scaler, "decisions": decisions}
