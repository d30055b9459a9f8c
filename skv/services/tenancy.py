"""Tenant isolation for the proxy and the router (vLLM's ``cache_salt``).

vLLM isolates tenants by a per-request ``cache_salt``: it enters the hash of a prompt's first
KV block, so one salt isolates a whole chain and a tenant can never hit (or time) another
tenant's cached prefix. skv's simulator models it with ``salt_by_tenant`` (:mod:`skv.blocks`).
With isolation on (``SKV_TENANT_ISOLATION``, ``--tenant-isolation``; default off):

- the tenant is the ``X-Tenant-ID`` header (surrounding blanks stripped); a request without
  one (or an empty one) belongs to :data:`DEFAULT_TENANT`;
- every forwarded body carries ``cache_salt`` = :func:`cache_salt` of the tenant, replacing any
  salt the client sent (a client must not pick its salt: it could pick another tenant's);
- the router keys its approximate caches and its KV-event scoring by tenant (see
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
from collections.abc import Mapping
from typing import Any

from ._common import env_bool, env_str

#: the tenant of a request without an ``X-Tenant-ID`` header (isolation on)
DEFAULT_TENANT = "default"
#: the HMAC key when ``SKV_TENANT_SALT_SECRET`` is unset (public: see the module docstring)
_PUBLIC_KEY = b"skv-cache-salt-v1"
TENANT_HEADER = "x-tenant-id"


def isolation_from_env() -> bool:
    """``SKV_TENANT_ISOLATION`` (default false)."""
    return env_bool("SKV_TENANT_ISOLATION", False)


def salt_secret_from_env() -> str | None:
    """``SKV_TENANT_SALT_SECRET`` (None: the public key)."""
    return env_str("SKV_TENANT_SALT_SECRET")


def tenant_of(headers: Mapping[str, str]) -> str:
    """The request's tenant: its ``X-Tenant-ID`` header, else :data:`DEFAULT_TENANT`."""
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
