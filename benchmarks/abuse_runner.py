"""Sending the abusive-input catalogue (`abuse_cases`) and judging the answers: the status
must be the case's, an error must carry an OpenAI error body, a 200 stream must end with
``data: [DONE]`` and carry no error event."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass

import httpx
from abuse_cases import AbuseCase, catalogue


@dataclass(slots=True)
class CaseResult:
    case: AbuseCase
    status: int | None
    seconds: float
    problem: str | None  # None: as expected

    @property
    def ok(self) -> bool:
        return self.problem is None



def run_case(client: httpx.Client, case: AbuseCase) -> CaseResult:
    """Send one case and judge the answer (status, error body, stream ending)."""
    started = time.perf_counter()
    try:
        if case.declared_length is not None:
            status, data = _on_socket(client, case)
        else:
            with client.stream(case.method, case.path, content=case.content(),
                               headers=case.headers) as r:
                data = r.read()
            status = r.status_code
    except Exception as exc:  # noqa: BLE001 - no answer is the finding
        return CaseResult(case, None, time.perf_counter() - started,
                          f"no answer: {type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - started
    return CaseResult(case, status, seconds, _judge(case, status, data))


def _on_socket(client: httpx.Client, case: AbuseCase) -> tuple[int, bytes]:
    """Send ``case`` with its lying Content-Length by hand (HTTP clients refuse to); the
    answer must come before the declared body has."""
    url = client.base_url
    body = case.content() or b""
    head = (f"{case.method} {case.path} HTTP/1.1\r\nHost: {url.host}\r\n"
            f"Content-Length: {case.declared_length}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in case.headers.items()) + "\r\n")
    with socket.create_connection((url.host, url.port), timeout=client.timeout.read) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < _content_end(answer):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def _content_end(answer: bytes) -> int:
    head, _, _ = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(answer)


def _judge(case: AbuseCase, status: int, data: bytes) -> str | None:
    if status != case.expected:
        return f"got {status}: {data[:200]!r}"
    if status >= 400:
        try:
            error = json.loads(data)["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
        except Exception:  # noqa: BLE001 - any malformed error body is the finding
            return f"not an OpenAI error body: {data[:200]!r}"
    elif case.is_stream:
        events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return f"the stream did not end with [DONE]: {events[-2:]}"
        if any(e.startswith('{"error"') for e in events):
            return f"the stream carried an error: {events[-2:]}"
    return None


def run_catalogue(base_url: str, cases: list[AbuseCase] | None = None,
                  timeout: float = 60.0) -> list[CaseResult]:
    with httpx.Client(base_url=base_url, timeout=timeout) as client:
        return [run_case(client, case) for case in (catalogue() if cases is None else cases)]


def format_table(results: list[CaseResult]) -> str:
    width = max(len(r.case.name) for r in results)
    lines = [f"{'case':<{width}}  {'path':<28} expect  got   ms  verdict"]
    for r in results:
        lines.append(f"{r.case.name:<{width}}  {r.case.path:<28} {r.case.expected:>6}  "
                     f"{r.status if r.status is not None else '-':>3} {r.seconds * 1000:>5.0f}  "
                     f"{'ok' if r.ok else 'FAIL: ' + r.problem}")
    failed = sum(not r.ok for r in results)
    lines.append(f"{len(results)} cases, {len(results) - failed} as expected, {failed} not")
    return "\n".join(lines)
