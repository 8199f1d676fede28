"""Version 2 of the API: the same viewsets as version 1, leaner items in four lists, keyset pages
for lists in time order, and a schema of its own. Version 1 keeps its shapes."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.incidents.api import HEAVY_FIELDS
from controlplane.api.pagination import CappedCountPagination
from tests.unit.fleet.test_query_counts import add_rows

pytestmark = pytest.mark.django_db


@pytest.fixture
def rows(people, team):
    add_rows(team, people["admin"], 3)


def listed(client, url: str) -> dict[int, dict]:
    response = client.get(url)
    assert response.status_code == 200, response.content
    return {item["id"]: item for item in response.json()["results"]}


@pytest.mark.parametrize(
    ("resource", "left_out", "added"),
    [
        ("incidents", set(HEAVY_FIELDS), set()),
        ("changes", {"steps", "json_patch", "warnings", "drift"}, set()),
        ("deployments", {"effective_config", "submitted_config", "llm"}, set()),
        ("rollouts", {"changes"}, {"change_counts"}),
    ],
)
def test_a_v2_list_item_is_the_v1_item_without_what_only_the_detail_shows(api_as, rows, resource, left_out, added):
    client = api_as("admin")
    old, new = listed(client, f"/api/v1/{resource}/"), listed(client, f"/api/v2/{resource}/")
    assert old and set(old) == set(new)
    for pk, item in new.items():
        assert set(item) == (set(old[pk]) - left_out) | added
        assert {k: v for k, v in item.items() if k not in added} == {k: old[pk][k] for k in item if k not in added}


def test_v2_counts_a_rollouts_changes_as_the_v1_counted_form_does(api_as, rows):
    client = api_as("admin")
    counted = listed(client, "/api/v1/rollouts/?changes=counts")
    assert counted == listed(client, "/api/v2/rollouts/")
    assert all(sum(item["change_counts"].values()) >= 1 for item in counted.values())


@pytest.mark.parametrize("resource", ["incidents", "changes", "deployments", "rollouts"])
def test_the_detail_is_the_same_in_both_versions(api_as, rows, resource):
    client = api_as("admin")
    pk = next(iter(listed(client, f"/api/v1/{resource}/")))
    old, new = client.get(f"/api/v1/{resource}/{pk}/"), client.get(f"/api/v2/{resource}/{pk}/")
    assert old.status_code == new.status_code == 200
    assert old.json() == new.json()


def test_v1_keeps_its_default_items_and_page_numbers(api_as, rows):
    body = api_as("admin").get("/api/v1/incidents/").json()
    assert body["count"] == 3 and body["count_capped"] is False
    assert {"evidence", "timeline", "related_work"} <= set(body["results"][0])


def test_a_v2_list_in_time_order_pages_by_keyset_and_numbers_pages_when_asked(api_as, rows, monkeypatch):
    monkeypatch.setattr(CappedCountPagination, "page_size", 2)
    client = api_as("admin")
    total = client.get("/api/v1/changes/").json()["count"]
    assert total > 2
    first = client.get("/api/v2/changes/").json()
    assert set(first) == {"next", "previous", "results"}
    assert first["next"].startswith("http://testserver/api/v2/changes/?cursor=")
    seen, page = [], first
    while page:
        seen += [item["id"] for item in page["results"]]
        page = client.get(page["next"]).json() if page["next"] else None
    assert len(seen) == len(set(seen)) == total
    numbered = client.get("/api/v2/changes/?page=2").json()
    assert "count" not in numbered and [item["id"] for item in numbered["results"]] == seen[2:4]
    counted = client.get("/api/v2/changes/?page=2&count=true").json()
    assert counted["count"] == total and counted["results"] == numbered["results"]
    first_counted = client.get("/api/v2/changes/?count=true").json()
    assert first_counted["count"] == total and first_counted["results"] == first["results"]


def test_an_inventory_keeps_page_numbers_in_v2_and_counts_when_asked(api_as, rows, monkeypatch):
    monkeypatch.setattr(CappedCountPagination, "page_size", 2)
    client = api_as("admin")
    first = client.get("/api/v2/clusters/").json()
    assert set(first) == {"next", "previous", "results"} and first["previous"] is None
    assert first["next"] == "http://testserver/api/v2/clusters/?page=2"
    second = client.get(first["next"]).json()
    assert second["next"] is None and second["previous"] == "http://testserver/api/v2/clusters/"
    names = [c["name"] for c in first["results"] + second["results"]]
    assert names == sorted(names) and len(names) == 3
    assert client.get("/api/v2/clusters/?page=3").status_code == 404
    assert client.get("/api/v2/clusters/?page=0").status_code == 404
    counted = client.get("/api/v2/clusters/?count=true").json()
    assert counted["count"] == 3 and counted["count_capped"] is False and counted["results"] == first["results"]
    assert client.get("/api/v2/clusters/?page=last").json()["results"] == second["results"]


def test_a_v2_keyset_page_refuses_an_order_it_cannot_follow_and_points_to_page_numbers(api_as, rows):
    client = api_as("admin")
    refused = client.get("/api/v2/changes/?ordering=cluster")
    assert refused.status_code == 400
    assert "ask for `page`" in refused.json()["cursor"][0]
    assert client.get("/api/v2/changes/?ordering=cluster&page=1").status_code == 200


def test_the_v2_root_and_links_stay_in_v2(api_as, rows):
    client = api_as("admin")
    root = client.get("/api/v2/").json()
    assert root["changes"] == "http://testserver/api/v2/changes/"
    assert all(url.startswith("http://testserver/api/v2/") for url in root.values())
    assert client.get("/api/v1/").json()["changes"] == "http://testserver/api/v1/changes/"


def test_the_count_of_a_list_reads_no_column_it_annotates(api_as, rows):
    with CaptureQueriesContext(connection) as queries:
        assert api_as("admin").get("/api/v2/changes/?page=1&count=true").status_code == 200
    (count,) = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT COUNT(*)")]
    assert "username" not in count and '"name"' not in count


def test_each_version_has_its_own_schema(client):
    v1 = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    v2 = client.get("/api/v2/schema/", HTTP_ACCEPT="application/json").json()
    assert v1["paths"] and all(path.startswith("/api/v1/") for path in v1["paths"])
    assert all(path.startswith("/api/v2/") for path in v2["paths"])
    assert {p.replace("/api/v1/", "/api/v2/") for p in v1["paths"]} == set(v2["paths"])
    listing = v2["paths"]["/api/v2/incidents/"]["get"]
    assert "view" not in {p["name"] for p in listing["parameters"]}
    assert "count" in {p["name"] for p in listing["parameters"]}
    assert "count" not in {p["name"] for p in v1["paths"]["/api/v1/incidents/"]["get"]["parameters"]}
    page = listing["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    item = v2["components"]["schemas"][page]["properties"]["results"]["items"]["$ref"].rsplit("/", 1)[-1]
    assert "evidence" not in v2["components"]["schemas"][item]["properties"]
    assert client.get("/api/docs/").status_code == 200 and client.get("/api/v1/docs/").status_code == 200
