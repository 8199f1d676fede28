from django.dispatch import Signal

# Sent with `change` when a change reaches a final state; maintenance warms applications whose
# replicas a change replaced.
change_finished = Signal()
