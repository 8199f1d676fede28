"""Every URL the project serves, asked by every kind of visitor: anonymous, the viewer, operator
and admin of the team that owns the object, and an admin of another team.

The URLs are found by walking the resolver, so a page or endpoint added later is covered without
touching this file, and the test fails until EXPECTED (authorization_table.py) says who may use it.
An outsider must learn nothing: asking for another team's object answers exactly what asking for
one that does not exist answers, and lists never show another team's rows."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from django.conf import settings
from django.db import transaction
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from rest_framework.views import APIView

from apps.accounts.models import ROLE_RANK, AuditEvent, Role
from controlplane.api import versioning
from tests.conftest import ReplayRay, route_adapters_to
from tests.unit.accounts.authorization_table import (
    A_SLUG,
    B_SLUG,
    BODIES,
    EXPECTED,
    GHOST_ID,
    GHOST_SLUG,
    OWN_TOKEN,
    PUBLIC,
    SEGMENT_MODELS,
    STAFF_ONLY_NAMESPACE,
    Refs,
)
from tests.world import (
    TeamWorld,
    api_model,
    build_team,
    builtin_preset_id,
    isolate_network,
    replay_oom_cluster,
)

IGNORED_METHODS = {"HEAD", "OPTIONS", "TRACE"}


# --- enumerating the URLs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    name: str  # as reverse() knows it; "" when the pattern has none
    namespace: str
    route: str  # the full pattern text, all levels joined
    callback: Callable
    kwargs: tuple[str, ...]

    @property
    def api(self) -> bool:
        return hasattr(self.callback, "cls") and issubclass(self.callback.cls, APIView)

    @property
    def table_name(self) -> str:
        """The name EXPECTED knows it by: /api/v2/ serves the same viewsets as /api/v1/ under the
        `v2` namespace, so each v2 route is held to its v1 twin's row of the table."""
        return self.name.removeprefix(f"{versioning.NAMESPACE}:")


def _walk(resolver: URLResolver, prefix: str = "", namespace: str = "", kwargs: tuple = ()) -> Iterator[Route]:
    for entry in resolver.url_patterns:
        groups = tuple(entry.pattern.regex.groupindex)
        if isinstance(entry, URLResolver):
            inner = (
                f"{namespace}:{entry.namespace}" if namespace and entry.namespace else (entry.namespace or namespace)
            )
            yield from _walk(entry, prefix + str(entry.pattern), inner, kwargs + groups)
        elif isinstance(entry, URLPattern):
            name = f"{namespace}:{entry.name}" if namespace and entry.name else (entry.name or "")
            yield Route(name, namespace, prefix + str(entry.pattern), entry.callback, kwargs + groups)


def all_routes() -> list[Route]:
    # DRF's format-suffix twins (`clusters.json`) run the same view as the route they copy.
    return [route for route in _walk(get_resolver()) if "format" not in route.kwargs]


def is_function_view(route: Route) -> bool:
    return not any(hasattr(route.callback, attr) for attr in ("actions", "cls", "view_class"))


def methods_of(route: Route) -> list[str]:
    """What a route answers. Function views do not say, so GET and POST are both asked."""
    callback = route.callback
    actions = getattr(callback, "actions", None)
    view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if actions is not None:
        allowed = set(view_class.http_method_names)
        methods = [method for method in actions if method in allowed]
    elif view_class is not None:
        methods = [method for method in view_class.http_method_names if hasattr(view_class, method)]
    else:
        methods = ["get", "post"]
    return [method.upper() for method in methods if method.upper() not in IGNORED_METHODS]


_GROUP = re.compile(r"<(?:\w+:)?(?P<name>\w+)>|\(\?P<(?P<rname>\w+)>(?P<body>[^)]*)\)")


def fill(route: str, values: dict[str, object]) -> str:
    """The URL of a pattern with its arguments filled in; an alternation takes its first name."""

    def value(match: re.Match) -> str:
        name = match["name"] or match["rname"]
        if name in values:
            return str(values[name])
        body = match["body"] or ""
        return body.split("|")[0] if re.fullmatch(r"[\w|]+", body) else "1"

    return "/" + _GROUP.sub(value, route).replace("^", "").replace("$", "").replace("\\", "")


