"""Who may use each URL the project serves, and a request body good enough to reach each one's
permission check: the table test_authorization_matrix.py holds every route to."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from apps.accounts.models import Role
from tests.llm_world import llama_config
from tests.world import TeamWorld, kubeconfig

A_SLUG, B_SLUG = "aardvark", "bison"
GHOST_SLUG, GHOST_ID = "no-such-team", 987654


class Need(NamedTuple):
    """The least role in the object's team, and what a member below it gets."""

    role: Role
    below: int = 403


READ, OPERATE, ADMINISTER = Need(Role.VIEWER), Need(Role.OPERATOR), Need(Role.ADMIN)
# A wizard's actions, on its page and in the API alike.
WIZARD_ACTIONS = (
    "apply",
    "skip",
    "confirm",
    "check",
    "scaler",
    "calibrate",
    "replan",
    "objectives",
    "verify",
    "evaluate",
    "abandon",
)
# Shown to team admins only: to anyone else the object does not exist.
ADMIN_EYES_ONLY = Need(Role.ADMIN, below=404)

# (URL name, method) -> who may. A URL with a text argument (an action) is listed once per action
# as "name[action]"; any other action must be a 404.
EXPECTED: dict[tuple[str, str], Need] = {
    # fleet pages
    ("fleet:overview", "GET"): READ,
    ("fleet:cluster", "GET"): READ,
    ("fleet:cluster_status", "GET"): READ,
    ("fleet:deployment", "GET"): READ,
    ("fleet:history", "GET"): READ,
    ("fleet:revision", "GET"): READ,
    ("fleet:llm_inputs", "POST"): OPERATE,
    ("fleet:size_metric", "POST"): OPERATE,
    # cluster registry pages
    ("clusters:create", "GET"): ADMINISTER,
    ("clusters:create", "POST"): ADMINISTER,
    ("clusters:edit", "GET"): ADMINISTER,
    ("clusters:edit", "POST"): ADMINISTER,
    ("clusters:delete", "GET"): ADMINISTER,
    ("clusters:delete", "POST"): ADMINISTER,
    ("clusters:sync", "POST"): OPERATE,
    # change, rollout and preset pages
    ("changes:list", "GET"): READ,
    ("changes:detail", "GET"): READ,
    ("changes:action[apply]", "POST"): OPERATE,
    ("changes:action[cancel]", "POST"): OPERATE,
    ("changes:action[rollback]", "POST"): OPERATE,
    ("changes:plan", "GET"): OPERATE,
    ("changes:plan", "POST"): OPERATE,
    ("changes:deploy_application", "GET"): OPERATE,
    ("changes:deploy_application", "POST"): OPERATE,
    ("changes:delete_application", "GET"): OPERATE,
    ("changes:delete_application", "POST"): OPERATE,
    ("changes:rollouts", "GET"): READ,
    ("changes:rollout_create", "GET"): OPERATE,
    ("changes:rollout_create", "POST"): OPERATE,
    ("changes:rollout", "GET"): READ,
    ("changes:rollout_action[start]", "POST"): OPERATE,
    ("changes:rollout_action[cancel]", "POST"): OPERATE,
    ("changes:restore_revision", "POST"): OPERATE,
    ("changes:presets", "GET"): READ,
    ("changes:preset_create", "GET"): OPERATE,
    ("changes:preset_create", "POST"): OPERATE,
    ("changes:preset_edit", "GET"): OPERATE,
    ("changes:preset_edit", "POST"): OPERATE,
    ("changes:preset_clone", "POST"): OPERATE,
    ("changes:preset_delete", "POST"): OPERATE,
    # maintenance pages
    ("maintenance:schedule", "GET"): OPERATE,
    ("maintenance:schedule", "POST"): OPERATE,
    ("maintenance:recycle", "POST"): OPERATE,
    ("maintenance:warmups", "GET"): READ,
    ("maintenance:warmups", "POST"): OPERATE,
    ("maintenance:warmup_run", "POST"): OPERATE,
    ("maintenance:run", "GET"): READ,
    # incident pages: anyone on the team may add a note
    ("incidents:list", "GET"): READ,
    ("incidents:detail", "GET"): READ,
    ("incidents:action[note]", "POST"): READ,
    ("incidents:action[acknowledge]", "POST"): OPERATE,
    ("incidents:action[resolve]", "POST"): OPERATE,
    # findings and wizards
    ("remediation:findings", "GET"): READ,
    ("remediation:mute", "POST"): OPERATE,
    ("remediation:wizards", "GET"): READ,
    ("remediation:wizard_start", "POST"): OPERATE,
    ("remediation:wizard", "GET"): READ,
    **{(f"remediation:wizard_action[{action}]", "POST"): OPERATE for action in WIZARD_ACTIONS},
    # calibration card
    ("calibration:card", "GET"): READ,
    ("calibration:calibrate", "POST"): OPERATE,
    # the deployment page's scaler buttons
    ("scaler:create", "POST"): OPERATE,
    **{(f"scaler:action[{action}]", "POST"): OPERATE for action in ("activate", "deactivate", "delete")},
    # Kubernetes connections: their admins manage them; the discovery page is for everyone on the team
    ("kubernetes:connections", "GET"): READ,
    ("kubernetes:connection_create", "GET"): ADMINISTER,
    ("kubernetes:connection_create", "POST"): ADMINISTER,
    ("kubernetes:connection", "GET"): READ,
    ("kubernetes:connection_edit", "GET"): ADMINISTER,
    ("kubernetes:connection_edit", "POST"): ADMINISTER,
    ("kubernetes:connection_delete", "POST"): ADMINISTER,
    ("kubernetes:register", "GET"): ADMINISTER,
    ("kubernetes:register", "POST"): ADMINISTER,
    ("kubernetes:link", "POST"): ADMINISTER,
    ("kubernetes:unlink", "POST"): ADMINISTER,
    ("kubernetes:inspect", "POST"): OPERATE,
    # The LLM capacity planner reads and writes no team's objects: any signed-in user plans, and picks only
    # the models of their own teams.
    ("llm:planner", "GET"): READ,
    ("llm:planner", "POST"): READ,
    # API
    ("api-root", "GET"): READ,
    ("cluster-list", "GET"): READ,
    ("cluster-list", "POST"): ADMINISTER,
    ("cluster-detail", "GET"): READ,
    ("cluster-detail", "PATCH"): ADMINISTER,
    ("cluster-detail", "DELETE"): ADMINISTER,
    ("cluster-events", "GET"): READ,
    ("cluster-sync", "POST"): OPERATE,
    ("application-list", "GET"): READ,
    ("application-detail", "GET"): READ,
    ("deployment-list", "GET"): READ,
    ("deployment-detail", "GET"): READ,
    ("deployment-scaling", "GET"): READ,
    ("deployment-llminputs", "POST"): OPERATE,
    ("deployment-sizemetric", "POST"): OPERATE,
    ("deployment-requestsizes", "GET"): READ,
    ("configrevision-list", "GET"): READ,
    ("configrevision-detail", "GET"): READ,
    ("configrevision-diff", "GET"): READ,
    # Members see the events they caused; the team's whole log is for its admins.
    ("auditevent-list", "GET"): READ,
    ("auditevent-detail", "GET"): ADMIN_EYES_ONLY,
    ("preset-list", "GET"): READ,
    ("preset-list", "POST"): OPERATE,
    ("preset-detail", "GET"): READ,
    ("preset-detail", "PATCH"): OPERATE,
    ("preset-detail", "DELETE"): OPERATE,
    ("preset-clone", "POST"): OPERATE,
    ("change-list", "GET"): READ,
    ("change-list", "POST"): OPERATE,
    ("change-restore", "POST"): OPERATE,
    ("change-create-application", "POST"): OPERATE,
    ("change-delete-application", "POST"): OPERATE,
    ("change-detail", "GET"): READ,
    ("change-apply", "POST"): OPERATE,
    ("change-cancel", "POST"): OPERATE,
    ("change-rollback", "POST"): OPERATE,
    ("rollout-list", "GET"): READ,
    ("rollout-list", "POST"): OPERATE,
    ("rollout-detail", "GET"): READ,
    ("rollout-start", "POST"): OPERATE,
    ("rollout-cancel", "POST"): OPERATE,
    ("recycleschedule-list", "GET"): READ,
    ("recycleschedule-list", "POST"): OPERATE,
    ("recycleschedule-detail", "GET"): READ,
    ("recycleschedule-detail", "PATCH"): OPERATE,
    ("recycleschedule-detail", "DELETE"): OPERATE,
    ("warmupprofile-list", "GET"): READ,
    ("warmupprofile-list", "POST"): OPERATE,
    ("warmupprofile-detail", "GET"): READ,
    ("warmupprofile-detail", "PATCH"): OPERATE,
    ("warmupprofile-detail", "DELETE"): OPERATE,
    ("warmupprofile-run", "POST"): OPERATE,
    ("maintenancerun-list", "GET"): READ,
    ("maintenancerun-recycle", "POST"): OPERATE,
    ("maintenancerun-detail", "GET"): READ,
    ("incident-list", "GET"): READ,
    ("incident-detail", "GET"): READ,
    ("incident-acknowledge", "POST"): OPERATE,
    ("incident-resolve", "POST"): OPERATE,
    ("incident-notes", "POST"): READ,
    # Webhooks carry the team's endpoints: admins only, invisible to everyone else.
    ("webhook-list", "GET"): READ,
    ("webhook-list", "POST"): ADMINISTER,
    ("webhook-detail", "GET"): ADMIN_EYES_ONLY,
    ("webhook-detail", "PATCH"): ADMIN_EYES_ONLY,
    ("webhook-detail", "DELETE"): ADMIN_EYES_ONLY,
    ("finding-list", "GET"): READ,
    ("finding-detail", "GET"): READ,
    ("finding-mute", "POST"): OPERATE,
    ("finding-unmute", "POST"): OPERATE,
    ("memorycalibration-list", "GET"): READ,
    ("memorycalibration-list", "POST"): OPERATE,
    ("memorycalibration-detail", "GET"): READ,
    ("wizard-list", "GET"): READ,
    ("wizard-list", "POST"): OPERATE,
    ("wizard-detail", "GET"): READ,
    **{(f"wizard-{action}", "POST"): OPERATE for action in WIZARD_ACTIONS},
    ("kubeconnection-list", "GET"): READ,
    ("kubeconnection-list", "POST"): ADMINISTER,
    ("kubeconnection-detail", "GET"): READ,
    ("kubeconnection-detail", "PATCH"): ADMINISTER,
    ("kubeconnection-detail", "DELETE"): ADMINISTER,
    ("kubeconnection-discovery", "GET"): READ,
    ("kubeconnection-register", "POST"): ADMINISTER,
    ("kubeconnection-link", "POST"): ADMINISTER,
    ("kubelink-list", "GET"): READ,
    ("kubelink-detail", "GET"): READ,
    ("kubelink-detail", "DELETE"): ADMINISTER,
    ("kubelink-inspect", "POST"): OPERATE,
    ("llm-plan", "POST"): READ,
    ("scaler-list", "GET"): READ,
    ("scaler-list", "POST"): OPERATE,
    ("scaler-detail", "GET"): READ,
    ("scaler-detail", "DELETE"): OPERATE,
    ("scaler-activate", "POST"): OPERATE,
    ("scaler-deactivate", "POST"): OPERATE,
    ("scaler-comparison", "GET"): READ,
    ("scalerdecision-list", "GET"): READ,
    ("scalerdecision-detail", "GET"): READ,
}

