"""The pages against a ``--mock-engine`` server with ``--api-key``: the key prompt, safe
rendering of hostile model output, load time and phone width, and the engine view of two
data-parallel replicas (all of them summed, or one picked) (no model needed for these)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from browser import browser, shots, watch_errors  # noqa: F401 - fixtures
from server_proc import ServerProc

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--mock-engine", "--mock-step-ms", "5", "--api-key", KEY)
    yield s
    assert s.stop() == 0


@pytest.fixture
def page(browser, server):  # noqa: F811
    context = browser.new_context()
    page = context.new_page()
    page.errors = watch_errors(page)
    yield page
    context.close()


def _enter_key(page, key):
    page.fill("#key-dialog input", key)
    page.click("#key-dialog button[type=submit]")


def test_pages_and_assets_open_but_the_api_needs_the_key(server):
    for path in ("/", "/ui/engine", "/ui/static/chat.js", "/ui/static/style.css"):
        assert httpx.get(server.url + path).status_code == 200, path
    assert httpx.get(server.url + "/v1/engine/state").status_code == 401
    assert httpx.get(server.url + "/ui/static/../../v1/models").status_code in (401, 404)
    r = httpx.get(server.url + "/v1/engine/state", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["num_running"] == 0


def test_key_prompt_wrong_key_then_right_key_then_chat(page, server):
    page.goto(server.url + "/")
    page.wait_for_selector("#key-dialog:not([hidden])")
    _enter_key(page, "wrong")
    page.wait_for_selector("#key-dialog .key-error:has-text('Wrong key')")
    assert page.is_visible("#key-dialog")
    _enter_key(page, KEY)
    page.wait_for_selector("#key-dialog", state="hidden")
    assert page.inner_text("#model-name")
    assert page.evaluate("sessionStorage.getItem('radixserve.apiKey')") == KEY
    page.fill("#prompt", "hi")
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant .msg-action[data-action=regenerate]", timeout=20000)
    assert "tokens" in page.inner_text(".msg.assistant .msg-meta")
    page.reload()  # the key is kept for the session: no prompt again
    page.wait_for_selector(".msg.assistant")
    assert page.is_hidden("#key-dialog")
    assert not page.errors, page.errors


def test_engine_view_asks_for_the_key(page, server, shots):  # noqa: F811
    page.goto(server.url + "/ui/engine")
    page.wait_for_selector("#key-dialog:not([hidden])")
    _enter_key(page, KEY)
    page.wait_for_selector("#status:has-text('live')")
    assert page.inner_text("#num-running") == "0"
    page.screenshot(path=str(shots / "engine_mock.png"), full_page=True)


HOSTILE = ("Look: <script>window.__pwned = 1</script> and "
           "<img src=x onerror=\"window.__pwned = 2\"> [click](javascript:window.__pwned=3) "
           "**bold** `<b>code</b>`\n\n```html\n<script>window.__pwned = 4</script>\n```\n")


def test_model_html_is_shown_as_text(page, server):
    """A stored answer carrying HTML goes through the chat's renderer on load: shown as the
    characters it is, never run; a javascript: link is not a link."""
    page.goto(server.url + "/")
    page.evaluate("([key, conv]) => { sessionStorage.setItem('radixserve.apiKey', key);"
                  " localStorage.setItem('radixserve.conversations', conv); }",
                  [KEY, json.dumps([{"id": "x1", "title": "hostile", "created": 1,
                                     "updated": 1, "messages": [
                                         {"role": "user", "content": "<img src=x onerror="
                                                                     "\"window.__pwned=5\">"},
                                         {"role": "assistant", "content": HOSTILE}]}])])
    page.reload()
    page.wait_for_selector(".msg.assistant .msg-body strong")
    time.sleep(0.3)  # an onerror would fire by now
    assert page.evaluate("window.__pwned") is None
    assert page.eval_on_selector_all("#messages img, #messages script", "e => e.length") == 0
    body = page.inner_text(".msg.assistant .msg-body")
    assert "<script>window.__pwned = 1</script>" in body and "<img src=x onerror" in body
    code = page.inner_text(".msg.assistant .code-block code")
    assert code == "<script>window.__pwned = 4</script>"
    assert page.eval_on_selector_all("#messages a", "e => e.map(a => a.href)") == []
    assert "<img src=x" in page.inner_text(".msg.user .msg-body")
    assert not page.errors, page.errors


def test_loads_fast_and_fits_a_phone(browser, server, shots):  # noqa: F811
    context = browser.new_context(viewport={"width": 390, "height": 800}, is_mobile=True)
    page = context.new_page()
    page.goto(server.url + "/")
    page.evaluate(f"sessionStorage.setItem('radixserve.apiKey', '{KEY}')")
    responses = []
    page.on("response", lambda r: responses.append(r))
    page.reload(wait_until="load")
    load_ms = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
    auth = {"Authorization": f"Bearer {KEY}"}
    loaded = {r.url: len(httpx.get(r.url, headers=auth).content) for r in responses}
    total_kb = sum(loaded.values()) / 1024
    print(f"\nplayground load event at {load_ms:.0f} ms, {len(loaded)} files, {total_kb:.0f} KB")
    # What keeps the load fast, not a wall-clock bound (a 2-core CI machine measured 308 ms
    # against a 300 ms bound): the page and its own small assets only, nothing from another
    # origin, no framework; the backstop catches a hang, not a slow machine.
    assert all(url.startswith(server.url + "/") for url in loaded), loaded
    assert len(loaded) <= 16 and total_kb < 160, (len(loaded), total_kb, loaded)
    assert load_ms < 5000
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.is_hidden("#sidebar") and page.is_visible("#prompt")
    page.click("#toggle-sidebar")
    assert page.is_visible("#new-chat")
    page.click("#toggle-settings")
    assert page.is_visible("#settings-form") and page.is_hidden("#sidebar")
    page.screenshot(path=str(shots / "playground_phone.png"))
    context.close()


@pytest.fixture(scope="module")
def dp_server():
    s = ServerProc("--mock-engine", "--mock-step-ms", "20", "--api-key", KEY,
                   "--data-parallel-size", "2", "--dp-routing", "round_robin", timeout=120)
    yield s
    assert s.stop() == 0


def test_engine_view_of_two_replicas_sums_them_or_shows_one(browser, dp_server,  # noqa: F811
                                                           shots):  # noqa: F811
    auth = {"Authorization": f"Bearer {KEY}"}

    def complete():  # ~10 s at one token per 20 ms step
        httpx.post(dp_server.url + "/v1/completions", headers=auth, timeout=60,
                   json={"prompt": "hi", "max_tokens": 500, "ignore_eos": True})

    threads = [threading.Thread(target=complete) for _ in range(3)]  # round robin: 2 + 1
    for t in threads:
        t.start()
        time.sleep(0.2)  # in order: replica 0, 1, 0
    context = browser.new_context()
    page = context.new_page()
    page.errors = watch_errors(page)
    try:
        page.goto(dp_server.url + "/ui/engine")
        page.wait_for_selector("#key-dialog:not([hidden])")
        _enter_key(page, KEY)
        page.wait_for_selector("#status:has-text('live')")
        state = httpx.get(dp_server.url + "/v1/engine/state", headers=auth).json()
        assert [r["num_running"] for r in state["replicas"]] == [2, 1]
        assert state["num_running"] == 3
        assert page.is_visible("#replica-pick")
        assert page.eval_on_selector_all("#replica option", "o => o.map(e => e.textContent)") \
            == ["all (2)", "replica 0", "replica 1"]
        page.wait_for_function("document.querySelector('#num-running').textContent === '3'")
        assert page.eval_on_selector_all("#req-rows td.dp-only",
                                         "c => c.map(e => e.textContent).sort()") \
            == ["r0", "r0", "r1"]
        page.screenshot(path=str(shots / "engine_dp_all.png"), full_page=True)
        page.select_option("#replica", "0")
        page.wait_for_function("document.querySelector('#num-running').textContent === '2'")
        page.select_option("#replica", "1")
        page.wait_for_function("document.querySelector('#num-running').textContent === '1'")
        assert page.eval_on_selector_all("#req-rows tr", "r => r.length") == 1
        page.screenshot(path=str(shots / "engine_dp_replica1.png"), full_page=True)
        assert not page.errors, page.errors
    finally:
        context.close()
        for t in threads:
            t.join(60)
