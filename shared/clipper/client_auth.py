"""How the client and the CLI authenticate to the management API: the admin token on the local stack, AWS SigV4 on
a deployed one (API Gateway authorises ``/admin/...`` and ``/metrics`` with IAM: ``template.yaml``).

``CLIPPER_AUTH`` (``--auth``, ``ClipperConnection(auth=...)``) chooses:

- ``token``: ``Authorization: Bearer <CLIPPER_ADMIN_TOKEN>`` (the local stack's admin API checks it);
- ``sigv4``: every admin request is signed with botocore's ``SigV4Auth`` for the ``execute-api`` service, with
  the usual credential chain (``AWS_PROFILE`` / ``AWS_ACCESS_KEY_ID``..., SSO, container and instance roles;
  refreshed by botocore when they expire);
- ``auto`` (the default): ``sigv4`` when no admin token is given and the URL is an API Gateway host
  (``<api-id>.execute-api.<region>.amazonaws.com``), ``token`` otherwise.

The region is ``CLIPPER_REGION`` (``--region``), else the one in an execute-api host, else the credential
chain's (``AWS_REGION``, the profile's). A custom domain in front of the API: ``CLIPPER_AUTH=sigv4`` and the
region. Queries (``/<app>/predict``, ``/<app>/update``) are never signed: they are open, or JWT-authorised.
"""

from __future__ import annotations

import re
import urllib.parse
import urllib.request
from typing import Any, Literal

from clipper.errors import ClipperError

AuthMode = Literal["auto", "token", "sigv4"]
AUTH_MODES: tuple[str, ...] = ("auto", "token", "sigv4")
SERVICE = "execute-api"
_EXECUTE_API = re.compile(r"^[a-z0-9]+\.execute-api\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$")


class SigningError(ClipperError):
    """A request could not be signed: no credentials in the chain, or no region."""


def region_of(url: str) -> str | None:
    """The region of an API Gateway address (``https://<id>.execute-api.<region>.amazonaws.com/...``), else None."""
    host = urllib.parse.urlsplit(url).hostname or ""
    match = _EXECUTE_API.match(host.lower())
    return match.group(1) if match else None


def resolve_mode(mode: str, url: str, token: str) -> Literal["token", "sigv4"]:
    """What ``mode`` means for this URL and token (``auto``: SigV4 for an execute-api host when no token is given)."""
    if mode not in AUTH_MODES:
        raise SigningError(f"CLIPPER_AUTH: one of {', '.join(AUTH_MODES)} expected, got {mode!r}")
    if mode == "auto":
        return "sigv4" if not token and region_of(url) is not None else "token"
    return "sigv4" if mode == "sigv4" else "token"


class SigV4Signer:
    """Signs a ``urllib.request.Request`` in place (``Authorization``, ``X-Amz-Date``, ``X-Amz-Security-Token``)
    as API Gateway checks it: method, path, query, the headers set so far and the body's SHA-256. Sign last:
    a header or body changed afterwards fails the check. ``credentials`` is botocore's (refreshable) object; by
    default the chain's, read on the first request."""

    def __init__(self, region: str | None = None, credentials: Any = None, service: str = SERVICE) -> None:
        self._region = region
        self._credentials = credentials
        self._service = service

    def _resolve(self) -> tuple[Any, str]:
        if self._credentials is None or self._region is None:
            import boto3

            session = boto3.Session()
            if self._credentials is None:
                self._credentials = session.get_credentials()
                if self._credentials is None:
                    raise SigningError(
                        "no AWS credentials to sign the admin request with (SigV4): set AWS_PROFILE, or "
                        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give an admin token for a local stack"
                    )
            self._region = self._region or session.region_name
            if not self._region:
                raise SigningError("no AWS region to sign the admin request for (SigV4): set CLIPPER_REGION")
        return self._credentials, self._region

    def __call__(self, req: urllib.request.Request) -> None:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        credentials, region = self._resolve()
        req.remove_header("Authorization")  # a bearer token has no place beside the signature
        aws = AWSRequest(
            method=req.get_method(), url=req.full_url, data=req.data or b"", headers=dict(req.header_items())
        )
        SigV4Auth(credentials.get_frozen_credentials(), self._service, region).add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            value = aws.headers.get(name)
            if value is not None:
                req.add_header(name, value)


def signer_for(url: str, token: str, mode: str, region: str | None) -> SigV4Signer | None:
    """The signer ``mode`` asks for at ``url`` (None: send the token). ``region``: given, else the URL's, else the
    credential chain's."""
    if resolve_mode(mode, url, token) == "token":
        return None
    return SigV4Signer(region or region_of(url))
