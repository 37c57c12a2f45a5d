"""Reading the policy file (JSON or JSON5) into a `FleetPolicy`.

Kept apart from `schemas.policy`, which the compiled engine imports: the
engine never reads files, so its build need not know the JSON5 reader."""

from __future__ import annotations

import os

from schemas.jsonfile import read_document
from schemas.policy import POLICY_ENV, FleetPolicy, PolicyError, parse_policy


def load_policy(path: str | os.PathLike[str] | None) -> FleetPolicy | None:
    """Read, parse and validate; no path (and no LOOPWARDEN_POLICY) means no policy."""
    if path is None:
        path = os.environ.get(POLICY_ENV) or None
    if path is None:
        return None
    document = read_document(path, "policy", PolicyError)
    try:
        return parse_policy(document)
    except PolicyError as exc:
        raise PolicyError(f"{path}: {exc}") from None
