"""A link reversed once answers what `reverse` answers for every key."""

from __future__ import annotations

import pytest
from django.urls import reverse

from apps.core import links


@pytest.mark.parametrize("name", ["fleet:cluster", "fleet:deployment", "changes:plan", "remediation:mute"])
def test_the_same_link_as_reverse(name):
    link = links.by_key(name)
    for key in (1, 7, 42, 918273645, 10**12):
        assert link(key) == reverse(name, args=[key])
