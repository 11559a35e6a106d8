"""The portal check's arguments, checked before any request: the hub's address, the user name, the token,
a port and a timeout, each one line when it cannot be used; and the command's parser, which never shows
the token.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
import sys
import urllib.parse

from ..system.errors import OneLineParser, WorkshopError
from .answers import EXAMPLE, clean

_HOST_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$", re.IGNORECASE)


def check_hub_address(hub) -> str:
    """The hub's address as requests use it (scheme and host checked, no trailing /); one line if it cannot be."""
    if not isinstance(hub, str) or not hub:
        raise WorkshopError("--hub is empty.", f"give the address attendees open to log in, {EXAMPLE}.")
    shown = repr(hub)
    if any(c.isspace() or not c.isprintable() for c in hub):
        raise WorkshopError(f"--hub {shown} holds a space or a control character.",
                            f"give the address alone, {EXAMPLE}.")
    if "://" not in hub or hub.startswith("://"):
        bare = hub.split("://", 1)[-1].lstrip("/:")
        raise WorkshopError(f"--hub {shown} has no scheme (http:// or https://), so no request can go to it.",
                            f"write the address in full: --hub https://{bare} (or http://{bare} for a hub "
                            "without TLS).")
    try:
        parts = urllib.parse.urlsplit(hub)
        port = parts.port
    except ValueError as err:
        raise WorkshopError(f"--hub {shown} is not a web address: {clean(str(err))}.",
                            f"give the hub's address, with a port from 1 to 65535 if any, {EXAMPLE}.") from None
    scheme = parts.scheme.lower()
    rest = hub.split("://", 1)[1]
    if scheme not in ("http", "https"):
        raise WorkshopError(f"--hub {shown} uses {parts.scheme}://, but a JupyterHub answers http:// or https:// only.",
                            f"use --hub https://{rest} (or http://{rest} for a hub without TLS).")
    if "@" in parts.netloc:
        raise WorkshopError(f"--hub {shown} holds a user name or password (before the @).",
                            "give the address without it: the token (--token) is what the check logs in with.")
    host = parts.hostname
    if not host:
        raise WorkshopError(f"--hub {shown} has no host name.", f"give the hub's host after {scheme}://, {EXAMPLE}.")
    if port == 0:
        raise WorkshopError(f"--hub {shown} names port 0, where nothing can listen.",
                            "give the hub's port (1 to 65535), or none for the scheme's own (443 for https).")
    if ":" in host:  # an IPv6 literal, in brackets in the address
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise WorkshopError(f"--hub {shown}: [{host}] is not an IPv6 address.",
                                "write an IPv6 address in brackets, e.g. --hub http://[::1]:8000.") from None
        netloc = f"[{host}]"
    else:
        try:
            ascii_host = host.encode("idna").decode("ascii")
        except UnicodeError:
            ascii_host = ""
        labels = ascii_host.rstrip(".").split(".")
        if not ascii_host or len(ascii_host) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
            raise WorkshopError(f"--hub {shown}: {host!r} is not a host name.",
                                f"give the hub's host name or IP address, {EXAMPLE}.")
        netloc = ascii_host
    if port is not None:
        netloc += f":{port}"
    if "?" in hub or "#" in hub:
        raise WorkshopError(f"--hub {shown} holds a query or fragment (? or #).",
                            f"give the hub's address alone, {EXAMPLE}.")
    segments = [s for s in parts.path.split("/") if s]
    for index, segment in enumerate(segments):
        if segment in ("hub", "user"):
            base = f"{scheme}://{netloc}" + "".join("/" + s for s in segments[:index])
            raise WorkshopError(f"--hub {shown} goes past the hub's address into its /{segment}/ pages.",
                                f"give the address attendees open, without /{segment}/...: --hub {base}.")
    path = urllib.parse.quote(parts.path, safe="/%:@!$&'()*+,;=-._~")
    return f"{scheme}://{netloc}{path}".rstrip("/")


def check_user_name(user) -> str:
    """``user`` if JupyterHub allows it as a user name (as its Authenticator does); one line if not."""
    fix = "give the name the attendee logs in with (the hub's Admin page lists every user)."
    if not isinstance(user, str) or not user:
        raise WorkshopError("--user is empty.", fix)
    shown = repr(user)
    if any(not c.isprintable() for c in user):
        raise WorkshopError(f"--user {shown} holds a control character, which no JupyterHub user name has.", fix)
    if user != user.strip():
        raise WorkshopError(f"--user {shown} begins or ends with a space, which JupyterHub does not allow.", fix)
    if "/" in user:
        raise WorkshopError(f"--user {shown} holds a /, which JupyterHub does not allow in a user name.", fix)
    if set(user) == {"."} or set(urllib.parse.unquote(user)) == {"."}:
        raise WorkshopError(f"--user {shown} is only dots, which JupyterHub does not allow as a user name.", fix)
    if user != user.lower():
        raise WorkshopError(f"--user {shown} has capitals, but JupyterHub keeps user names in lower case (it "
                            "lower-cases what attendees type at login).", f"use --user {user.lower()!r}.")
    return user


def check_token(token) -> str:
    """``token`` if it can be sent in a header; one line (never showing it) if not."""
    fix = "pass a hub API token (the hub's Token page, or `jupyterhub token`), copied whole and alone."
    if not isinstance(token, str) or not token:
        raise WorkshopError("--token is empty.", fix)
    if not (token.isascii() and token.isprintable()) or " " in token:
        raise WorkshopError("The --token value holds a space, a control character or a character outside ASCII: "
                            "no hub token does.", fix)
    return token


def check_port(port) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise WorkshopError(f"Port {port!r} is not a TCP port.", "give a port from 1 to 65535, e.g. 6006 for "
                                                                 "TensorBoard.")
    return port


MAX_TIMEOUT_S = 86_400.0  # a day: more is a mistake, and past about 9e9 s the socket layer cannot hold it


def check_timeout(timeout_s) -> float:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
            math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise WorkshopError(f"Timeout {timeout_s!r} is not a number of seconds above 0 and at most "
                            f"{MAX_TIMEOUT_S:,.0f}.", "use e.g. --timeout 30.")
    return float(timeout_s)


def port_flag(text: str) -> int:
    try:
        return check_port(int(text))
    except (ValueError, WorkshopError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1 to 65535)") from None


def seconds_flag(text: str) -> float:
    try:
        return check_timeout(float(text))
    except (ValueError, WorkshopError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0") from None


class TokenSafeParser(OneLineParser):
    """The one-line parser, which never shows the token, even in a message about the flags around it."""

    secrets: tuple = ()

    def parse_args(self, args=None, namespace=None):
        argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        # The value after --token, and after any misspelling of it (--tokn), alone or after "=".
        self.secrets = tuple(value for flag, value in zip(argv, argv[1:]) if flag.lower().startswith("--tok")) + \
            tuple(a.split("=", 1)[1] for a in argv if a.lower().startswith("--tok") and "=" in a)
        return super().parse_args(argv, namespace)

    def error(self, message: str):
        for secret in sorted((s for s in self.secrets if isinstance(s, str) and s), key=len, reverse=True):
            message = message.replace(secret, "<token>")
        super().error(message)
