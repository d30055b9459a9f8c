"""Tenant identity and isolation for the proxy and the router (vLLM's ``cache_salt``).

vLLM isolates tenants by a per-request ``cache_salt``: it enters the hash of a prompt's first
KV block, so one salt isolates a whole chain and a tenant can never hit (or time) another
tenant's cached prefix. skv's simulator models it with ``salt_by_tenant`` (:mod:`skv.blocks`).

**Who the tenant is** (:class:`TenantPolicy`; user documentation: ``docs/tenancy.md``):

- ``key`` (``SKV_TENANT_SOURCE=key``, the default): the tenant is the one the client's API key
  (``Authorization: Bearer <key>``) maps to. Keys come from ``SKV_TENANT_KEYS_FILE`` (one
  ``<sha256 hex of the key> <tenant>`` per line, ``#`` comments) and/or ``SKV_TENANT_KEYS``
  (the same entries, comma-separated); only the SHA-256 of a key is stored, and a presented
  key is compared with every stored one in constant time (``hmac.compare_digest``). A missing
  or unknown key is a 401 that echoes nothing. A client's ``X-Tenant-ID`` is ignored (never
  forwarded, never recorded). Isolation in this mode without any key configured is refused at
  start-up.
- ``header`` (``SKV_TENANT_SOURCE=header``; for deployments behind a gateway): the tenant is the
  ``X-Tenant-ID`` header (surrounding blanks stripped; none or empty: :data:`DEFAULT_TENANT`).
  Any client can send any header, so this trusts ONLY a gateway that authenticates clients and
  strips every client-sent ``X-Tenant-ID`` before setting its own. Keys, if configured, are
  still required (they gate access; the header names the tenant).

In every mode two ``X-Tenant-ID`` headers are a 400 (a gateway that appends rather than
replaces must not let the client's win), and so are two ``Authorization`` headers when keys are
configured. Isolation off and no keys: the header is only a label for traces and decision logs,
forwarded as sent, as before.

**What reaches the upstream**: with isolation on or keys configured, neither ``X-Tenant-ID``
nor the client's ``Authorization`` is forwarded (``SKV_UPSTREAM_API_KEY``, when set, is sent as
``Authorization: Bearer`` instead, for engines started with ``--api-key``); with isolation on
every forwarded body carries ``cache_salt`` = :func:`cache_salt` of the tenant, replacing any
salt the client sent (a client must not pick its salt: it could pick another tenant's), and the
router keys its approximate caches and its KV-event scoring by tenant (see
:mod:`skv.services.router`).

The salt is ``"skv1-"`` + the first 32 hex digits of HMAC-SHA256(secret, tenant id): the same
tenant gets the same salt in every process (proxy and router agree, restarts keep the engine's
cache usable), and the raw tenant id never reaches the engine or its logs. Without a secret
(``SKV_TENANT_SALT_SECRET``) the key is a fixed public constant, so a salt can be recomputed
from a GUESSED tenant id; set a secret in production (the same on every proxy and router in
front of one engine pool). Isolation does not depend on the secret: clients cannot set salts.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fastapi.responses import JSONResponse

from ._common import env_bool, env_str, openai_error

#: the tenant of a request without an ``X-Tenant-ID`` header (isolation on)
DEFAULT_TENANT = "default"
#: the HMAC key when ``SKV_TENANT_SALT_SECRET`` is unset (public: see the module docstring)
_PUBLIC_KEY = b"skv-cache-salt-v1"
TENANT_HEADER = "x-tenant-id"
AUTH_HEADER = "authorization"
#: where the tenant comes from (module docstring); ``key`` unless configured
TENANT_SOURCES = ("key", "header")
DEFAULT_TENANT_SOURCE = "key"
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


def isolation_from_env() -> bool:
    """``SKV_TENANT_ISOLATION`` (default false)."""
    return env_bool("SKV_TENANT_ISOLATION", False)


def salt_secret_from_env() -> str | None:
    """``SKV_TENANT_SALT_SECRET`` (None: the public key)."""
    return env_str("SKV_TENANT_SALT_SECRET")


def tenant_source_from_env() -> str:
    """``SKV_TENANT_SOURCE`` (default ``key``)."""
    return env_str("SKV_TENANT_SOURCE", DEFAULT_TENANT_SOURCE) or DEFAULT_TENANT_SOURCE


def tenant_of(headers: Mapping[str, str]) -> str:
    """The ``X-Tenant-ID`` header's tenant (header mode), else :data:`DEFAULT_TENANT`."""
    raw = headers.get(TENANT_HEADER)
    tenant = raw.strip() if isinstance(raw, str) else ""
    return tenant or DEFAULT_TENANT


