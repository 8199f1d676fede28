from django.dispatch import Signal

# Sent with `change` when a change reaches a final state: its rollout moves on, maintenance warms
# applications whose replicas a change replaced, a wizard's apply step settles.
change_finished = Signal()
