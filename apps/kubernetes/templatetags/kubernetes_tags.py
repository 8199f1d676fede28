"""The cluster page's Kubernetes card, rendered by the app that owns it."""

from django import template

from apps.kubernetes.views import card_context

register = template.Library()


@register.inclusion_tag("kubernetes/partials/card.html", takes_context=True)
def kubernetes_card(context, cluster):
    # The page's own roles decide the card's buttons.
    return {
        "kube": card_context(cluster),
        "cluster": cluster,
        "can_operate": context.get("can_operate"),
        "can_admin": context.get("can_admin"),
    }
