from apps.accounts.filters import IdFilterSet
from apps.changes.models import Change


class ChangeFilter(IdFilterSet):
    """The changes page and the changes API list filter alike."""

    class Meta:
        model = Change
        fields = ["cluster", "state", "kind"]
