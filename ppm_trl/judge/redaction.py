"""Credentials never leave the judge: arguments and URLs that carry one are refused, and every message the judge
logs, raises or prints has them masked (`redact`) and is made printable (`printable`).

API keys come from the environment only (the provider's variable, or the one named by `api_key_env`).
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

# Arguments that look like credentials are refused: keys come from the environment only.
_CREDENTIAL_ARGUMENT = re.compile(r"key|secret|password|credential|session_token", re.IGNORECASE)
_CREDENTIAL_HEADER = re.compile(r"auth|key|token|secret|cookie", re.IGNORECASE)
_CREDENTIAL_VARIABLE = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CRED", re.IGNORECASE)
# A credential header as a server may echo it: `Authorization: Bearer x`, JSON `"api-key": "x"`, repr `'x-api-key': 'x'`.
_CREDENTIAL_HEADER_VALUE = re.compile(
    r"""(\b(?:proxy-)?authorization|\b(?:x-)?api[-_]key)(["']?\s*[:=]\s*["']?)((?:bearer|basic|token)\s+)?[^\s"',;}\]]+""",
    re.IGNORECASE,
)
_BEARER = re.compile(r"""\b(bearer\s+)[^\s"',;}\]]+""", re.IGNORECASE)
_key_variables: set[str] = set()  # names (never values) of the key variables judges were configured with


def remember_key_variable(name: str) -> None:
    """Mask the value of environment variable `name` in every later message, whatever its name (`api_key_env`)."""
    _key_variables.add(name)


def credential_arguments(litellm_kwargs: dict) -> list[str]:
    """The extra LiteLLM arguments (and `extra_headers`) that look like credentials: they are refused."""
    refused = sorted(name for name in litellm_kwargs if _CREDENTIAL_ARGUMENT.search(name))
    refused += sorted(f"extra_headers[{header!r}]" for header in (litellm_kwargs.get("extra_headers") or {})
                      if _CREDENTIAL_HEADER.search(str(header)))
    return refused


def redact(text: str) -> str:
    """Mask credentials in a message the judge logs or raises: the value of every key variable a judge was given
    (`api_key_env`, any name), of every credential-looking environment variable (…KEY, …TOKEN, …SECRET, …CRED),
    and any Authorization / api-key / x-api-key header value or bearer token (a server may echo them back)."""
    for name, value in os.environ.items():
        if value and value in text and (
            (name in _key_variables and len(value) >= 4) or (len(value) >= 8 and _CREDENTIAL_VARIABLE.search(name))
        ):
            text = text.replace(value, "***")
    text = _CREDENTIAL_HEADER_VALUE.sub(lambda match: f"{match[1]}{match[2]}{match[3] or ''}***", text)
    return _BEARER.sub(r"\1***", text)


def printable(text: str) -> str:
    """`text` as one line a terminal shows but never acts on: control characters (escape sequences' ESC, line
    breaks that could forge a `ppm-trl prepare:` line, tabs), bidi overrides and other non-printable characters
    are written as their Python escapes (`\\x1b`, `\\n`, `\\u202e`). For judge error text from a server."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def shown_error(text: str, limit: int = 300) -> str:
    """Judge error text as logged, raised and printed: credentials masked, cut to `limit`, printable."""
    return printable(redact(text)[:limit])


def api_base_problem(api_base: str) -> str | None:
    """Why `api_base` is not scheme://host[:port][/path] alone, or None. Anything beyond that — `user:password@`, a
    query, a fragment, a `;parameter`, a host that is not ASCII (a fullwidth `＠` hides a user part from `urlsplit`)
    — can carry a credential in some spelling (`?code=`, `?X-Amz-Security-Token=`, `#api_key=`), so it is refused
    rather than searched for one: api_base goes into every cache entry's fingerprint, `config()`, `repr`, the model
    card and error messages, and the key has a place of its own (the environment)."""
    if not api_base.isascii():
        return "characters that are not ASCII"
    try:
        parts = urlsplit(api_base)
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError as error:
        return f"a part that is not a URL ({error})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "no http:// or https:// scheme and host"
    if "@" in parts.netloc:
        return "a user:password@ part"
    for what, present in (("a query (?...)", parts.query or api_base.rstrip("#").endswith("?")),
                          ("a fragment (#...)", parts.fragment or "#" in api_base),
                          ("a ;parameter in the path", ";" in parts.path)):
        if present:
            return what
    return None