# Reachable without logging in, on purpose.
PUBLIC = {
    "login": "the login form",
    "logout": "ends a session; harmless without one",
    "healthz": "load balancers' liveness probe",
    "schema": "the OpenAPI schema: documentation, no data",
    "api-docs": "Swagger UI over the schema",
    "schema-v2": "the OpenAPI schema of version 2",
    "api-docs-v1": "Swagger UI over version 1's schema",
    "admin:login": "the admin site's login form",
}
# Outside the team roles: a machine's scrape with a token of its own (tests/unit/controlplane/test_metrics.py).
OWN_TOKEN = {"metrics": "Prometheus's scrape: its own bearer token (FLEETDECK_METRICS_TOKEN), never a session"}
# The Django admin is for staff (superusers here); team roles never open it. Its login page is public.
STAFF_ONLY_NAMESPACE = "admin"

# Which model a page's `pk` points at, by the path segment before it.
SEGMENT_MODELS = {
    "clusters": "clusters.cluster",
    "deployments": "fleet.deployment",
    "scalers": "scaler.scaler",
    "applications": "fleet.application",
    "revisions": "fleet.configrevision",
    "changes": "changes.change",
    "rollouts": "changes.rollout",
    "presets": "changes.preset",
    "warmups": "maintenance.warmupprofile",
    "runs": "maintenance.maintenancerun",
    "incidents": "incidents.incident",
    "findings": "remediation.finding",
    "wizards": "remediation.wizard",
    "kubernetes": "kubernetes_link.kubeconnection",
}


