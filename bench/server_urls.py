"""The product's URLs plus `/bench/trivial/`: a DRF view with the same authentication, permission
and throttling as every list endpoint, and no database work of its own. It is the baseline that
list endpoints' requests per second are compared with."""

from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.urls import urlpatterns as product


class Trivial(APIView):
    def get(self, request):
        return Response({"ok": True})


urlpatterns = [path("bench/trivial/", Trivial.as_view()), *product]
