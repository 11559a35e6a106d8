"""The portal check's reading of what a server sends back, as what it may be: the hub, another web server,
a proxy's error page, a redirect, silence, a certificate this machine does not trust. Each becomes one
line saying what answered and what to do; no server's text reaches a line uncleaned or with the token.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import urllib.error
import urllib.parse
from dataclasses import dataclass

from ..system.errors import WorkshopError

EXAMPLE = "e.g. --hub https://portal.example.org"
PLAIN_HTTP_ON_TLS = ("WRONG_VERSION_NUMBER", "record layer failure", "packet length too long", "HTTP_REQUEST",
                     "http request", "UNKNOWN_PROTOCOL", "unknown protocol")


@dataclass
class Answer:
    """What one request got: its status, content type and text (cut at 16 MiB)."""

    url: str
    status: int
    content_type: str
    text: str
    final_url: str = ""  # where a redirect within the hub's address led, if it did


def origin(url: str):
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.scheme.lower(), parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return None


def host_port(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, "")
    host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
    return f"{host}:{port}"


def base_of(url: str) -> str | None:
    """The hub's address in a URL of its pages (what comes before /hub/ or /user/), if it has one."""
    parts = urllib.parse.urlsplit(url)
    for marker in ("/hub/", "/user/"):
        at = (parts.path + "/").find(marker)
        if at >= 0:
            return f"{parts.scheme}://{parts.netloc}{parts.path[:at]}"
    return None


def redirected(url: str, err: urllib.error.HTTPError, expected: str) -> WorkshopError:
    try:
        location = (err.headers.get("Location") or err.headers.get("URI") or "") if err.headers is not None else ""
        target = clean(urllib.parse.urljoin(url, location), 200) if location else ""
    except ValueError:
        target = ""
    if "infinite loop" in str(err.msg):
        return WorkshopError(f"{url} answered with redirects in a loop ({err.code}, last to {target or 'nowhere'}) "
                             f"where {expected} was expected.",
                             "check --hub: ask the hub itself, not a login page or proxy in front of it that "
                             "redirects every request (its log shows the loop).")
    if not target:
        return WorkshopError(f"{url} answered {err.code}, a redirect to nowhere, where {expected} was expected.",
                             NOT_A_HUB)
    base = base_of(target)
    elsewhere = origin(target) != origin(url)
    return WorkshopError(f"{url} redirected ({err.code}) to {target} where {expected} was expected"
                         + ("; the check does not send the token to another address." if elsewhere else "."),
                         f"use the address it points to: --hub {base}." if base else
                         "check --hub: give the address attendees end up at in a browser.")


