"""A person plans an LLM's GPU memory in the browser: paste a config.json, plan, read the KV cache and the memory
bar, swapped in place by htmx under the pages' content security policy (the `page` fixture fails on a violation).
Playwright drives Debian's Chromium (scripts/install-browser.sh installs it)."""

from __future__ import annotations

import json
import re

import pytest

from tests.browser.pages import log_in
from tests.unit.llm.models import LLAMA3_8B, config

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_viewer_pastes_a_config_and_sees_the_kv_cache_and_the_memory_bar(page, live_server, people):
    log_in(page, live_server, "viewer", "/llm/planner/")
    page.wait_for_selector("h1:text('LLM capacity planner')")
    assert page.locator("#plan-result .empty").is_visible()
    # A mark on this document: htmx swaps the answer in, so it survives; a full page load would lose it.
    page.evaluate("window.plannerMark = 'kept'")

    page.fill("textarea[name=config]", json.dumps(config(LLAMA3_8B), indent=2))
    page.select_option("select[name=accelerator]", "H100")
    page.click("button:text('Plan')")
    page.wait_for_selector("#memory-bar")

    tokens = page.locator("#kv-cache-tokens").inner_text()
    assert re.fullmatch(r"\d{1,3}(,\d{3})+", tokens) and int(tokens.replace(",", "")) > 100_000
    assert page.locator("#plan-result .badge", has_text="Fits").count() == 1
    assert page.evaluate("window.plannerMark") == "kept"
    # The bar spans the card, its KV cache wider than the weights, as the legend's GiB say.
    bar = page.locator("#memory-bar").bounding_box()
    kv = page.locator("#memory-bar rect[data-part=kv_cache]").bounding_box()
    weights = page.locator("#memory-bar rect[data-part=weights]").bounding_box()
    assert bar["width"] > 600 and kv["width"] > weights["width"] > 20
    assert "Weights\t14.96" in page.locator("#memory-parts").inner_text()
    assert page.locator("#tradeoff tbody tr").count() >= 2
    assert '"max_model_len": 8192' in page.locator("#engine-kwargs").inner_text()
    page.screenshot(path="/tmp/fleetdeck-llm-planner.png", full_page=True)

    # A refusal lands next to the field it names, and the answer goes until the input is fixed.
    page.fill("input[name=max_model_len]", "100000")
    page.click("button:text('Plan')")
    page.wait_for_selector(".field.has-error input[name=max_model_len]")
    error = page.locator(".field.has-error", has=page.locator("input[name=max_model_len]")).inner_text()
    assert "above the model's context length 8,192" in error
    assert page.locator("#memory-bar").count() == 0
    assert page.evaluate("window.plannerMark") == "kept"
