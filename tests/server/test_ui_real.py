"""The pages in headless Chromium against ``radixserve serve`` on the embedded model: streamed
chat, stop (the server aborts it), regenerate, reload, export/import, a JSON schema, a forced
tool call, and the engine view under 8 streams and a shared system prompt."""

from __future__ import annotations

import json
import threading
import time

import httpx
import jsonschema
import openai
import pytest
from browser import browser, shots, watch_errors  # noqa: F401 - fixtures
from server_proc import ServerProc


@pytest.fixture(scope="module")
def server():
    s = ServerProc()
    yield s
    assert s.stop() == 0
    assert not s.engine_pids()


@pytest.fixture
def page(browser, server):  # noqa: F811
    context = browser.new_context(accept_downloads=True)
    page = context.new_page()
    page.errors = watch_errors(page)
    page.goto(server.url + "/")
    page.wait_for_function("document.querySelector('#model-name').textContent.length > 0")
    yield page
    assert not page.errors, page.errors
    context.close()


def _settings(page, **fields):
    if page.is_hidden("#settings-form"):
        page.click("#toggle-settings")
    for name, value in fields.items():
        sel = f"#settings-form [name={name}]"
        if page.eval_on_selector(sel, "e => e.tagName") == "SELECT":
            page.select_option(sel, value)
        else:
            page.fill(sel, value)


def _send(page, text):
    page.fill("#prompt", text)
    page.keyboard.press("Enter")


def _wait_done(page, timeout=60000):
    page.wait_for_selector(".msg.assistant:last-child .msg-action[data-action=regenerate]",
                           timeout=timeout)


def _aborted(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("radixserve:request_aborts_total"))


def test_chat_stop_regenerate_reload_export_import(page, server, shots, tmp_path):  # noqa: F811
    _settings(page, temperature="0", max_tokens="24")
    page.click("#toggle-settings")
    _send(page, "What is the capital of France?")
    page.wait_for_selector(".msg.assistant .msg-body p")  # tokens arrive while it streams
    _wait_done(page)  # (24 tokens may be done at once: #stop is checked on the long one)
    assert page.inner_text(".msg.assistant .msg-body").strip()
    meta = page.inner_text(".msg.assistant .msg-meta")
    assert "prompt" in meta and "TTFT" in meta and "tok/s" in meta
    assert ("24 tokens" in meta and "length" in meta) or "stop" in meta, meta
    page.screenshot(path=str(shots / "playground.png"))

    # stop mid-stream: the server aborts the request
    aborted = _aborted(server)
    _settings(page, max_tokens="1500")
    _send(page, "Write a long story about a dragon who learns to paint.")
    page.wait_for_function("document.querySelectorAll('.msg.assistant')[1]"
                           "?.querySelector('.msg-body').textContent.length > 20")
    assert page.is_visible("#stop")  # while it streams
    page.click("#stop")
    _wait_done(page)
    assert "stopped" in page.inner_text(".msg.assistant:last-child .msg-meta")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        load = httpx.get(server.url + "/load").json()
        if load["num_requests_running"] == 0 and load["num_pending_requests"] == 0:
            break
        time.sleep(0.1)
    assert load["num_requests_running"] == 0 and load["num_pending_requests"] == 0, load
    assert _aborted(server) == aborted + 1

    # regenerate the stopped answer (short this time)
    _settings(page, max_tokens="12")
    page.click("#toggle-settings")
    page.click(".msg.assistant:last-child .msg-action[data-action=regenerate]")
    page.wait_for_selector(".msg.assistant:last-child .msg-meta:has-text('length')",
                           timeout=60000)
    assert page.locator(".msg").count() == 4

    # edit the first question and send it again: the conversation is cut there
    page.click(".msg.user >> nth=0 >> .msg-action[data-action=edit]")
    page.fill(".msg.editing textarea", "What is the capital of Italy?")
    page.click(".msg.editing .msg-action[data-action=resend]")
    _wait_done(page)
    assert page.locator(".msg").count() == 2
    assert "Italy" in page.inner_text(".msg.user")

    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert page.locator(".msg").count() == 2
    assert "Italy" in page.inner_text(".msg.user")

    # export, delete, import
    with page.expect_download() as download:
        page.click("#export")
    path = tmp_path / "export.json"
    download.value.save_as(path)
    exported = json.loads(path.read_text())
    assert exported["kind"] == "radixserve.conversations"
    assert exported["conversations"][0]["messages"][0]["content"] == "What is the capital of Italy?"
    page.click("#conv-list .conv.active .conv-delete")
    assert page.locator(".msg").count() == 0
    page.set_input_files("#import-file", str(path))
    page.wait_for_selector("#import-status:has-text('imported 1')")
    page.click("#conv-list .conv:has-text('France')")  # titled by the first question
    assert page.locator(".msg").count() == 2


PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


def test_json_schema_gives_a_valid_object(page):
    _settings(page, temperature="0", max_tokens="60", format="json_schema",
              json_schema=json.dumps(PERSON))
    _send(page, "Invent a person.")
    _wait_done(page)
    jsonschema.validate(json.loads(page.inner_text(".msg.assistant .msg-body")), PERSON)


WEATHER = [{"name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]


def test_forced_tool_call_is_a_card(page):
    _settings(page, temperature="0", max_tokens="60", tools=json.dumps(WEATHER),
              tool_choice="required")
    _send(page, "What is the weather in Paris?")
    _wait_done(page)
    assert page.inner_text(".tool-card .tool-name") == "get_weather"
    args = json.loads(page.inner_text(".tool-card .tool-args"))
    assert isinstance(args["city"], str)
    page.click(".msg.assistant .msg-action[data-action=raw]")
    raw = json.loads(page.inner_text("#raw-json"))
    assert raw["tool_choice"] == "required" and raw["tools"][0]["function"]["name"] == "get_weather"
    assert page.inner_text("#raw-curl").startswith("curl ")


SYSTEM = ("You are a meticulous assistant for a company that builds bridges. " * 12).strip()


def test_engine_view_lists_streams_then_shows_the_shared_prefix(
        browser, server, shots):  # noqa: F811
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    stop = threading.Event()

    def stream(i):
        s = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Tell me story number {i}."}],
            max_tokens=400, stream=True, extra_body={"ignore_eos": True})
        for _ in s:
            if stop.is_set():
                s.close()
                return

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    page = browser.new_page()
    errors = watch_errors(page)
    try:
        page.goto(server.url + "/ui/engine")
        page.wait_for_function("document.querySelector('#num-running').textContent === '8'",
                               timeout=30000)
        page.wait_for_function("document.querySelectorAll('.req-row.running').length === 8")
        assert int(page.inner_text("#kv-used")) > 0
        page.screenshot(path=str(shots / "engine_running.png"), full_page=True)
        stop.set()
        for t in threads:
            t.join(30)
        page.wait_for_function("document.querySelector('#num-running').textContent === '0'",
                               timeout=15000)
        assert page.locator(".req-row").count() == 0

        for question in ("Name a bridge.", "Name a river.", "Name a city."):
            client.chat.completions.create(
                model=model, max_tokens=4, temperature=0,
                messages=[{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": question}])
        # the page polls once a second: wait for a drawing made after those requests
        page.wait_for_function(
            "[...document.querySelectorAll('g.cache-node.shared')]"
            ".some(g => +g.dataset.hits >= 2 && +g.dataset.tokens >= 64)", timeout=8000)
        assert float(page.inner_text("#hit-rate").split()[0]) > 0
        page.screenshot(path=str(shots / "engine_shared_prefix.png"), full_page=True)
        assert not errors, errors
    finally:
        stop.set()
        page.close()
