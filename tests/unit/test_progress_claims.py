"""The unverified look inside a bearer token: only ever a reason to refuse early, never to accept."""

import base64
import json

import pytest

from finetune_operator.progress.claims import CLOCK_SKEW_SECONDS, MAX_TOKEN_CHARS, early_refusal, peek

AUD = "finetune.dev/progress/ml/demo"
NOW = 1_900_000_000.0


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def token(payload: object, header: object = None) -> str:
    head = {"alg": "RS256"} if header is None else header
    return f"{b64(json.dumps(head).encode())}.{b64(json.dumps(payload).encode())}.sig"


def claims(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {"aud": [AUD], "exp": NOW + 600,
                               "kubernetes.io": {"namespace": "ml", "pod": {"name": "demo-1-0", "uid": "u"}}}
    return {**base, **overrides}


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "garbage",
        "a.b",
        "a..c",
        "!!!.???.sig",
        f"{b64(b'not json')}.{b64(b'{}')}.sig",
        f"{b64(b'{}')}.{b64(b'[1, 2]')}.sig",
        f"{b64(b'{}')}.{b64(bytes([0xff, 0xfe]))}.sig",
        f"{b64(b'{}')}.{b64(b'[' * 100_000)}.sig"[:MAX_TOKEN_CHARS - 1],
        f"{b64(b'{}')}.{b64(b'[' * 5000 + b']' * 5000)}.sig",
        "x" * (MAX_TOKEN_CHARS + 1),
    ],
    ids=["empty", "word", "two-parts", "empty-part", "not-base64", "header-not-json", "payload-not-object",
         "not-utf8", "truncated-nesting", "deep-nesting", "too-long"],
)
def test_what_is_not_a_jwt_gives_no_claims(raw: str) -> None:
    assert peek(raw) is None
    assert early_refusal(peek(raw), AUD, "ml", NOW) == "malformed_token"


def test_a_projected_token_shape_is_worth_a_review() -> None:
    assert early_refusal(peek(token(claims())), AUD, "ml", NOW) is None
    assert early_refusal(peek(token(claims(aud=AUD))), AUD, "ml", NOW) is None  # aud may be a plain string


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (claims(aud=["finetune.dev/progress/ml/other"]), "wrong_audience"),
        (claims(aud=[]), "wrong_audience"),
        (claims(aud=7), "wrong_audience"),
        (claims(exp=None), "malformed_token"),
        (claims(exp=True), "malformed_token"),
        (claims(exp="soon"), "malformed_token"),
        (claims(exp=NOW - CLOCK_SKEW_SECONDS - 1), "expired_token"),
        (claims(**{"kubernetes.io": {"namespace": "elsewhere", "pod": {"name": "p"}}}), "other_namespace"),
        (claims(**{"kubernetes.io": "ml"}), "other_namespace"),
        (claims(**{"kubernetes.io": {"namespace": "ml"}}), "not_pod_bound"),
    ],
    ids=["other-audience", "no-audience", "audience-not-string", "no-exp", "exp-bool", "exp-string", "expired",
         "other-namespace", "kube-claim-not-object", "not-pod-bound"],
)
def test_claims_that_a_review_would_refuse(payload: dict[str, object], reason: str) -> None:
    assert early_refusal(peek(token(payload)), AUD, "ml", NOW) == reason


def test_a_token_just_past_exp_still_goes_to_review_for_clock_skew() -> None:
    assert early_refusal(peek(token(claims(exp=NOW - CLOCK_SKEW_SECONDS + 1))), AUD, "ml", NOW) is None
