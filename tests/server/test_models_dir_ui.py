"""The playground against ``serve --models-dir`` (mock engines): a picker lists every model
with its state, chatting with the picked one loads it, and the engine view follows the pick."""

from __future__ import annotations

import httpx
import pytest
from browser import browser, watch_errors  # noqa: F401 - fixtures
from server_proc import ServerProc


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_hf_dirs, tiny_gguf_files):
    folder = tmp_path_factory.mktemp("models")
    (folder / "llama-hf").symlink_to(tiny_hf_dirs["llama"], target_is_directory=True)
    (folder / "qwen.gguf").symlink_to(tiny_gguf_files("qwen2", "F32"))
    s = ServerProc("--models-dir", str(folder), "--mock-engine", "--kv-cache-memory-gb", "0.01")
    yield s
    assert s.stop() == 0


def test_picker_loads_the_picked_model_and_the_engine_view_follows(browser, server):  # noqa: F811
    page = browser.new_context().new_page()
    page.errors = watch_errors(page)
    page.goto(server.url + "/")
    page.wait_for_selector("#model-pick:not([hidden])")
    options = page.eval_on_selector_all("#model-pick option", "os => os.map(o => o.text)")
    assert options == ["llama-hf (unloaded)", "qwen (unloaded)"]
    page.select_option("#model-pick", "qwen")
    page.fill("#prompt", "hi")
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant .msg-action[data-action=regenerate]", timeout=20000)
    states = {m["id"]: m["status"]["value"]
              for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert states == {"llama-hf": "unloaded", "qwen": "loaded"}
    page.goto(server.url + "/ui/engine")
    page.wait_for_selector("#status:has-text('live')")
    assert page.inner_text("#model-name") == "qwen"
    assert not page.errors, page.errors
