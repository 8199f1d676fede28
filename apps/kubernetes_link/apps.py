from django.apps import AppConfig


class KubernetesLinkConfig(AppConfig):
    name = "apps.kubernetes_link"
    label = "kubernetes_link"
    verbose_name = "Kubernetes"
