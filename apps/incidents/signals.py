from django.dispatch import Signal

# Sent with `cluster_id` after a metrics reading of the cluster was taken (or failed): the windows
# it moves are what remediation's findings read, so they are recomputed then, not at the sync.
metrics_collected = Signal()
