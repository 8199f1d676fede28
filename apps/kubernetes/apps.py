from django.apps import AppConfig


class KubernetesConfig(AppConfig):
    name = "apps.kubernetes"
    # The label of the app this one was merged from: it names the tables (kubernetes_link_kubeconnection,
    # kubernetes_link_kubelink), the migration history and the content types, which a new label would
    # orphan without a data migration.
    label = "kubernetes_link"
    verbose_name = "Kubernetes"

    def ready(self) -> None:
        from apps.changes import config_writers
        from apps.clusters.models import Cluster
        from apps.clusters.signals import cluster_moved
        from apps.kubernetes import services
        from apps.kubernetes.rayservice_writer import rayservice_writer, waiting_for

        config_writers.register(Cluster.ConfigOwner.RAYSERVICE, rayservice_writer, waiting_for=waiting_for)
        cluster_moved.connect(services.unlink_moved, sender=Cluster, dispatch_uid="kubernetes-unlink-moved")