def cache_salt(tenant: str, secret: str | None = None) -> str:
    """The tenant's vLLM ``cache_salt``: deterministic, one per tenant, not the raw id."""
    key = secret.encode() if secret else _PUBLIC_KEY
    digest = hmac.new(key, tenant.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
    return "skv1-" + digest[:32]


def with_cache_salt(body: Mapping[str, Any], salt: str) -> dict[str, Any]:
    """A copy of ``body`` whose ``cache_salt`` is ``salt`` (a client's own salt is replaced)."""
    return {**body, "cache_salt": salt}


# --------------------------------------------------------------------------- API keys


def hash_key(key: str) -> str:
    """What a keys file stores for ``key``: its SHA-256, hex (``skv services hash-key``)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class ApiKeys:
    """API keys (as SHA-256 digests) and the tenant each belongs to."""

    entries: tuple[tuple[bytes, str], ...] = ()

    def __len__(self) -> int:
        return len(self.entries)

    @classmethod
    def parse(cls, lines: list[str], source: str, first_line: int = 1) -> ApiKeys:
        """``<sha256 hex> <tenant>`` entries (blank and ``#`` lines skipped); ValueError naming
        ``source`` and the line for anything else (a raw key pasted in is refused)."""
        entries: list[tuple[bytes, str]] = []
        seen: dict[bytes, int] = {}
        for n, raw in enumerate(lines, start=first_line):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            digest, _, tenant = line.replace("\t", " ").partition(" ")
            tenant = tenant.strip()
            where = f"{source}:{n}"
            if not _SHA256_HEX.fullmatch(digest):
                raise ValueError(
                    f"{where}: expected '<sha256 hex of the key> <tenant>' (64 hex digits "
                    "first; hash a key with 'skv services hash-key')"
                )
            if not tenant or not tenant.isprintable():
                raise ValueError(
                    f"{where}: the tenant after the key's hash is missing or unprintable"
                )
            d = bytes.fromhex(digest)
            if d in seen:
                raise ValueError(f"{where}: the same key hash as line {seen[d]}")
            seen[d] = n
            entries.append((d, tenant))
        return cls(tuple(entries))

    @classmethod
    def load(cls, path: str | Path | None = None, env: str | None = None) -> ApiKeys:
        """The keys of the file ``path`` and of ``env`` (comma-separated entries) together."""
        entries: list[tuple[bytes, str]] = []
        if path is not None:
            p = Path(path)
            try:
                text = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"cannot read the tenant keys file {p}: {exc}") from None
            entries += cls.parse(text.splitlines(), str(p)).entries
        if env:
            entries += cls.parse(env.split(","), "SKV_TENANT_KEYS", first_line=1).entries
        digests = [d for d, _ in entries]
        if len(set(digests)) != len(digests):
            raise ValueError("the same key hash is in SKV_TENANT_KEYS and the keys file")
        return cls(tuple(entries))

    def tenant(self, key: str) -> str | None:
        """The tenant of ``key``, or None. Every stored digest is compared (constant time per
        comparison, no early exit), so the answer's timing does not say which entry matched."""
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        found = None
        for stored, tenant in self.entries:
            if hmac.compare_digest(stored, digest):
                found = tenant
        return found


class TenantRefused(Exception):
    """A request refused before anything else is read: ``status`` (400/401) and the service's
    own words (never the client's key or header)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def refusal(exc: TenantRefused) -> JSONResponse:
    """The client's answer to a refused identity: 401 (with ``WWW-Authenticate: Bearer``) or
    400, in the service's own words."""
    kind = "authentication_error" if exc.status == 401 else "invalid_request_error"
    resp = openai_error(exc.status, exc.message, kind)
    if exc.status == 401:
        resp.headers["www-authenticate"] = "Bearer"
    return resp


class _Headers(Protocol):
    def getlist(self, key: str) -> list[str]: ...


class TenantConfig(Protocol):
    """The fields :meth:`TenantPolicy.from_config` reads (ProxyConfig, RouterConfig)."""

    tenant_isolation: bool
    tenant_source: str
    tenant_keys_file: Path | None
    tenant_keys: str | None
    upstream_api_key: str | None


@dataclass(frozen=True)
class TenantPolicy:
    """Who a request's tenant is, and which identity headers never go upstream (module
    docstring). Invalid combinations fail at start-up (ValueError)."""

    isolation: bool = False
    source: str = DEFAULT_TENANT_SOURCE
    keys: ApiKeys = field(default_factory=ApiKeys)
    upstream_api_key: str | None = None

    def __post_init__(self) -> None:
        if self.source not in TENANT_SOURCES:
            raise ValueError(
                f"tenant source {self.source!r}: expected one of {', '.join(TENANT_SOURCES)} "
                "(SKV_TENANT_SOURCE, --tenant-source)"
            )
        if self.isolation and self.source == "key" and not self.keys:
            raise ValueError(
                "tenant isolation takes the tenant from an API key, and no key is configured: "
                "set SKV_TENANT_KEYS_FILE (--tenant-keys-file) or SKV_TENANT_KEYS, or, behind a "
                "gateway that strips and sets X-Tenant-ID, SKV_TENANT_SOURCE=header "
                "(--tenant-source header); see docs/tenancy.md"
            )

    @classmethod
    def from_config(cls, cfg: TenantConfig) -> TenantPolicy:
        return cls(
            isolation=cfg.tenant_isolation,
            source=cfg.tenant_source,
            keys=ApiKeys.load(cfg.tenant_keys_file, cfg.tenant_keys),
            upstream_api_key=cfg.upstream_api_key,
        )

    @property
    def identifies(self) -> bool:
        """Whether the service decides the tenant (then the client's identity headers are its
        own business and never reach the upstream)."""
        return self.isolation or bool(self.keys)

    def identify(self, headers: _Headers) -> str | None:
        """The request's tenant (None: isolation off, no keys and no header), or
        :class:`TenantRefused`. Reads headers only: call it before the body."""
        claimed = headers.getlist(TENANT_HEADER)
        if len(claimed) > 1:
            raise TenantRefused(400, "more than one X-Tenant-ID header")
        key_tenant = None
        if self.keys:
            auth = headers.getlist(AUTH_HEADER)
            if len(auth) > 1:
                raise TenantRefused(400, "more than one Authorization header")
            scheme, _, key = (auth[0] if auth else "").strip().partition(" ")
            key = key.strip()
            if scheme.lower() != "bearer" or not key:
                raise TenantRefused(401, "missing API key (send Authorization: Bearer <key>)")
            key_tenant = self.keys.tenant(key)
            if key_tenant is None:
                raise TenantRefused(401, "unknown API key")
        if self.source == "key" and key_tenant is not None:
            return key_tenant
        header = claimed[0] if claimed else None
        if self.isolation:  # header mode (key mode without keys is refused at start-up)
            return tenant_of({TENANT_HEADER: header} if header is not None else {})
        return header  # a label only, as sent

    def upstream_headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The forwarded headers without the client's identity (when the service decides it)
        and with the upstream's own key (when configured)."""
        out = dict(headers)
        if self.identifies:
            drop = {TENANT_HEADER, AUTH_HEADER}
            out = {k: v for k, v in out.items() if k.lower() not in drop}
        if self.upstream_api_key:
            out = {k: v for k, v in out.items() if k.lower() != AUTH_HEADER}
            out["authorization"] = f"Bearer {self.upstream_api_key}"
        return out


def policy_env() -> dict[str, Any]:
    """The tenancy fields of a service config, from the environment."""
    keys_file = env_str("SKV_TENANT_KEYS_FILE")
    return {
        "tenant_isolation": isolation_from_env(),
        "tenant_salt_secret": salt_secret_from_env(),
        "tenant_source": tenant_source_from_env(),
        "tenant_keys_file": Path(keys_file) if keys_file else None,
        "tenant_keys": env_str("SKV_TENANT_KEYS"),
        "upstream_api_key": env_str("SKV_UPSTREAM_API_KEY"),
    }