def model_of(route: Route, kwarg: str) -> str:
    """The model label a URL argument names."""
    if route.api:
        return api_model(route.table_name)
    if kwarg.endswith("_pk"):
        segment = kwarg.removesuffix("_pk") + "s"
    else:
        segment = re.split(r"/<[^>]*:?" + kwarg + ">", route.route)[0].rstrip("/").rsplit("/", 1)[-1]
    if segment not in SEGMENT_MODELS:
        raise LookupError(f"{route.name}: say in SEGMENT_MODELS which model {segment!r}/<{kwarg}> names")
    return SEGMENT_MODELS[segment]


@dataclass(frozen=True)
class Case:
    key: str  # EXPECTED's name: the URL name, with [action] for a text argument
    method: str
    route: Route
    action: str = ""

    def __str__(self) -> str:
        version = self.route.name.removesuffix(self.route.table_name)
        return f"{self.method} {version}{self.key}"

    @property
    def object_kwargs(self) -> tuple[str, ...]:
        return tuple(k for k in self.route.kwargs if k != "action")

    def url(self, model_id: Callable[[str], int]) -> str:
        values: dict[str, object] = {kwarg: model_id(model_of(self.route, kwarg)) for kwarg in self.object_kwargs}
        if self.action:
            values["action"] = self.action
        return fill(self.route.route, values)


def product_routes() -> list[Route]:
    return [
        r
        for r in all_routes()
        if r.name not in PUBLIC and r.name not in OWN_TOKEN and r.namespace != STAFF_ONLY_NAMESPACE
    ]


def cases() -> list[Case]:
    found = []
    for route in product_routes():
        methods = methods_of(route)
        if "action" in route.kwargs:
            for key, method in sorted(EXPECTED):
                if key.startswith(route.table_name + "[") and method in methods:
                    found.append(Case(key, method, route, key[len(route.table_name) + 1 : -1]))
        else:
            found.extend(Case(route.table_name, method, route) for method in methods)
    return found


# --- the world -----------------------------------------------------------------------------------


@dataclass
class World:
    a: TeamWorld
    b: TeamWorld
    builtin_preset: int


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker):
    """Two teams with one object of every kind, built once: each test runs in a savepoint of
    this transaction, and each request in a savepoint of its own."""
    with django_db_blocker.unblock(), pytest.MonkeyPatch.context() as patch, transaction.atomic():
        replay = ReplayRay()
        replay_oom_cluster(replay)
        route_adapters_to(patch, replay)
        isolate_network(patch)
        yield World(build_team(A_SLUG), build_team(B_SLUG), builtin_preset_id())
        transaction.set_rollback(True)


@pytest.fixture(autouse=True)
def offline(use_replay, monkeypatch):
    replay_oom_cluster(use_replay)
    isolate_network(monkeypatch)


# --- asking --------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    location: str
    text: str
    data: object
    audit_rows: int  # written by the request itself

    def __str__(self) -> str:
        page = re.search(r"<h1>(.*?)</h1>\s*(?:<p>(.*?)</p>)?", self.text, re.S)
        detail = self.location or (" ".join(filter(None, page.groups())) if page else self.text[:160])
        return f"{self.status} {detail}"


def ask(case: Case, *, user=None, token: str = "", refs: Refs, model_id: Callable[[str], int]) -> Answer:
    client = Client(raise_request_exception=False)
    headers = {}
    if user is not None and not case.route.api:
        client.force_login(user)
    if token and case.route.api:
        headers["HTTP_AUTHORIZATION"] = f"Token {token}"
    body_of = BODIES.get((case.key, case.method))
    body = body_of(refs) if body_of else {}
    url = case.url(model_id)
    assert resolve(url).func is case.route.callback, f"{url} does not reach {case.route.name}"
    with transaction.atomic():
        before = AuditEvent.objects.count()
        if case.route.api:
            response = client.generic(
                case.method, url, data=json.dumps(body), content_type="application/json", **headers
            )
        elif case.method == "GET":
            response = client.get(url, **headers)
        else:
            response = client.post(url, data=body, **headers)
        written = AuditEvent.objects.count() - before
        transaction.set_rollback(True)
    text = response.content.decode(errors="replace") if not getattr(response, "streaming", False) else ""
    data = None
    if response.get("Content-Type", "").startswith("application/json"):
        data = response.json()
    return Answer(response.status_code, response.get("Location", ""), text, data, written)


