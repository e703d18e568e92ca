"""The playground shows "prefill N / M" while a long prompt prefills (headless Chromium against
``radixserve serve`` on the embedded model, 8 prompt tokens per step so the prefill is slow
enough to see), and drops it once the answer starts."""

from __future__ import annotations

import re

import pytest
from browser import browser, watch_errors  # noqa: F401 - fixtures
from server_proc import ServerProc


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--max-num-batched-tokens", "8")
    yield s
    assert s.stop() == 0


def test_prefill_progress_shows_until_the_first_token(browser, server):  # noqa: F811
    context = browser.new_context()
    page = context.new_page()
    errors = watch_errors(page)
    sent = []
    page.on("request", lambda r: sent.append(r.post_data_json)
            if r.url.endswith("/v1/chat/completions") else None)
    page.goto(server.url + "/")
    page.wait_for_function("document.querySelector('#model-name').textContent.length > 0")
    page.fill("#prompt", "Summarize: " + "The quick brown fox jumps over the lazy dog. " * 40)
    page.keyboard.press("Enter")
    meta = ".msg.assistant:last-child .msg-meta"
    page.wait_for_function(
        f"(document.querySelector('{meta}')?.textContent || '').includes('prefill ')",
        timeout=60000)
    shown = page.text_content(meta)
    processed, total = (int(n.replace(",", "")) for n in re.search(
        r"prefill ([\d,]+) / ([\d,]+)", shown).groups())
    assert 0 < processed <= total and total > 400
    page.wait_for_selector(".msg.assistant:last-child .msg-action[data-action=regenerate]",
                           timeout=120000)
    assert "prefill" not in page.text_content(meta)
    assert sent and sent[0]["return_progress"] is True
    assert not errors, errors
    context.close()