def no_answer(url: str, err: Exception, timeout_s: float, expected: str, token: str) -> WorkshopError:
    reason = err.reason if isinstance(err, urllib.error.URLError) else err
    where, host = host_port(url), urllib.parse.urlsplit(url).hostname
    tls = url.lower().startswith("https:")
    plain = "http://" + url.split("://", 1)[-1]
    if isinstance(reason, ssl.SSLCertVerificationError):
        return WorkshopError(f"{where} answered TLS with a certificate this machine does not trust "
                             f"({clean(reason.verify_message or str(reason))}), so {url} was not asked for "
                             f"{expected}.",
                             "trust the portal's certificate for this check: SSL_CERT_FILE=<its CA certificate, "
                             "or the self-signed certificate itself, as .pem> python -m workshop_utils.portal_check "
                             "...; better, give the portal a certificate from a trusted authority.")
    if isinstance(reason, ssl.SSLError):
        text = str(reason)
        if any(marker in text for marker in PLAIN_HTTP_ON_TLS):
            return WorkshopError(f"{where} answers plain HTTP, not TLS, where {url} expected {expected} over https.",
                                 f"use http:// (--hub {base_of(plain) or plain}), or the hub's TLS port.")
        return WorkshopError(f"The TLS handshake with {where} failed ({clean(text)}) where {url} expected {expected}.",
                             "check that the address is the hub's https:// one, and that its certificate and TLS "
                             "version suit this machine's OpenSSL.")
    if isinstance(reason, socket.gaierror):
        return WorkshopError(f"The host name {host} does not resolve ({clean(reason.strerror or str(reason))}), so "
                             f"nothing was asked at {url}.",
                             f"check the spelling of --hub, and that this machine's DNS knows it "
                             f"(getent hosts {host}).")
    if isinstance(reason, ConnectionRefusedError):
        return WorkshopError(f"Nothing listens at {where} (connection refused) where {url} expected {expected}.",
                             "check --hub's port (https: 443, http: 80, unless given), and that the hub runs there "
                             "(its service's status and log).")
    if isinstance(reason, TimeoutError):
        return WorkshopError(f"{url} did not answer within {timeout_s:g} s where {expected} was expected.",
                             "check the address (a firewall that drops the connection looks like this) and that the "
                             "hub is not overloaded; --timeout SECONDS waits longer.")
    if isinstance(reason, (ConnectionResetError, http.client.HTTPException, ConnectionAbortedError, EOFError)):
        detail = clean(type(reason).__name__ + (f": {reason}" if str(reason) else ""))
        return WorkshopError(f"{where} closed the connection or answered something that is not HTTP ({detail}) where "
                             f"{url} expected {expected}.",
                             "check --hub's address and port" + ("" if tls else
                                                                 "; if the hub serves TLS there, use https://") + ".")
    if isinstance(reason, OSError):
        return WorkshopError(f"{url} did not answer ({scrub(clean(str(reason)), token)}) where {expected} was "
                             "expected.", "check the hub's address and that the hub is running.")
    return WorkshopError(f"No request could go to {url} ({scrub(clean(str(reason)), token)}).",
                         f"check --hub, {EXAMPLE}.")


def clean(text: str, limit: int = 120) -> str:
    """Text from elsewhere, fit for one line: whitespace collapsed, control characters dropped, cut short."""
    text = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def scrub(text: str, token: str) -> str:
    return text.replace(token, "<token>") if token else text


def describe(answer: Answer) -> str:
    """What an answer holds, in words: an HTML page and its title, nothing, JSON, or the start of its text."""
    text = answer.text.strip()
    if not text:
        return "an empty answer"
    head = text[:2000].lower()
    if "html" in answer.content_type.lower() or head.startswith(("<!doctype html", "<html")) or "<html" in head:
        title = re.search(r"<title[^>]*>(.*?)</title", text[:20000], re.IGNORECASE | re.DOTALL)
        title = clean(title.group(1), 80) if title else ""
        return f"an HTML page titled {title!r}" if title else "an HTML page"
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return f"text starting {clean(text, 60)!r}"
    return f"JSON {clean(text, 60)}"


def json_of(answer: Answer):
    try:
        return json.loads(answer.text)
    except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than Python's stack
        return None


def message_of(answer: Answer) -> str:
    """The ``message`` of a Jupyter or JupyterHub error answer, else what the answer is."""
    value = json_of(answer)
    if isinstance(value, dict) and isinstance(value.get("message"), str) and value["message"].strip():
        return clean(value["message"].strip().splitlines()[0])
    return describe(answer)


def not_expected(answer: Answer, expected: str, fix: str) -> WorkshopError:
    led = f" (redirected to {clean(answer.final_url, 200)})" if answer.final_url not in ("", answer.url) else ""
    return WorkshopError(f"{answer.url}{led} answered {answer.status} with {describe(answer)} where {expected} was "
                         "expected.", fix)


NOT_A_HUB = ("check --hub: it is the address attendees open to log in (where /hub/login is), " + EXAMPLE
             + "; a Jupyter server of its own, or another web server, answers here.")
PROXY_PAGE = ("a proxy in front of the hub answered for it: check that the hub runs (its service's status and log) "
              "and that the proxy forwards to it; or --hub is not the hub's address.")