def normalized(answer: Answer) -> tuple[int, str, str]:
    """An answer without what differs between two asks of the same thing: ids, the team named,
    CSRF tokens and CSP nonces."""

    def clean(text: str) -> str:
        text = re.sub(r"[A-Za-z0-9+/_-]{20,}={0,2}", "TOKEN", text)
        text = text.replace(A_SLUG, "TEAM").replace(GHOST_SLUG, "TEAM")
        return re.sub(r"\d+", "N", text)

    return answer.status, clean(answer.location), clean(answer.text)


def list_ids(answer: Answer) -> set[int] | None:
    if isinstance(answer.data, dict) and isinstance(answer.data.get("results"), list):
        return {item["id"] for item in answer.data["results"] if isinstance(item, dict) and "id" in item}
    return None


# --- the tests -----------------------------------------------------------------------------------


def test_every_url_is_public_staff_only_or_in_the_table():
    missing = []
    for route in product_routes():
        if not route.name:
            missing.append(f"{route.route}: unnamed, so no rule can name it")
            continue
        methods, name = methods_of(route), route.table_name
        if "action" in route.kwargs:
            if not any(key.startswith(name + "[") for key, _ in EXPECTED):
                missing.append(f"{name}[<action>]")
        elif is_function_view(route):
            if not any((name, method) in EXPECTED for method in methods):
                missing.append(name)
        else:
            missing.extend(f"{method} {name}" for method in methods if (name, method) not in EXPECTED)
    assert not missing, "Decide who may use these and add them to EXPECTED in authorization_table.py: " + ", ".join(
        missing
    )
    known = {(case.key, case.method) for case in cases()}
    stale = sorted(set(EXPECTED) - known)
    assert not stale, f"EXPECTED names URLs that do not exist (any more): {stale}"


def test_every_object_argument_names_an_object_the_world_has():
    for case in cases():
        for kwarg in case.object_kwargs:
            label = model_of(case.route, kwarg)
            assert label in TeamWorld.KINDS, f"{case}: add a {label} to tests/world.py so its URLs are tested"


def _role_users(world: World) -> dict[str, tuple[object, str]]:
    return {
        role.value: (world.a.users[role.value], world.a.tokens[role.value])
        for role in (Role.VIEWER, Role.OPERATOR, Role.ADMIN)
    }


@pytest.mark.django_db
@pytest.mark.parametrize("case", cases(), ids=str)
def test_each_role_gets_what_the_table_says(world, case):
    problems = check(world, case)
    assert not problems, f"{case}:\n  " + "\n  ".join(problems)


