"""The deployment page's calibration card, rendered by the app that owns it."""

from django import template

from apps.calibration.views import CARD, card_context

register = template.Library()


@register.inclusion_tag(CARD, takes_context=True)
def calibration_card(context, deployment):
    # An inclusion tag starts from a fresh context: the card's form needs the request for its CSRF token.
    request = context["request"]
    return {"calibration": card_context(request, deployment), "request": request}
