from django.dispatch import Signal

# Sent with `cluster_id` and `outcome` after a worker's sync read the cluster: incidents detect
# OOM kills and ask for a metrics reading, remediation recomputes the cluster's findings.
cluster_synced = Signal()

# Sent with `outcomes` (each cluster's SyncOutcome) after a worker synced a batch: what depends on
# the clock alone is done once per batch (incidents resolve quiet ones).
batch_synced = Signal()
