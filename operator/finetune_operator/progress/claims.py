"""A look inside a bearer token before paying for a TokenReview: its unverified JWT claims.

Nothing here trusts the token: the signature is not checked, so a claim only ever *refuses* a token
early. A Kubernetes projected ServiceAccount token is a JWT whose claims carry the audience the pod
asked for (the job's, `auth.audience`), an expiry, and under `kubernetes.io` the namespace and the
pod it is bound to. A string that is not such a JWT, names another audience, ran out, or is not
bound to a pod of the path's namespace cannot pass the TokenReview either, so it is refused without
one; a forged JWT that claims all the right things still goes to the TokenReview, behind the rate
limits in `auth`.
"""

import base64
import binascii
import json
import math
from dataclasses import dataclass
from typing import Any

from finetune_operator.progress.reasons import Reason

MAX_TOKEN_CHARS = 8192
"""Longest bearer token looked at. A projected token is about 1 KB; the header limit is 8 KB anyway."""
CLOCK_SKEW_SECONDS = 30.0
"""A token this much past its `exp` by our clock still goes to review (the API server's clock decides)."""


@dataclass(frozen=True)
class Claims:
    """The few claims the early checks read, as the token states them (unverified)."""

    audiences: tuple[str, ...]
    expires: float | None
    namespace: str | None
    pod_bound: bool


def _segment(part: str) -> Any:
    """One base64url JWT segment decoded as JSON (padding optional, as in JWS compact form)."""
    raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    return json.loads(raw)


def peek(token: str) -> Claims | None:
    """The token's claims when it has the shape of a JWT (three base64url parts, JSON objects), else None."""
    if len(token) > MAX_TOKEN_CHARS:
        return None
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        return None
    try:
        header, payload = _segment(parts[0]), _segment(parts[1])
    except (ValueError, binascii.Error, RecursionError):  # bad base64, not UTF-8, not JSON, nested too deep
        return None
    if not isinstance(header, dict) or not isinstance(payload, dict):
        return None
    aud = payload.get("aud")
    audiences = (aud,) if isinstance(aud, str) else tuple(a for a in aud if isinstance(a, str)) if isinstance(
        aud, list
    ) else ()
    exp = payload.get("exp")
    expires = float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None
    if expires is not None and not math.isfinite(expires):
        expires = None
    kube = payload.get("kubernetes.io")
    kube = kube if isinstance(kube, dict) else {}
    namespace = kube.get("namespace")
    return Claims(
        audiences=audiences,
        expires=expires,
        namespace=namespace if isinstance(namespace, str) else None,
        pod_bound=isinstance(kube.get("pod"), dict),
    )


def early_refusal(claims: Claims | None, audience: str, namespace: str, now: float) -> Reason | None:
    """Why a TokenReview could not accept this token for (audience, namespace), or None: worth a review.

    `now` is wall-clock seconds since the epoch (JWT `exp` is in those).
    """
    if claims is None:
        return "malformed_token"
    if audience not in claims.audiences:
        return "wrong_audience"
    if claims.expires is None:
        return "malformed_token"
    if claims.expires + CLOCK_SKEW_SECONDS < now:
        return "expired_token"
    if claims.namespace != namespace:
        return "other_namespace"
    if not claims.pod_bound:
        return "not_pod_bound"
    return None
