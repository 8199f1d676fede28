"""The API machinery every app's viewsets use: how list rows are written (`rows.py`, `lean.py`) and
paged (`pagination.py`), rendered (`renderers.py`), versioned (`versioning.py`) and documented
(`openapi.py`). It imports no app (an import contract says so), so any app may import it without
a cycle through the project's URLconf."""
