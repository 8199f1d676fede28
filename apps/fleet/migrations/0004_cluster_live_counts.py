from django.db import migrations
from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce


def count_live_rows(apps, schema_editor):
    """The counts the sync writes from now on, for the rows already there."""
    Cluster = apps.get_model("clusters", "Cluster")
    Application = apps.get_model("fleet", "Application")
    Deployment = apps.get_model("fleet", "Deployment")

    def per_cluster(queryset, cluster: str):
        counted = queryset.filter(**{cluster: OuterRef("pk")}).order_by().values(cluster).annotate(n=Count("pk"))
        return Coalesce(Subquery(counted.values("n")), 0)

    Cluster.objects.update(
        application_count=per_cluster(Application.objects.filter(removed_at__isnull=True), "cluster"),
        deployment_count=per_cluster(
            Deployment.objects.filter(Q(removed_at__isnull=True) & Q(application__removed_at__isnull=True)),
            "application__cluster",
        ),
    )


class Migration(migrations.Migration):
    dependencies = [
        ("clusters", "0005_cluster_live_counts"),
        ("fleet", "0003_deployment_llm_plan_inputs"),
    ]

    operations = [migrations.RunPython(count_live_rows, migrations.RunPython.noop)]
