"""Reading a request's tenant from what TensorRT-LLM really passes.

* TensorRT-LLM 1.2: the salt string on the ``LlmRequest`` (``cache_salt`` / ``py_cache_salt``);
* every version with salting: the integer ``cache_salt_id`` the C++ request exposes (a hash of the salt string);
* 1.3+: ``RequestData.cache_salt`` in ``SchedulerOutput.new_requests`` (seen in ``build_connector_meta``).

An attribute that exists with value None means "no salt" (tenant ""). A request exposing none of them cannot be
placed in a tenant: :meth:`~semblend_dynamo.policy.Tenancy.unknown`.
"""

from __future__ import annotations

from typing import Any

from semblend_dynamo.policy import Tenancy

SALT_ATTRS = ("cache_salt", "py_cache_salt")
SALT_ID_ATTRS = ("cache_salt_id", "py_cache_salt_id")
_MISSING = object()
# Tenancies without a salt string, made once (frozen): most requests of a deployment without salts are one of these.
_UNKNOWN = Tenancy.unknown()
_NO_SALT_ID = Tenancy.from_salt_id(None)


def read_tenancy(request: Any) -> Tenancy:
    """The tenancy of an ``LlmRequest`` (or a ``RequestData``): the salt string wins over the integer id."""
    seen = False
    salt_id: int | None = None
    for name in SALT_ATTRS:
        value = getattr(request, name, _MISSING)
        if value is _MISSING:
            continue
        seen = True
        if isinstance(value, str):
            return Tenancy.from_salt(value)
        if value is not None:  # a salt of an unknown type: do not guess whose it is
            return _UNKNOWN
    for name in SALT_ID_ATTRS:
        value = getattr(request, name, _MISSING)
        if value is _MISSING:
            continue
        seen = True
        if isinstance(value, int) and not isinstance(value, bool):
            salt_id = value
        elif value is not None:
            return _UNKNOWN
    if not seen:
        return _UNKNOWN
    return _NO_SALT_ID if salt_id is None else Tenancy.from_salt_id(salt_id)


def refine(decided: Tenancy, request_data: Any) -> Tenancy:
    """The tenancy once ``RequestData`` (1.3+) arrived: its salt string replaces an unknown or salt-less tenancy.

    A tenancy decided from an integer id stays as it is, so a request gives donors to the tenants it could get from.
    """
    salt = getattr(request_data, "cache_salt", None)
    unsalted = decided.known and decided.salt is None and decided.salt_id is None
    if isinstance(salt, str) and (not decided.known or unsalted):
        return Tenancy.from_salt(salt)
    return decided
