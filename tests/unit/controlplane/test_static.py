"""Production static files: collectstatic with WhiteNoise's manifest storage, as the image build
runs it. The manifest storage refuses any file that references a missing one (a source map)."""

from __future__ import annotations

import json

from django.core.management import call_command
from django.test import override_settings

PRODUCTION = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}


def test_collectstatic_builds_a_manifest_of_every_asset(tmp_path):
    with override_settings(STORAGES=PRODUCTION, STATIC_ROOT=tmp_path):
        call_command("collectstatic", "--noinput", verbosity=0)
    manifest = json.loads((tmp_path / "staticfiles.json").read_text())["paths"]
    assert {
        "css/fleetdeck.css",
        "vendor/chartjs-4.6.1/chart.umd.min.js",
        "vendor/chartjs-4.6.1/chart.umd.min.js.map",
    } <= set(manifest)
    assert (tmp_path / manifest["css/fleetdeck.css"]).exists()
