from django.contrib import admin

from apps.kubernetes.models import KubeConnection, KubeLink


@admin.register(KubeConnection)
class KubeConnectionAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "in_cluster", "read_only", "last_checked_at"]
    list_filter = ["team", "in_cluster", "read_only"]
    search_fields = ["name"]
    # The kubeconfig is a credential: the admin never shows it, and writes go through the services.
    exclude = ["kubeconfig_ciphertext"]
    readonly_fields = [f.name for f in KubeConnection._meta.fields if f.name != "kubeconfig_ciphertext"]

    def has_add_permission(self, request):
        return False


@admin.register(KubeLink)
class KubeLinkAdmin(admin.ModelAdmin):
    list_display = ["cluster", "kind", "namespace", "name", "connection", "inspected_at", "partial"]
    list_filter = ["kind", "partial"]
    search_fields = ["cluster__name", "namespace", "name"]
    readonly_fields = [f.name for f in KubeLink._meta.fields]

    def has_add_permission(self, request):
        return False
