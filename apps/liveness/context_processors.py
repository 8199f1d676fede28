from django.utils.functional import SimpleLazyObject

from apps.liveness import services


def liveness(request):
    """For the banner in the base layout. Lazy: fragments that do not extend it cost no query."""
    return {"liveness": SimpleLazyObject(services.current)}
