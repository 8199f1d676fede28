"""Rows a test needs to exist, with the values the suite takes for granted (a Ray 2.60 cluster
behind the replayed dashboard, an OOM kill of `demo/Model`); a test names the fields it is about."""

import factory
from django.utils import timezone

from apps.accounts.models import Team
from apps.changes.models import Change
from apps.clusters.models import Cluster
from apps.incidents.models import Incident
from apps.kubernetes.models import KubeLink

MODEL = {"application": "demo", "deployment": "Model"}


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.Sequence(lambda n: f"team-{n}")


class ClusterFactory(factory.django.DjangoModelFactory):
    """A cluster as registered: the replayed dashboard answers for any host (`use_replay`)."""

    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster-{n:03d}")
    team = factory.SubFactory(TeamFactory)
    dashboard_url = "http://ray.test:8265"
    ray_version = "2.60.0"
    labels = factory.LazyFunction(dict)


class IncidentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Incident

    kind = Incident.Kind.OOM_KILL
    cluster = factory.SubFactory(ClusterFactory)
    application_name = MODEL["application"]
    deployment_name = MODEL["deployment"]
    title = factory.Sequence(lambda n: f"Incident {n}")
    started_at = factory.LazyFunction(timezone.now)
    last_signal_at = factory.SelfAttribute("started_at")


class ChangeFactory(factory.django.DjangoModelFactory):
    """A change as the history holds it: the configs are what a test about them sets."""

    class Meta:
        model = Change

    cluster = factory.SubFactory(ClusterFactory)
    targets = factory.LazyFunction(lambda: [dict(MODEL)])
    reason = "a change"
    base_hash = "a"
    base_config = factory.LazyFunction(dict)
    new_config = factory.LazyFunction(dict)
    new_hash = "b"


class KubeLinkFactory(factory.django.DjangoModelFactory):
    """Needs `connection` (tests/kubeapi.py `connection` points one at the kmock server)."""

    class Meta:
        model = KubeLink

    cluster = factory.SubFactory(ClusterFactory, team=factory.SelfAttribute("..connection.team"))
    kind = KubeLink.Kind.RAYSERVICE
    namespace = "ml"
    name = "vision"
