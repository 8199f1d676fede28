"""The deployment page's request-size card, rendered by the app that reads the signal windows."""

from django import template

from apps.accounts.models import Role
from apps.accounts.permissions import has_role
from apps.fleet.request_sizes import UNITS
from apps.incidents import request_sizes

register = template.Library()


@register.inclusion_tag("incidents/partials/request_sizes_card.html", takes_context=True)
def request_sizes_card(context, deployment):
    request = context.get("request")
    user = getattr(request, "user", None)
    sizes = request_sizes.observed(deployment)
    # The chart's data: times in ms, as the page's clock formats them.
    chart = None
    if sizes["input"] is not None:
        chart = {
            "unit": (sizes["source"] or {}).get("unit", ""),
            "input": [{**p, "t": int(p["t"] * 1000)} for p in sizes["input"]["over_time"]],
            "output": [{**p, "t": int(p["t"] * 1000)} for p in (sizes["output"] or {}).get("over_time", [])],
        }
    return {
        "sizes": sizes,
        "chart": chart,
        "deployment": deployment,
        "units": UNITS,
        "can_operate": user is not None and has_role(user, deployment.application.cluster.team, Role.OPERATOR),
        "csrf_token": context.get("csrf_token"),
    }
