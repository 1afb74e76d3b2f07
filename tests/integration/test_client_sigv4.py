"""The client and the CLI sign admin requests with SigV4 for a deployed stack, checked by a real signature check: a
loopback HTTP server that, as API Gateway does, recomputes the signature of each request it receives (method, path,
query, the signed headers, the body's SHA-256) with botocore and the secret key it knows, and refuses a mismatch
with 403. The credentials come from the usual chain (here: the environment)."""

from __future__ import annotations

import datetime as dt
import hmac
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from clipper.cli import main
from clipper.client import AdminError, ClipperConnection
from clipper.client_auth import SigV4Signer

pytestmark = pytest.mark.integration

KEY, SECRET, SESSION = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token-example"
REGION = "eu-west-3"
_AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<day>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request, "
    r"SignedHeaders=(?P<signed>[a-z0-9;-]+), Signature=(?P<signature>[0-9a-f]{64})"
)


def check_signature(method: str, target: str, headers: dict[str, str], body: bytes, region: str) -> str | None:
    """What is wrong with the request's SigV4 signature for ``execute-api`` in ``region`` (None: nothing)."""
    match = _AUTH.fullmatch(headers.get("authorization", ""))
    if match is None:
        return "missing or malformed SigV4 Authorization"
    if (match["key"], match["region"], match["service"]) != (KEY, region, "execute-api"):
        return f"wrong credential scope {match['key']}/{match['region']}/{match['service']}"
    amz_date = headers.get("x-amz-date", "")
    try:
        when = dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return "no X-Amz-Date"
    if abs((dt.datetime.now(dt.UTC) - when).total_seconds()) > 300 or match["day"] != amz_date[:8]:
        return "the signature's date is off"
    signed = match["signed"].split(";")
    if (
        not {"host", "x-amz-date", "x-amz-security-token"} <= set(signed)
        or headers.get("x-amz-security-token") != SESSION
    ):
        return f"host, date and session token must be signed (signed: {signed})"
    if any(name not in headers for name in signed):
        return "a signed header is missing"
    parts = urllib.parse.urlsplit(target)  # a proxied request's target is the absolute URL
    url = f"http://{headers['host']}{parts.path}" + (f"?{parts.query}" if parts.query else "")
    request = AWSRequest(method=method, url=url, data=body, headers={n: headers[n] for n in signed})
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(KEY, SECRET, SESSION), "execute-api", region)
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    return None if hmac.compare_digest(expected, match["signature"]) else "the signature does not match"


@dataclass
class Gateway:
    url: str
    region: str
    seen: list[dict[str, Any]] = field(default_factory=list)


def start_gateway(region: str) -> tuple[ThreadingHTTPServer, Gateway]:
    gateway = Gateway("", region)

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            problem = check_signature(self.command, self.path, headers, body, gateway.region)
            gateway.seen.append({"path": self.path, "headers": headers, "body": body, "problem": problem})
            if problem is not None:
                status, answer = 403, {"message": problem}
            else:
                status, answer = 200, {"operation": urllib.parse.urlsplit(self.path).path, "body": body.decode()}
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _handle

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    gateway.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, gateway


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    server, gw = start_gateway(REGION)
    yield gw
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch, tmp_path) -> None:
    """The credential chain finds these in the environment, and nothing else (no profile, no instance role)."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name in ("CLIPPER_AUTH", "CLIPPER_REGION", "CLIPPER_ADMIN_TOKEN", "CLIPPER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_the_client_signs_admin_calls_and_the_check_accepts_them(gateway: Gateway) -> None:
    conn = ClipperConnection(gateway.url, auth="sigv4", region=REGION)

    assert conn.ping()["operation"] == "/admin/ping"  # GET, no body
    added = conn.register_application("digits", "floats", "-1", 100_000, input_shape=[64])  # POST with a body
    assert added["operation"] == "/admin/add_app" and json.loads(added["body"])["input_shape"] == [64]
    assert conn.get_metrics()["operation"] == "/metrics"  # IAM-authorised on AWS too

    assert [s["problem"] for s in gateway.seen] == [None, None, None]
    assert all(s["headers"]["authorization"].startswith("AWS4-HMAC-SHA256 ") for s in gateway.seen)


def test_the_check_refuses_a_bearer_token_and_a_wrong_secret(gateway: Gateway, monkeypatch) -> None:
    with pytest.raises(AdminError) as refused:
        ClipperConnection(gateway.url, token="local-token", auth="token").ping()
    assert refused.value.status == 403 and gateway.seen[-1]["problem"] == "missing or malformed SigV4 Authorization"

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(AdminError) as wrong:
        ClipperConnection(gateway.url, auth="sigv4", region=REGION).get_all_apps()
    assert wrong.value.status == 403 and gateway.seen[-1]["problem"] == "the signature does not match"


def test_a_body_changed_after_signing_is_refused(gateway: Gateway) -> None:
    sign = SigV4Signer(REGION, Credentials(KEY, SECRET, SESSION))

    def send(body: bytes, then: bytes | None = None) -> int:
        req = urllib.request.Request(f"{gateway.url}/admin/add_app", data=body, method="POST")
        req.add_header("Content-Type", "application/json")
        sign(req)
        if then is not None:
            req.data = then
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return e.code

    assert send(b'{"name": "digits"}') == 200
    assert send(b'{"name": "digits"}', then=b'{"name": "other!"}') == 403
    assert gateway.seen[-1]["problem"] == "the signature does not match"


def test_auto_signs_for_an_execute_api_url_with_its_region(monkeypatch) -> None:
    """No token and an API Gateway address: the client signs by itself, for the region the host names. The
    address reaches the loopback check through it acting as an HTTP proxy (nothing leaves the machine)."""
    server, gw = start_gateway("ap-south-2")
    try:
        monkeypatch.setenv("http_proxy", gw.url)
        monkeypatch.setenv("no_proxy", "")
        monkeypatch.setattr(urllib.request, "_opener", None)  # urlopen's opener reads the proxy settings anew
        conn = ClipperConnection("http://a1b2c3d4e5.execute-api.ap-south-2.amazonaws.com/prod", token="")
        assert conn.get_app_info("digits")["operation"] == "/prod/admin/get_application"
        assert gw.seen[-1]["headers"]["host"] == "a1b2c3d4e5.execute-api.ap-south-2.amazonaws.com"
        assert gw.seen[-1]["problem"] is None
    finally:
        server.shutdown()
        server.server_close()


def test_the_cli_signs_with_the_credential_chain(gateway: Gateway, capsys) -> None:
    assert main(["--url", gateway.url, "--auth", "sigv4", "--region", REGION, "apps"]) == 0
    assert json.loads(capsys.readouterr().out)["operation"] == "/admin/get_all_applications"
    assert gateway.seen[-1]["problem"] is None


def test_the_cli_says_when_there_are_no_credentials_to_sign_with(gateway: Gateway, monkeypatch, capsys) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("CLIPPER_AUTH", "sigv4")
    assert main(["--url", gateway.url, "--region", REGION, "apps"]) == 1
    assert "no AWS credentials" in capsys.readouterr().err
    assert gateway.seen == []  # nothing unsigned was sent
