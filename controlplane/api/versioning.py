"""API versions.

/api/v1/ and /api/v2/ serve the same viewsets, with the same permissions, filters and actions.
They differ only in the items of four lists, which v2 keeps to what a client polling the list
reads, leaving the rest to the detail (issue 19: those items cost several times the list itself):

- incidents: no `evidence`, `oom_kills`, `pod_kills`, `timeline`, `related_work` (v1's `?view=summary`);
- rollouts: the changes as counts per state, `change_counts` (v1's `?changes=counts`);
- changes: no `steps`, `json_patch`, `warnings`, `drift`;
- deployments: no `effective_config`, `submitted_config`, `llm`.

In paging, v2 pages the lists in time order by keyset unless `page` is asked for, and counts
numbered pages only with `count=true` (`controlplane/api/pagination.py`). v1 keeps its shapes and
paging for the clients written against it. v2 routes live in the URL namespace `v2`;
v1 routes keep their unnamespaced names, so everything that reverses them is unchanged.
"""

from __future__ import annotations

from rest_framework.versioning import NamespaceVersioning

V1 = "v1"
V2 = "v2"
NAMESPACE = V2


class APIVersioning(NamespaceVersioning):
    default_version = V1
    allowed_versions = (V1, V2)

    def determine_version(self, request, *args, **kwargs):
        # Any other namespace (a page's app namespace) is not a version: DRF's own class refuses it.
        match = getattr(request, "resolver_match", None)
        return V2 if match is not None and NAMESPACE in match.namespaces else V1

    def get_versioned_viewname(self, viewname, request):
        return viewname if request.version == V1 else f"{NAMESPACE}:{viewname}"


def lean_list(view) -> bool:
    """True when the view answers a list whose items v2 keeps lean."""
    return view.action == "list" and view.request.version == V2
