"""deploy/reference_app/calibrate.py as a plain script: its last line is a calibration curve that
the control plane's parser accepts, and the curve follows the real memory of a batch."""

from __future__ import annotations

import json
import subprocess
import sys

from apps.calibration.curve import parse_output
from controlplane.local_ray import REFERENCE_APP_DIR


def generator_user_config() -> dict:
    config = json.loads((REFERENCE_APP_DIR / "reference.json").read_text())
    return next(d for d in config["applications"][0]["deployments"] if d["name"] == "Generator")["user_config"]


def calibrate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REFERENCE_APP_DIR / "calibrate.py"), *args],
        capture_output=True, text=True, timeout=300, check=False,
    )


def test_the_calibration_curve_parses_and_grows_with_the_token_sum():
    token_sums = [64, 256, 1024]
    result = calibrate("--token-sums", *map(str, token_sums), "--repeats", "1", "--device", "cpu")
    assert result.returncode == 0, result.stderr

    curve = parse_output(result.stdout)
    assert (curve["axis"], curve["device"]) == ("token_sum", "cpu") and curve["baseline_bytes"] > 0
    assert [point["x"] for point in curve["points"]] == token_sums
    peaks = [point["peak_bytes"] for point in curve["points"]]
    print(f"\nbaseline {curve['baseline_bytes']} bytes, peaks {dict(zip(token_sums, peaks))}")
    assert curve["monotone"] and curve["baseline_bytes"] <= peaks[0] < peaks[-1]
    # The default config's per-token temporaries alone account for this much of the rise.
    scratch_kb = generator_user_config()["scratch_kb_per_token"]
    assert peaks[-1] - peaks[0] >= (token_sums[-1] - token_sums[0]) * scratch_kb * 1024


def test_a_failed_calibration_says_why_on_its_last_line(tmp_path):
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"applications": [{"name": "other", "deployments": [{"name": "Model"}]}]}))

    result = calibrate("--token-sums", "64", "--config", str(config))

    assert result.returncode == 1
    assert result.stdout.strip().splitlines()[-1] == (
        f"FLEETDECK_CALIBRATION_ERROR CalibrationFailed: {config} has no Generator deployment"
    )
