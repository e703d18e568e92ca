"""The Responses store's file against foreign and corrupt files (issue 62 item 6): a -shm that
another user left read-only, or truncates while the server runs, neither kills the process
(SIGBUS) nor fails its writes; a read-only -wal fails at start, naming the files to check; a
write that fails later is logged and the answer still returned; a cycle in a stored chain (a
corrupt file) is a broken chain at once, not a walk that never ends.

Each file scenario runs in a child process (as ``nobody`` when the suite runs as root, whom
permissions do not stop), so a crash or a hang fails the test instead of the suite."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap

import pytest

from radixserve.frontend.responses.store import BrokenChain, ResponseStore

_NOBODY = 65534
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PRELUDE = f"""
import asyncio, os, sys
sys.path.insert(0, {_REPO!r})
from radixserve.frontend.responses.store import BrokenChain, ResponseStore
PATH = sys.argv[1]
if os.getuid() == 0:  # after the imports: nobody may not read the checkout
    os.setgid({_NOBODY}); os.setuid({_NOBODY})
def put(store, rid, previous=None):
    response = {{"id": rid, "previous_response_id": previous, "output": [{{"text": rid}}]}}
    return asyncio.run(store.put(response, [{{"role": "user", "content": rid}}]))
"""


@pytest.fixture
def folder():
    """A folder the child's user may write (``tmp_path``'s parents are root's alone)."""
    path = tempfile.mkdtemp(prefix="radixserve-store-")
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _child(code: str, path: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run ``code`` (with _PRELUDE) on ``path`` in a child, as the store's owner."""
    return subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(code), path],
                          check=False, capture_output=True, text=True, timeout=timeout)


def _left_by_a_killed_server(path: str) -> None:
    """A store of two responses whose server died without closing it (its -wal stays)."""
    out = _child("""
        store = ResponseStore(PATH)
        put(store, "resp_1")
        put(store, "resp_2", "resp_1")
        os._exit(0)
    """, path)
    assert out.returncode == 0, out.stderr


def _foreign(path: str, truncate: bool = False) -> None:
    """Make ``path`` another user's, read-only (root's when the child runs as nobody)."""
    if truncate or not os.path.exists(path):
        open(path, "wb").close()
    if os.getuid() == 0:
        os.chown(path, 0, 0)
    os.chmod(path, 0o444)


def test_a_foreign_read_only_shm_is_not_used(folder):
    path = os.path.join(folder, "responses.db")
    _left_by_a_killed_server(path)
    _foreign(path + "-shm", truncate=True)
    out = _child("""
        store = ResponseStore(PATH)
        assert put(store, "resp_3", "resp_2") is not False
        print(len(asyncio.run(store.conversation("resp_3"))))
    """, path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["6"]


def test_a_shm_truncated_while_running_does_not_kill_the_process(folder):
    path = os.path.join(folder, "responses.db")
    out = _child("""
        store = ResponseStore(PATH)
        put(store, "resp_1")
        if os.path.exists(PATH + "-shm"):
            os.truncate(PATH + "-shm", 0)
        put(store, "resp_2", "resp_1")
        print(len(asyncio.run(store.conversation("resp_2"))))
    """, path)
    assert out.returncode == 0, f"the child died ({out.returncode}): {out.stderr[-3000:]}"
    assert out.stdout.split() == ["4"]


def test_a_read_only_wal_fails_at_start_naming_the_files(folder):
    path = os.path.join(folder, "responses.db")
    _left_by_a_killed_server(path)
    _foreign(path + "-wal")
    out = _child("""
        try:
            ResponseStore(PATH)
        except ValueError as exc:
            print(exc)
        else:
            print("opened")
    """, path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "cannot open the response store" in out.stdout, out.stdout
    assert f"{path}-wal" in out.stdout and "writable" in out.stdout


def test_a_second_server_on_the_same_file_fails_at_start(folder):
    path = os.path.join(folder, "responses.db")
    first = ResponseStore(path)
    try:
        with pytest.raises(ValueError, match="another process"):
            ResponseStore(path, busy_timeout=0.1)
    finally:
        first.close()


def test_a_failed_write_is_logged_and_the_caller_told(tmp_path, caplog):
    store = ResponseStore(str(tmp_path / "responses.db"))

    async def main():
        assert await store.put({"id": "resp_1", "output": []}, []) is True
        # a real write failure, as a disk filling up or a file made read-only would give
        await store._run(store._db.execute, "PRAGMA query_only = ON")
        with caplog.at_level(logging.ERROR, "radixserve.frontend.responses.store"):
            assert await store.put({"id": "resp_2", "output": []}, []) is False
        assert await store.get("resp_1") is not None and await store.get("resp_2") is None

    try:
        asyncio.run(main())
    finally:
        store.close()
    assert "resp_2" in caplog.text and "readonly" in caplog.text


def test_a_cycle_in_a_stored_chain_is_a_broken_chain(folder):
    path = os.path.join(folder, "responses.db")
    _left_by_a_killed_server(path)
    db = sqlite3.connect(path)  # the corrupt file: resp_1 continues resp_2
    with db:
        db.execute("UPDATE responses SET previous_id = 'resp_2' WHERE id = 'resp_1'")
    db.close()
    try:
        out = _child("""
            store = ResponseStore(PATH)
            for rid in ("resp_2", "resp_1"):
                try:
                    asyncio.run(asyncio.wait_for(store.conversation(rid), 5))
                except BrokenChain as exc:
                    print(type(exc).__name__, exc.missing_id)
            print(asyncio.run(store.get("resp_1"))["id"])
        """, path, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the chain walk never ended")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["CorruptChain", "resp_2", "CorruptChain", "resp_1", "resp_1"]


def test_a_long_honest_chain_still_walks(tmp_path):
    store = ResponseStore(str(tmp_path / "responses.db"), max_entries=50)

    async def main():
        previous = None
        for i in range(50):
            await store.put({"id": f"resp_{i}", "previous_response_id": previous,
                             "output": [{"n": i}]}, [])
            previous = f"resp_{i}"
        return await store.conversation("resp_49")

    try:
        assert asyncio.run(main()) == [{"n": i} for i in range(50)]
    finally:
        store.close()
    assert issubclass(BrokenChain, LookupError)
