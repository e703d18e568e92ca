"""The playground's images against a ``--mock-engine`` server (a text-only model): the controls
hidden and a dropped image refused with a notice; with ``/v1/models`` answered as a vision
model (Playwright's routing, the only change to what the server says): attach by picker,
paste and drop, thumbnails (removable, opened whole), downscaling past 2048 px, the data URIs
in the chat request, regenerate and edit keeping / dropping images, reload, the server's own
400 shown as it is, an import pointing at a URL, and a full browser storage."""

from __future__ import annotations

import base64
import io
import json

import httpx
import pytest
from browser import browser, shots, watch_errors  # noqa: F401 - fixtures
from PIL import Image
from server_proc import ServerProc

REPLY = ('data: {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", '
         '"choices": [{"index": 0, "delta": {"role": "assistant", "content": "A red box."}, '
         '"finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--mock-engine", "--mock-step-ms", "5")
    yield s
    assert s.stop() == 0


def _png(width: int, height: int, color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def _page(browser, server, vision: bool):  # noqa: F811
    """A fresh page; ``vision``: /v1/models answers with "vision" among the model's
    capabilities (the rest of the card is the server's)."""
    context = browser.new_context()
    page = context.new_page()
    page.errors = watch_errors(page)
    if vision:
        def models(route):
            body = route.fetch().json()
            for card in body["data"]:
                card["capabilities"] = [*card.get("capabilities", ["completion"]), "vision"]
            route.fulfill(json=body)
        page.route("**/v1/models", models)
    page.goto(server.url + "/")
    page.wait_for_function("document.querySelector('#model-name').textContent.length > 0")
    return context, page


def _chats(page, reply: str | None = REPLY) -> list[dict]:
    """Answer /v1/chat/completions in the page with ``reply`` (None: let the server answer);
    returns the list the request bodies are appended to."""
    sent = []

    def chat(route):
        sent.append(json.loads(route.request.post_data))
        if reply is None:
            route.continue_()
        else:
            route.fulfill(status=200, body=reply, headers={"Content-Type": "text/event-stream"})
    page.route("**/v1/chat/completions", chat)
    return sent


def _files_event(page, selector: str, kind: str, files: list[tuple[str, str, bytes]]):
    """Dispatch a ``drop`` or ``paste`` event carrying ``files`` (name, type, bytes)."""
    page.evaluate("""([selector, kind, files]) => {
        const dt = new DataTransfer();
        for (const [name, type, b64] of files) {
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            dt.items.add(new File([bytes], name, { type }));
        }
        const target = document.querySelector(selector);
        const ev = kind === "paste"
            ? new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true })
            : new DragEvent(kind, { dataTransfer: dt, bubbles: true, cancelable: true });
        target.dispatchEvent(ev);
    }""", [selector, kind, [[n, t, base64.b64encode(b).decode()] for n, t, b in files]])


def _send(page, text):
    page.fill("#prompt", text)
    page.keyboard.press("Enter")
    page.wait_for_selector(".msg.assistant:last-child .msg-action[data-action=regenerate], "
                           ".msg.assistant:last-child .msg-error")


def _image_parts(body) -> list[str]:
    content = body["messages"][-1]["content"]
    assert isinstance(content, list), content
    return [p["image_url"]["url"] for p in content if p["type"] == "image_url"]


def _decoded(url: str) -> Image.Image:
    head, data = url.split(",", 1)
    assert head.startswith("data:image/") and head.endswith(";base64")
    return Image.open(io.BytesIO(base64.b64decode(data)))


def test_a_text_only_model_shows_no_controls_and_refuses_a_dropped_image(browser, server):  # noqa: F811
    context, page = _page(browser, server, vision=False)
    cards = httpx.get(server.url + "/v1/models").json()["data"]
    assert "vision" not in cards[0].get("capabilities", [])
    assert page.is_hidden("#attach") and page.is_hidden("#attach-list")
    _files_event(page, "#prompt", "drop", [("red.png", "image/png", _png(8, 8))])
    page.wait_for_selector("#attach-notice:has-text('takes text only')")
    _files_event(page, "#prompt", "paste", [("red.png", "image/png", _png(8, 8))])
    assert page.is_hidden("#attach-list") and page.url == server.url + "/"  # not navigated away
    assert not page.errors, page.errors
    context.close()


def test_attach_paste_drop_send_regenerate_edit_reload(browser, server, shots, tmp_path):  # noqa: F811
    context, page = _page(browser, server, vision=True)
    sent = _chats(page)
    small = _png(40, 30)
    (tmp_path / "small.png").write_bytes(small)
    (tmp_path / "notes.txt").write_text("not an image")
    page.wait_for_selector("#attach:not([hidden])")
    assert page.get_attribute("#attach-file", "accept") == "image/*"

    page.set_input_files("#attach-file", [str(tmp_path / "small.png")])
    page.wait_for_selector("#attach-list .thumb img")
    _files_event(page, "#prompt", "paste", [("wide.png", "image/png", _png(3000, 1000))])
    page.wait_for_selector("#attach-notice:has-text('downscaled to 2048×683')")
    _files_event(page, "#prompt", "drop", [("blue.png", "image/png", _png(16, 16, (0, 0, 255))),
                                          ("notes.txt", "text/plain", b"hello"),
                                          ("broken.png", "image/png", b"\x89PNG\r\n\x1a\nxx")])
    page.wait_for_selector("#attach-notice.error:has-text('notes.txt: not an image')")
    assert "broken.png: this browser cannot read it" in page.inner_text("#attach-notice")
    assert page.eval_on_selector_all("#attach-list .thumb", "t => t.length") == 3
    page.screenshot(path=str(shots / "attachments_pending.png"))
    page.click("#attach-list .thumb:nth-child(3) .thumb-remove")  # the blue one
    assert page.eval_on_selector_all("#attach-list .thumb", "t => t.length") == 2

    _send(page, "What is in these images?")
    assert page.is_hidden("#attach-list")
    first, wide = _image_parts(sent[-1])
    assert first == "data:image/png;base64," + base64.b64encode(small).decode()  # its own bytes
    assert _decoded(wide).size == (2048, 683) and _decoded(wide).format == "PNG"
    assert sent[-1]["messages"][-1]["content"][-1] == {"type": "text",
                                                       "text": "What is in these images?"}
    assert page.eval_on_selector_all(".msg.user .thumbs img", "t => t.length") == 2
    assert "downscaled from 3000×1000" in page.get_attribute(".msg.user .thumb.scaled", "title")
    page.screenshot(path=str(shots / "attachments_sent.png"))
    page.click(".msg.user .thumb.scaled img")  # shown whole, with what it is
    page.wait_for_selector("#image-dialog:not([hidden]) figcaption:has-text('2048×683')")
    assert page.get_attribute("#image-dialog img", "src") == wide
    page.click("#image-dialog")
    assert page.is_hidden("#image-dialog")
    raw = page.evaluate("window.radixserve.store.conversations[0].messages[1].request")
    assert "base64 elided" in json.dumps(raw) and small[:8] not in json.dumps(raw).encode()

    page.click(".msg.assistant .msg-action[data-action=regenerate]")  # re-renders at once
    page.wait_for_selector(".msg.assistant .msg-action[data-action=regenerate]")
    assert len(sent) == 2 and _image_parts(sent[1]) == [first, wide]

    page.click(".msg.user .msg-action[data-action=edit]")
    page.click(".msg.user.editing .thumb:nth-child(1) .thumb-remove")
    page.fill(".msg.user.editing textarea", "And this one?")
    page.click(".msg.user.editing .msg-action[data-action=resend]")
    page.wait_for_selector(".msg.assistant .msg-action[data-action=regenerate]")
    assert len(sent) == 3 and _image_parts(sent[2]) == [wide]
    assert len(sent[2]["messages"]) == 1  # the edited turn replaced the old one

    page.reload()
    page.wait_for_selector(".msg.user .thumbs img")
    assert page.eval_on_selector_all(".msg.user .thumbs img", "t => t.length") == 1
    _send(page, "text only now")
    assert [_image_parts({"messages": [m]}) for m in sent[3]["messages"][:1]] == [[wide]]
    assert sent[3]["messages"][-1]["content"] == "text only now"  # a plain string without images
    assert not page.errors, page.errors
    context.close()


def test_the_servers_400_is_shown_as_it_is(browser, server):  # noqa: F811
    """The model claims vision in the page, the server behind it takes text only: its answer
    to the image is shown on the turn, and the next text-only turn goes through."""
    context, page = _page(browser, server, vision=True)
    sent = _chats(page, reply=None)
    page.wait_for_selector("#attach:not([hidden])")
    _files_event(page, "#prompt", "drop", [("red.png", "image/png", _png(8, 8))])
    page.wait_for_selector("#attach-list .thumb img")
    _send(page, "describe")
    r = httpx.post(server.url + "/v1/chat/completions", json=sent[0])
    assert r.status_code == 400, r.text
    shown = page.inner_text(".msg.assistant .msg-error")
    assert shown == f"400: {r.json()['error']['message']}"
    page.click(".msg.user .msg-action[data-action=edit]")
    page.click(".msg.user.editing .thumb-remove")
    page.fill(".msg.user.editing textarea", "hi")
    page.click(".msg.user.editing .msg-action[data-action=resend]")
    page.wait_for_selector(".msg.assistant .msg-action[data-action=regenerate]", timeout=20000)
    assert sent[-1]["messages"][-1]["content"] == "hi"
    assert page.is_hidden(".msg-error")
    assert not page.errors, page.errors
    context.close()


def test_import_refuses_an_image_that_is_a_url(browser, server):  # noqa: F811
    """A thumbnail is only ever a data:image URI: an imported conversation that points at a
    URL (a tracking pixel) is refused."""
    context, page = _page(browser, server, vision=False)
    bad = {"conversations": [{"id": "a", "title": "t", "messages": [
        {"role": "user", "content": "x", "images": [{"url": "https://example.com/p.png"}]}]}]}
    error = page.evaluate("(text) => { try { window.radixserve.store.importJSON(text); }"
                          " catch (e) { return e.message; } }", json.dumps(bad))
    assert "not conversations" in error
    context.close()


def test_a_full_storage_keeps_the_text_and_says_so(browser, server):  # noqa: F811
    """localStorage filled to within ~100 KB of its quota: the turn with an image is saved
    without the image's data; after a reload the thumbnail says so and that turn is not sent
    again without it."""
    context, page = _page(browser, server, vision=True)
    sent = _chats(page)
    page.evaluate("""() => {
        const sizes = [];
        for (let size = 1 << 20, i = 0; size >= 1024;) {
            try { localStorage.setItem("filler" + i, "x".repeat(size)); sizes.push(size); i++; }
            catch (_) { size >>= 1; }
        }
        let freed = 0;  // ~100 KB free: room for the text, none for the image
        for (let i = sizes.length - 1; i >= 0 && freed < 100000; i--) {
            freed += sizes[i];
            localStorage.removeItem("filler" + i);
        }
    }""")
    noisy = Image.effect_noise((300, 300), 100).convert("RGB")  # ~270 KB as a PNG
    out = io.BytesIO()
    noisy.save(out, "PNG")
    _files_event(page, "#prompt", "drop", [("noise.png", "image/png", out.getvalue())])
    page.wait_for_selector("#attach-list .thumb img")
    _send(page, "what is this?")
    assert len(_image_parts(sent[0])) == 1  # sent in full this session
    page.wait_for_selector("#attach-notice:has-text('storage is full')")
    page.reload()
    page.wait_for_selector(".msg.user .thumb.lost")
    page.click(".msg.assistant .msg-action[data-action=regenerate]")
    page.wait_for_selector("#attach-notice.error:has-text('was not kept')")
    assert len(sent) == 1 and page.is_visible(".msg.assistant")  # the reply is left as it was
    assert not page.errors, page.errors
    context.close()
