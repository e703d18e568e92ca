"""Stored Responses API responses: SQLite through the standard library.

``ResponseStore(None)`` keeps them in memory (lost at exit); ``ResponseStore(path)`` in a file
that a restarted server reads again. Either way at most ``max_entries`` are kept, the oldest
evicted first. Each row is one response: its JSON object, its own input items, and the id of
the response it continued (``previous_response_id``); a conversation is rebuilt by walking that
chain, so a long chain costs its length, not its square.

A file store is opened in SQLite's EXCLUSIVE locking mode, so its WAL index lives in this
process's memory and no ``-shm`` file is ever mapped: one that another user left read-only, or
truncates while the server runs, can neither fail the writes nor kill the process with SIGBUS.
The lock is held while the store is open (one server per file), and a write at start makes a
file this user cannot write (the database, its ``-wal``, their folder) fail then, not when the
first answer is stored. A write that fails later (a full disk) is logged; the answer still goes
to its client (issue 62 item 6).

NOTE: every method runs its SQL on the store's one worker thread (the connection is only ever
used there), off the event loop; the async methods may be called from any task.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger(__name__)

DEFAULT_MAX_ENTRIES = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    previous_id TEXT,
    response TEXT NOT NULL,
    input TEXT NOT NULL
)"""

_CHAIN = """
WITH RECURSIVE chain(id, previous_id, response, input, depth) AS (
    SELECT id, previous_id, response, input, 0 FROM responses WHERE id = ?
    UNION ALL
    SELECT r.id, r.previous_id, r.response, r.input, chain.depth + 1
    FROM responses r JOIN chain ON r.id = chain.previous_id
    -- a chain holds each stored response once at most: deeper, it has come back on itself
    WHERE chain.depth < (SELECT COUNT(*) FROM responses)
)
SELECT id, previous_id, response, input FROM chain ORDER BY depth DESC"""


class BrokenChain(LookupError):
    """A response of a ``previous_response_id`` chain is not stored (never, or evicted)."""

    def __init__(self, missing_id: str) -> None:
        super().__init__(missing_id)
        self.missing_id = missing_id


class CorruptChain(BrokenChain):
    """A stored chain that comes back to a response it passed (only a corrupt file has one:
    a new response always continues an older one)."""


class ResponseStore:
    def __init__(self, path: str | None = None, max_entries: int = DEFAULT_MAX_ENTRIES,
                 busy_timeout: float = 5.0) -> None:
        """Opens (or creates) the database now and writes to it, so a bad path, a file this
        user cannot write, or one another process holds (waited for ``busy_timeout`` seconds)
        fails at start-up with a ValueError saying which."""
        if max_entries < 1:
            raise ValueError(f"the response store needs room for at least 1 response, "
                             f"got {max_entries}")
        self.path, self.max_entries = path, max_entries
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="radixserve-store")
        try:
            # check_same_thread off: opened here, then used on the worker thread alone
            self._db = sqlite3.connect(path or ":memory:", timeout=busy_timeout,
                                       check_same_thread=False)
            if path:
                # NOTE: EXCLUSIVE must come before the first WAL access to keep -shm unused
                self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA user_version = 1")  # a real write, even when unchanged
            self._db.execute(_SCHEMA)
            self._db.commit()
        except sqlite3.Error as exc:
            self._pool.shutdown()
            raise ValueError(f"cannot open the response store {path!r}: {exc}"
                             f"{_hint(path, exc)}") from None

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def put(self, response: dict, input_items: list[dict]) -> bool:
        """Store (or replace) ``response`` with its own input items; evict the oldest. False
        when the write failed (logged: the caller still has the answer to give)."""
        try:
            await self._run(self._put, response, input_items)
        except sqlite3.Error as exc:
            logger.error("the response store %s could not store %s: %s", self.path or
                         ":memory:", response.get("id"), exc)
            return False
        return True

    async def get(self, response_id: str) -> dict | None:
        row = await self._run(self._one, "SELECT response FROM responses WHERE id = ?",
                              response_id)
        return None if row is None else json.loads(row[0])

    async def input_items(self, response_id: str) -> list[dict] | None:
        """The input items of that response alone (not of the responses it continued)."""
        row = await self._run(self._one, "SELECT input FROM responses WHERE id = ?",
                              response_id)
        return None if row is None else json.loads(row[0])

    async def conversation(self, response_id: str) -> list[dict]:
        """Every item of the chain ending at ``response_id``, oldest first: each response's
        input items, then its output items. Raises `BrokenChain` naming the first response
        that is not stored; `CorruptChain` naming the one a looping chain comes back to."""
        return await self._run(self._conversation, response_id)

    async def delete(self, response_id: str) -> bool:
        """Remove a response; False if it was not stored."""
        return await self._run(self._delete, response_id)

    def close(self) -> None:
        self._pool.submit(self._db.close).result()
        self._pool.shutdown()

    # on the worker thread

    def _put(self, response: dict, input_items: list[dict]) -> None:
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (id, previous_id, response, input) "
                "VALUES (?, ?, ?, ?)",
                (response["id"], response.get("previous_response_id"),
                 json.dumps(response, separators=(",", ":")),
                 json.dumps(input_items, separators=(",", ":"))))
            self._db.execute(
                "DELETE FROM responses WHERE seq <= (SELECT seq FROM responses "
                "ORDER BY seq DESC LIMIT 1 OFFSET ?)", (self.max_entries,))

    def _one(self, sql: str, *args):
        return self._db.execute(sql, args).fetchone()

    def _conversation(self, response_id: str) -> list[dict]:
        rows = self._db.execute(_CHAIN, (response_id,)).fetchall()
        if not rows:
            raise BrokenChain(response_id)
        seen: set[str] = set()
        for rid, *_ in reversed(rows):  # newest first, as the walk went
            if rid in seen:
                logger.error("the response store %s is corrupt: the chain of %s comes back "
                             "to %s", self.path, response_id, rid)
                raise CorruptChain(rid)
            seen.add(rid)
        if rows[0][1] is not None:  # the oldest found still continues one: gone
            raise BrokenChain(rows[0][1])
        items: list[dict] = []
        for _, _, response, inputs in rows:
            items += json.loads(inputs)
            items += json.loads(response)["output"]
        return items

    def _delete(self, response_id: str) -> bool:
        with self._db:
            return self._db.execute("DELETE FROM responses WHERE id = ?",
                                    (response_id,)).rowcount > 0


def _hint(path: str | None, exc: sqlite3.Error) -> str:
    """What to check, for the errors a file's permissions or another process give."""
    text = str(exc)
    if "readonly" in text or "unable to open" in text:
        return (f" (check that {path}, {path}-wal and their folder are writable by this "
                f"user)")
    if "locked" in text:
        return " (another process holds it: a second server on the same --response-store?)"
    return ""
