from django.dispatch import Signal

# Sent with `cluster_id` and `outcome` after a worker's sync read the cluster: incidents detect
# OOM kills and take a metrics reading, remediation recomputes the cluster's findings.
cluster_synced = Signal()
