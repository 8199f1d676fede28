import factory

from apps.accounts.models import Team
from apps.clusters.models import Cluster


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    name = factory.Sequence(lambda n: f"Team {n}")
    slug = factory.Sequence(lambda n: f"team-{n}")


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster-{n:03d}")
    team = factory.SubFactory(TeamFactory)
    dashboard_url = factory.LazyAttribute(lambda c: f"http://{c.name}.test:8265")
    labels = factory.LazyFunction(dict)
