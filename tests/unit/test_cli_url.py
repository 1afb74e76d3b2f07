"""The API's URL without http(s):// is refused naming the fix, before any call."""

from __future__ import annotations

import pytest

from clipper.cli import main
from clipper.client import BadUrl, ClipperConnection

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("url", ["127.0.0.1:8093", "localhost", "ftp://127.0.0.1:8093", "http://"])
def test_a_url_without_http_is_refused_saying_so(url, capsys, monkeypatch):
    """'127.0.0.1:8093' was reported as "no Clipper API answers at 127.0.0.1:8093 (unknown url type: 127.0.0.1)"
    while the API was answering (a new user's run)."""
    monkeypatch.setenv("CLIPPER_URL", url)
    assert main(["apps"]) == 2
    err = capsys.readouterr().err
    assert "the API's URL must start with http:// or https://" in err and repr(url.rstrip("/")) in err, err
    with pytest.raises(BadUrl):
        ClipperConnection(url)


def test_http_and_https_urls_are_taken():
    assert ClipperConnection("http://127.0.0.1:8093/").url == "http://127.0.0.1:8093"
    assert ClipperConnection("https://abc.execute-api.us-east-1.amazonaws.com/Prod", token="t").url.endswith("/Prod")
