import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from controlplane import heap

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = get_wsgi_application()

# Once everything a request needs is loaded (Django imports the URLconf, and through it every
# view and serializer, only at the first request): see controlplane/heap.py.
get_resolver().url_patterns  # noqa: B018 (the access imports every view; that is the point)
heap.freeze()
