"""Which ``Host`` headers the server answers: the guard against DNS rebinding.

A web page on ``attacker.example`` can have its name re-resolved to 127.0.0.1 (or to a LAN
address) after it loaded; its scripts then reach this server as the same origin, and read the
answers. What gives it away is the Host header: the browser sends the page's own name. So a
request is answered only when its Host (the port ignored) is one of:

- an IP address, any (``127.0.0.1``, ``[::1]``, ``10.1.2.3``): a rebinding page always names
  a domain it owns, never an address;
- a name without a dot (``localhost``, this machine's name, a docker-compose service), one
  under ``.localhost``, ``.local`` or ``.internal``, or this machine's full name: names that
  public DNS does not give out, so no web page can own them (Ollama allows the same ones);
- the name the server binds to (``--host llm.lan``), or one of ``--allowed-hosts`` (``NAME``,
  or ``*.DOMAIN`` for every name under it);
- any name, with ``--allowed-hosts '*'``, or when the server binds to a non-loopback address
  (``--host 0.0.0.0``: remote access is meant) *and* has an ``--api-key`` (which every data
  route needs: a page that does not know the key learns nothing). Bound to loopback, the key
  does not lift the check, which then also keeps the open probes from such pages.

A request without a Host header (HTTP/1.0; browsers always send one) is answered. Any other is
a 403 in its route's error shape (Ollama answers these with a bare 403), checked before the API
key. `serve` warns at start when ``'*'`` leaves a server without a key open to any page.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from radixserve.frontend.http.protocol_base import OpenAIError

ANY = "*"
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*")
_HOST_CHARS = re.compile(rb"[A-Za-z0-9._\-:\[\]%]+")


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """The Host rule above for a server bound to ``bind_host`` (its ``--host``), with
    ``allowed_hosts`` (lower-case, from `parse_allowed_hosts`) and whether it has an API
    key."""

    bind_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    has_api_key: bool = False
    machine_name: str = field(default_factory=lambda: socket.gethostname().lower())

    @property
    def allows_any(self) -> bool:
        """Whether every Host is answered (no check at all)."""
        return ANY in self.allowed_hosts or (self.has_api_key
                                             and not is_loopback(self.bind_host))

    def allows(self, host: bytes | None) -> bool:
        """Whether a request whose Host header is ``host`` (None: it has none) is answered."""
        if host is None or self.allows_any:
            return True
        name = _host_name(host)
        if name is None:
            return False
        if _is_address(name):
            return True
        if "." not in name or name.endswith(_LOCAL_SUFFIXES) or name == self.machine_name:
            return True
        if name == _bare(self.bind_host).lower():
            return True
        return any(name == allowed or (allowed.startswith("*.") and name.endswith(allowed[1:]))
                   for allowed in self.allowed_hosts)

    def refusal(self, host: bytes) -> OpenAIError:
        """The 403 for a request whose Host is not answered."""
        shown = host.decode("latin-1")[:100]
        return OpenAIError(
            f"Host {shown!r} is not allowed (DNS rebinding protection): start the server with "
            f"--allowed-hosts NAME to answer it, or bind a non-loopback --host with an --api-key",
            403, "permission_error", code="host_not_allowed")


def host_policy(args) -> HostPolicy:
    """The policy of ``radixserve serve``'s ``--host``, ``--allowed-hosts`` and ``--api-key``."""
    allowed = tuple(name for names in (args.allowed_hosts or ()) for name in names)
    return HostPolicy(args.host, allowed, bool(args.api_key))


def startup_warning(policy: HostPolicy) -> str | None:
    """What `serve` prints at start when ``--allowed-hosts '*'`` leaves a server without an
    API key open to any web page (by DNS rebinding); None otherwise."""
    if ANY not in policy.allowed_hosts or policy.has_api_key:
        return None
    return ("radixserve: WARNING: --allowed-hosts '*' without --api-key: any web page a browser "
            "on this network opens can drive this server through DNS rebinding; name the hosts "
            "clients use instead, or set --api-key")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on this machine's loopback interface alone."""
    host = _bare(host).lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it resolves to an interface others may reach


def parse_allowed_hosts(value: str) -> list[str]:
    """``--allowed-hosts``: comma-separated host names or addresses (``*.DOMAIN``: every name
    under DOMAIN; ``*``: any), lower-cased; ValueError for an entry that is not one (a scheme,
    port or path included)."""
    names = [part.strip().lower() for part in value.split(",") if part.strip()]
    if not names:
        raise ValueError("give at least one host name")
    for i, name in enumerate(names):
        if _is_address(_bare(name)):
            names[i] = _bare(name)
        elif name != ANY and not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a host name (give names like llm.example.com or "
                             "*.example.com, without scheme, port or path)")
    return names


def allowed_hosts_arg(value: str) -> list[str]:
    """`parse_allowed_hosts` as an argparse ``type``."""
    try:
        return parse_allowed_hosts(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _host_name(host: bytes) -> str | None:
    """The Host header's name, lower-case, without port, brackets or a final dot (None when it
    is not a host)."""
    if not _HOST_CHARS.fullmatch(host):  # no userinfo or path for urlsplit to skip
        return None
    try:
        name = urlsplit("//" + host.decode("ascii")).hostname
    except ValueError:  # an unclosed [ or a bad IPv6 address
        return None
    name = (name or "").rstrip(".")
    return name or None


def _bare(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
