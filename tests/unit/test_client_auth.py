"""Which authentication the client picks (``CLIPPER_AUTH``), and the region an API Gateway address names."""

from __future__ import annotations

import pytest

from clipper.client_auth import SigningError, SigV4Signer, region_of, resolve_mode, signer_for

API = "https://a1b2c3d4e5.execute-api.eu-west-1.amazonaws.com/prod"


@pytest.mark.parametrize(
    ("url", "region"),
    [
        (API, "eu-west-1"),
        ("https://abc123.execute-api.cn-north-1.amazonaws.com.cn", "cn-north-1"),
        ("https://api.example.com/prod", None),  # a custom domain: CLIPPER_REGION says it
        ("http://127.0.0.1:8080", None),
        ("https://execute-api.eu-west-1.amazonaws.com.evil.example", None),
    ],
)
def test_region_of_an_api_gateway_address(url: str, region: str | None) -> None:
    assert region_of(url) == region


def test_auto_signs_for_api_gateway_without_a_token_and_sends_the_token_otherwise() -> None:
    assert resolve_mode("auto", API, "") == "sigv4"
    assert resolve_mode("auto", API, "a-token") == "token"
    assert resolve_mode("auto", "http://127.0.0.1:8080", "") == "token"
    assert resolve_mode("sigv4", "https://api.example.com", "a-token") == "sigv4"
    assert resolve_mode("token", API, "") == "token"
    assert signer_for("http://127.0.0.1:8080", "t", "auto", None) is None
    assert isinstance(signer_for(API, "", "auto", None), SigV4Signer)


def test_an_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(SigningError, match="CLIPPER_AUTH"):
        resolve_mode("iam", API, "")