def check(world: World, case: Case) -> list[str]:
    need = EXPECTED.get((case.key, case.method))
    a_refs, ghost_refs = Refs(world.a), Refs(None)
    problems: list[str] = []

    anonymous = ask(case, refs=a_refs, model_id=world.a.id)
    if case.route.api:
        if anonymous.status != 401:
            problems.append(f"anonymous: {anonymous}, expected 401")
    elif not (anonymous.status == 302 and anonymous.location.startswith(_login_url())):
        problems.append(f"anonymous: {anonymous}, expected a redirect to the login page")

    for role, (user, token) in _role_users(world).items():
        answer = ask(case, user=user, token=token, refs=a_refs, model_id=world.a.id)
        if B_SLUG in answer.text.lower():
            problems.append(f"{role}: shows team {B_SLUG}'s objects")
        if answer.status >= 500:
            problems.append(f"{role}: {answer}")
        elif need is None:
            # A method the table does not list: a read-only page may render, but nothing is written.
            if answer.audit_rows:
                problems.append(f"{role}: {case.method} is not in EXPECTED, yet it wrote to the audit log")
        elif ROLE_RANK[Role(role)] >= ROLE_RANK[need.role]:
            if answer.status in (401, 403, 404, 405):
                problems.append(f"{role}: {answer}, expected to be allowed")
            elif role == Role.ADMIN and case.method == "GET":
                problems.extend(_lists_show_own(answer, case, world.a, world.b, role))
        else:
            if answer.status != need.below:
                problems.append(f"{role}: {answer}, expected {need.below}")
            if answer.audit_rows:
                problems.append(f"{role}: refused, yet it wrote to the audit log")

    outsider_user, outsider_token = world.b.users["admin"], world.b.tokens["admin"]
    outsider = ask(case, user=outsider_user, token=outsider_token, refs=a_refs, model_id=world.a.id)
    ghost = ask(case, user=outsider_user, token=outsider_token, refs=ghost_refs, model_id=lambda label: GHOST_ID)
    body = BODIES.get((case.key, case.method))
    if outsider.status >= 500:
        problems.append(f"outsider: {outsider}")
    if case.object_kwargs and need is not None and outsider.status != 404:
        problems.append(f"outsider: {outsider}, expected 404")
    if (case.object_kwargs or body) and normalized(outsider) != normalized(ghost):
        problems.append(f"outsider: {outsider}, but for an object that does not exist: {ghost}")
    if (case.object_kwargs or body) and outsider.audit_rows:
        problems.append("outsider: wrote to the audit log")
    if not body and A_SLUG in outsider.text.lower():
        problems.append(f"outsider: shows team {A_SLUG}'s objects")
    if not case.object_kwargs and case.method == "GET":
        problems.extend(_lists_show_own(outsider, case, world.b, world.a, "outsider"))
    return problems


def _lists_show_own(answer: Answer, case: Case, own: TeamWorld, other: TeamWorld, who: str) -> list[str]:
    """An API list shows the asker's team's row of its kind, and never the other team's."""
    ids = list_ids(answer)
    if ids is None or not case.route.name.endswith("-list"):
        return []
    label = model_of(case.route, "pk")
    problems = []
    if other.ids[label] in ids:
        problems.append(f"{who}: the list shows team {other.slug}'s {label} #{other.ids[label]}")
    if own.ids[label] not in ids:
        problems.append(f"{who}: the list lacks team {own.slug}'s {label} #{own.ids[label]}")
    return problems


def _login_url() -> str:
    from django.shortcuts import resolve_url

    return resolve_url(settings.LOGIN_URL)


def _action_routes() -> list[Route]:
    return [route for route in product_routes() if "action" in route.kwargs]


@pytest.mark.django_db
@pytest.mark.parametrize("route", _action_routes(), ids=lambda route: route.name)
def test_an_unknown_action_is_not_found_for_everyone(world, route):
    case = Case(f"{route.name}[no-such-action]", "POST", route, "no-such-action")
    answers = {
        role: ask(case, user=user, token=token, refs=Refs(world.a), model_id=world.a.id)
        for role, (user, token) in _role_users(world).items()
    }
    wrong = {role: str(answer) for role, answer in answers.items() if answer.status != 404 or answer.audit_rows}
    assert not wrong, wrong


PRESET_ROUTES = ("changes:preset_edit", "changes:preset_delete", "preset-detail")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "case", [c for c in cases() if c.key in PRESET_ROUTES and (c.key, c.method) in EXPECTED], ids=str
)
def test_built_in_presets_are_read_by_everyone_and_changed_by_no_one(world, case):
    users = {**_role_users(world), "outsider": (world.b.users["admin"], world.b.tokens["admin"])}
    wrong = {}
    for who, (user, token) in users.items():
        answer = ask(case, user=user, token=token, refs=Refs(world.a), model_id=lambda label: world.builtin_preset)
        readable = case.method == "GET" and case.route.api
        if (answer.status != 200) if readable else (answer.status not in (400, 404) or answer.audit_rows):
            wrong[who] = str(answer)
    assert not wrong, wrong


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["changes:preset_clone", "preset-clone"])
def test_anyone_who_operates_somewhere_clones_a_built_in_preset(world, key):
    case = next(c for c in cases() if c.key == key and c.method == "POST")
    users = {**_role_users(world), "outsider": (world.b.users["admin"], world.b.tokens["admin"])}
    wrong = {}
    for who, (user, token) in users.items():
        refs = Refs(world.b if who == "outsider" else world.a)
        answer = ask(case, user=user, token=token, refs=refs, model_id=lambda label: world.builtin_preset)
        if (answer.status != 403) if who == Role.VIEWER else (answer.status not in (201, 302) or not answer.audit_rows):
            wrong[who] = str(answer)
    assert not wrong, wrong