class Refs:
    """What a request body may name: team A's objects, or (for the ghost) ones that do not exist."""

    def __init__(self, world: TeamWorld | None):
        self.world = world

    @property
    def team(self) -> int:
        return self.world.team if self.world else GHOST_ID

    @property
    def slug(self) -> str:
        return self.world.slug if self.world else GHOST_SLUG

    def id(self, label: str) -> int:
        return self.world.id(label) if self.world else GHOST_ID


OPTIONS = {"max_ongoing_requests": 3}
KUBECONFIG = kubeconfig("new")
LLAMA_CONFIG = llama_config()
# Bodies good enough to reach the permission check (and, for those allowed, the service).
BODIES: dict[tuple[str, str], Callable[[Refs], dict]] = {
    ("clusters:create", "POST"): lambda r: {
        "name": "new-one",
        "team": r.team,
        "dashboard_url": "http://new.ray.test:8265",
        "serve_config_owner": "dashboard",
        "labels": "env=prod",
    },
    ("clusters:edit", "POST"): lambda r: {
        "dashboard_url": "http://aardvark.ray.test:8265",
        "team": r.team,
        "serve_config_owner": "dashboard",
        "labels": "env=prod",
    },
    ("changes:plan", "POST"): lambda r: {
        "targets": "demo/Model",
        "options_text": "max_ongoing_requests: 3",
        "reason": "test",
    },
    ("changes:deploy_application", "POST"): lambda r: {
        "name": "new-app",
        "route_prefix": "/new-app",
        "import_path": "demo_app:echo_only",
        "reason": "test",
    },
    ("changes:delete_application", "POST"): lambda r: {"application": "modelonly", "reason": "test"},
    ("changes:rollout_create", "POST"): lambda r: {
        "team": r.slug,
        "options_text": "max_ongoing_requests: 3",
        "reason": "test",
    },
    ("changes:restore_revision", "POST"): lambda r: {"reason": "test"},
    ("changes:preset_create", "POST"): lambda r: {
        "name": "mine",
        "team": r.team,
        "options_text": "max_ongoing_requests: 3",
    },
    ("changes:preset_edit", "POST"): lambda r: {
        "name": "mine",
        "team": r.team,
        "options_text": "max_ongoing_requests: 3",
    },
    ("maintenance:schedule", "POST"): lambda r: {"enabled": "on", "every_hours": 4},
    ("fleet:llm_inputs", "POST"): lambda r: {"gpu_memory_gib": "80"},
    ("deployment-llminputs", "POST"): lambda r: {"gpu_memory_gib": 80},
    ("fleet:size_metric", "POST"): lambda r: {"metric": "ray_request_bytes", "unit": "bytes"},
    ("deployment-sizemetric", "POST"): lambda r: {"metric": "ray_request_bytes", "unit": "bytes"},
    ("maintenance:warmups", "POST"): lambda r: {
        "name": "w2",
        "method": "GET",
        "path": "/demo",
        "requests": 2,
        "concurrency": 1,
        "timeout_s": 5,
    },
    ("incidents:action[note]", "POST"): lambda r: {"text": "looking"},
    # A model named by id: another team's is refused as one that does not exist.
    ("llm:planner", "POST"): lambda r: {
        "model": r.id("fleet.deployment"),
        "accelerator": "H100",
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "kv_cache_dtype": "auto",
    },
    ("llm-plan", "POST"): lambda r: {"config": LLAMA_CONFIG, "accelerator": "H100"},
    ("remediation:mute", "POST"): lambda r: {"reason": "known"},
    ("remediation:wizard_start", "POST"): lambda r: {"incident": r.id("incidents.incident")},
    ("calibration:calibrate", "POST"): lambda r: {"axis": "concurrency", "levels": "1"},
    ("scaler:create", "POST"): lambda r: {"min_replicas": "1", "max_replicas": "2"},
    ("kubernetes:connection_create", "POST"): lambda r: {
        "team": r.team,
        "name": "k2",
        "namespaces": "serve",
        "kubeconfig": KUBECONFIG,
    },
    ("kubernetes:connection_edit", "POST"): lambda r: {"namespaces": "serve, batch"},
    ("kubernetes:register", "POST"): lambda r: {
        "kind": "RayCluster",
        "namespace": "serve",
        "name": "rc",
        "cluster_name": "from-k8s",
        "dashboard_url": "http://rc.ray.test:8265",
    },
    ("kubernetes:link", "POST"): lambda r: {
        "cluster": r.id("clusters.cluster"),
        "kind": "RayCluster",
        "namespace": "serve",
        "name": "rc",
    },
    ("cluster-list", "POST"): lambda r: {
        "name": "new-one",
        "team": r.slug,
        "dashboard_url": "http://new.ray.test:8265",
    },
    ("cluster-detail", "PATCH"): lambda r: {"labels": {"env": "prod"}},
    ("preset-list", "POST"): lambda r: {"name": "mine", "team": r.slug, "options": OPTIONS},
    ("preset-detail", "PATCH"): lambda r: {"description": "tuned"},
    ("preset-clone", "POST"): lambda r: {"team": r.slug},
    ("change-list", "POST"): lambda r: {
        "cluster": r.id("clusters.cluster"),
        "targets": [{"application": "demo", "deployment": "Model"}],
        "options": OPTIONS,
        "reason": "test",
    },
    ("change-restore", "POST"): lambda r: {"revision": r.id("fleet.configrevision"), "reason": "test"},
    ("change-create-application", "POST"): lambda r: {
        "cluster": r.id("clusters.cluster"),
        "application": {"name": "new-app", "route_prefix": "/new-app", "import_path": "demo_app:echo_only"},
        "reason": "test",
    },
    ("change-delete-application", "POST"): lambda r: {
        "cluster": r.id("clusters.cluster"),
        "application": "modelonly",
        "reason": "test",
    },
    ("rollout-list", "POST"): lambda r: {"selection": {"team": r.slug}, "options": OPTIONS, "reason": "test"},
    ("recycleschedule-list", "POST"): lambda r: {"deployment": r.id("fleet.deployment"), "every_hours": 4},
    ("recycleschedule-detail", "PATCH"): lambda r: {"every_hours": 4},
    ("warmupprofile-list", "POST"): lambda r: {"application": r.id("fleet.application"), "name": "w2", "path": "/demo"},
    ("warmupprofile-detail", "PATCH"): lambda r: {"requests": 3},
    ("maintenancerun-recycle", "POST"): lambda r: {"deployment": r.id("fleet.deployment")},
    ("incident-notes", "POST"): lambda r: {"text": "looking"},
    ("webhook-list", "POST"): lambda r: {"team": r.slug, "url": "https://hooks.example.test/new"},
    ("webhook-detail", "PATCH"): lambda r: {"enabled": False},
    ("finding-mute", "POST"): lambda r: {"reason": "known"},
    ("memorycalibration-list", "POST"): lambda r: {"deployment": r.id("fleet.deployment"), "levels": [1]},
    ("scaler-list", "POST"): lambda r: {"deployment": r.id("fleet.deployment"), "max_replicas": 3},
    ("wizard-list", "POST"): lambda r: {"incident": r.id("incidents.incident")},
    ("kubeconnection-list", "POST"): lambda r: {
        "team": r.slug,
        "name": "k2",
        "namespaces": ["serve"],
        "kubeconfig": KUBECONFIG,
    },
    ("kubeconnection-detail", "PATCH"): lambda r: {"namespaces": ["serve", "batch"]},
    ("kubeconnection-register", "POST"): lambda r: {
        "kind": "RayCluster",
        "namespace": "serve",
        "name": "rc",
        "cluster_name": "from-k8s",
        "dashboard_url": "http://rc.ray.test:8265",
    },
    ("kubeconnection-link", "POST"): lambda r: {
        "cluster": r.id("clusters.cluster"),
        "kind": "RayCluster",
        "namespace": "serve",
        "name": "rc",
    },
}
