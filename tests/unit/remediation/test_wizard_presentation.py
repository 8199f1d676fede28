"""The wizard's pages as an operator reads them: step numbers that match the step list, diffs one
line per line, settings and values in words rather than Python reprs."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from apps.remediation import verification, wizards
from apps.remediation.models import Wizard
from tests.unit.fleet.test_fleet_tags import REPR
from tests.unit.remediation.wizard_helpers import actor, by_remedy

pytestmark = pytest.mark.django_db


def page(client, wizard: Wizard, position: int) -> str:
    return client.get(reverse("remediation:wizard", args=[wizard.pk]), {"step": position}).content.decode()


def step_list_numbers(html: str) -> dict[str, str]:
    """Remedy → the number the step list shows beside it."""
    return dict((remedy, number) for number, remedy in re.findall(r"<span>(\d+)\. (R\d+) · ", html))


def test_what_to_try_next_names_steps_by_the_numbers_the_step_list_shows(client, people, incident):
    wizard, _ = wizards.start(actor(people), incident=incident)
    wizard.state, wizard.next_steps = Wizard.State.NOT_RESOLVED, verification.next_steps(wizard)
    wizard.save()
    client.force_login(people["operator"])
    outcome = wizard.steps.get(kind="outcome")
    html = page(client, wizard, outcome.position)
    numbers = step_list_numbers(html)
    assert numbers["R1"] == str(by_remedy(wizard)["R1"].position + 1)
    said = re.findall(r'<span class="chip">(R\d+)</span> [^<]* — Step (\d+) is ', html)
    assert said and all(numbers[remedy] == number for remedy, number in said)


def test_a_config_step_shows_its_diff_single_spaced_and_its_values_in_words(client, people, incident, calibrated):
    wizard, _ = wizards.start(actor(people), incident=incident)
    client.force_login(people["operator"])
    html = page(client, wizard, by_remedy(wizard)["R2"].position)
    diff = re.search(r'<pre class="diff">(.*?)</pre>', html, re.S).group(1)
    assert diff.count('class="diff-add"') >= 1 and "\n" not in diff
    assert not REPR.findall(html)


def test_the_diagnosis_shows_the_settings_now_in_words(client, people, incident):
    wizard, _ = wizards.start(actor(people), incident=incident)
    client.force_login(people["operator"])
    html = page(client, wizard, wizard.steps.get(kind="diagnosis").position)
    chips = re.search(r"<th>Settings now</th><td>(.*?)</td>", html, re.S).group(1)
    assert "max_ongoing_requests: " in chips
    assert not REPR.findall(html)


def test_the_wizard_page_and_the_api_demand_the_same_permission_for_each_operation():
    from apps.remediation import api, views, wizards

    assert set(views.ACTIONS) == set(wizards.OPERATIONS)
    api_actions = {name for name in wizards.OPERATIONS if callable(getattr(api.WizardViewSet, name, None))}
    assert api_actions == set(wizards.OPERATIONS)
