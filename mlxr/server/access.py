"""Who may talk to the server from a browser: the Host allowlist (DNS rebinding) and the
Origin allowlist (cross-site requests), one policy that the guard and CORS both read.

A page on evil.example can make a browser send requests to 127.0.0.1, either by rebinding
its own name to 127.0.0.1 (the Host header still says evil.example) or by a cross-site
"simple" POST (the Origin header says evil.example). Both headers are set by the browser
and cannot be forged by the page, so checking them closes both doors.
"""
from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
# Same-origin pages of a loopback server, and local dev servers on other ports.
LOOPBACK_ORIGIN_REGEX = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"
_NAME = re.compile(r"[a-z0-9_.-]+|\[[0-9a-f:.]+\]")


def is_loopback_address(host: str) -> bool:
    """A bind address or Host name that only this machine can reach."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_local_ip(name: str) -> bool:
    """An IP literal of this machine or its networks. A rebinding page needs a DNS name it
    controls, so a Host that is an address (not a name) cannot come from one."""
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_unspecified or address.is_link_local


def _is_local_name(name: str) -> bool:
    # *.localhost resolves to loopback in browsers (RFC 6761); the machine's own name is not
    # a name a page elsewhere can point at us.
    return name.endswith(".localhost") or name == socket.gethostname().lower()


def host_name(header: str) -> str | None:
    """The name of a Host header without its port, lower-cased ("[::1]:80" -> "[::1]");
    None when it is not a plain host[:port]."""
    parts = urlsplit("//" + header)
    try:
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.query or parts.fragment or parts.username is not None:
        return None
    name = parts.hostname.lower()
    name = f"[{name}]" if ":" in name else name
    return name if _NAME.fullmatch(name) else None


@dataclass(frozen=True)
class AccessPolicy:
    """`hosts`: names (no port) allowed in the Host header besides the loopback ones; None
    means any Host (a non-loopback bind with no names configured: clients reach it by names
    we cannot know, and the API key it requires is what keeps a rebinding page out, as in
    Ollama). `origins`: browser origins allowed besides loopback and same-origin ones;
    "*" allows every origin."""

    hosts: frozenset[str] | None
    origins: frozenset[str]

    @classmethod
    def build(cls, bind_host: str, allowed_hosts: tuple[str, ...], origins: tuple[str, ...]) -> "AccessPolicy":
        names = frozenset(h.strip().lower() for h in allowed_hosts if h.strip())
        checked = is_loopback_address(bind_host) or bool(names)
        return cls(hosts=names if checked else None, origins=frozenset(o.rstrip("/") for o in origins))

    def host_allowed(self, header: str | None) -> bool:
        if self.hosts is None or header is None:  # HTTP/1.0 clients may omit Host; browsers never do
            return True
        if "*" in self.hosts:
            return True
        name = host_name(header)
        if name is None:
            return False
        return name in LOOPBACK_NAMES or name in self.hosts or _is_local_ip(name) or _is_local_name(name)

    def origin_allowed(self, origin: str | None, host_header: str | None) -> bool:
        if origin is None:  # not a browser, or a same-origin GET
            return True
        origin = origin.rstrip("/")
        if "*" in self.origins or origin in self.origins:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or parts.path or not parts.netloc:
            return False  # "null", file://, extension schemes: only when configured
        name = host_name(parts.netloc)
        if name is not None and (name in LOOPBACK_NAMES or is_loopback_address(name)):
            return True
        # Same origin: a page this server served (the web UI) talking back to it.
        return host_header is not None and parts.netloc.lower() == host_header.lower()