@pytest.mark.django_db
def test_a_preset_cannot_be_cloned_into_another_teams_hands(world):
    case = next(c for c in cases() if c.key == "preset-clone")
    outsider, token = world.b.users["admin"], world.b.tokens["admin"]
    into_a = ask(case, user=outsider, token=token, refs=Refs(world.a), model_id=lambda label: world.builtin_preset)
    into_nothing = ask(case, user=outsider, token=token, refs=Refs(None), model_id=lambda label: world.builtin_preset)
    assert into_a.status == 400 and normalized(into_a) == normalized(into_nothing) and not into_a.audit_rows


def _staff_routes() -> list[Route]:
    return [r for r in all_routes() if r.namespace == STAFF_ONLY_NAMESPACE and r.name not in PUBLIC]


@pytest.mark.django_db
@pytest.mark.parametrize("route", _staff_routes(), ids=lambda route: route.name or route.route)
def test_the_admin_site_turns_away_every_team_role(world, route):
    url = fill(route.route, {"object_id": world.a.team, "content_type_id": 1})
    for who, user in {**{r: u for r, (u, _) in _role_users(world).items()}, "anonymous": None}.items():
        for method in ("GET", "POST"):
            client = Client(raise_request_exception=False)
            if user is not None:
                client.force_login(user)
            with transaction.atomic():
                response = client.generic(method, url)
                transaction.set_rollback(True)
            redirected = response.status_code == 302 and response["Location"].startswith("/admin/")
            assert redirected, f"{who} {method} {url}: {response.status_code}"


@pytest.mark.django_db
def test_a_url_with_its_own_token_refuses_a_session_and_anonymous(people):
    for name in OWN_TOKEN:
        route = next(r for r in all_routes() if r.name == name)
        with override_settings(FLEETDECK_METRICS_TOKEN="t0ken"):
            anonymous = Client().get(fill(route.route, {}))
            signed_in = Client()
            signed_in.force_login(people["admin"])
            assert anonymous.status_code == signed_in.get(fill(route.route, {})).status_code == 401


@pytest.mark.django_db  # the login and logout views record attempts (django-axes)
def test_public_urls_answer_without_logging_in():
    client = Client()
    for name, why in PUBLIC.items():
        route = next(r for r in all_routes() if r.name == name)
        method = "POST" if "logout" in name else "GET"
        response = client.generic(method, fill(route.route, {}))
        assert response.status_code in (200, 302), f"{name} ({why}): {response.status_code}"


# A list filter that names an object: which model each name means.
FILTER_MODELS = {
    "cluster": "clusters.cluster",
    "application": "fleet.application",
    "deployment": "fleet.deployment",
    "incident": "incidents.incident",
    "finding": "remediation.finding",
    "connection": "kubernetes_link.kubeconnection",
}


def _object_filters() -> list[tuple[str, str]]:
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    return [
        (path, parameter["name"])
        for path, operations in sorted(paths.items())
        if "{" not in path and "get" in operations
        for parameter in operations["get"].get("parameters", [])
        if parameter["in"] == "query" and parameter["name"] in FILTER_MODELS
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("path, name", _object_filters())
def test_filtering_a_list_by_another_teams_object_tells_nothing(world, path, name):
    client = Client()
    headers = {"HTTP_AUTHORIZATION": f"Token {world.b.tokens['admin']}"}
    theirs = client.get(path, {name: world.a.id(FILTER_MODELS[name])}, **headers)
    nothing = client.get(path, {name: GHOST_ID}, **headers)
    assert theirs.status_code == nothing.status_code == 200 and theirs.json() == nothing.json()


@pytest.mark.django_db
def test_a_form_naming_something_that_cannot_be_an_id_is_not_found(world):
    client = Client()
    client.force_login(world.a.users["operator"])
    assert client.post("/wizards/start/", {"incident": "abc"}).status_code == 404
