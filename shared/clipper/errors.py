"""The project's exceptions.

Adapters translate SDK and network errors into these types at the boundary (``raise ... from e``), so the
core never inspects botocore error codes or message text.

    ClipperError
    ├── InvalidInput          bad input from a client (HTTP 400); names the field and the expectation
    │   └── PayloadTooLarge   body over the size limit (HTTP 413)
    ├── NotFound              unknown app, model or version (HTTP 404)
    ├── Conflict              a conditional write lost a race, or a duplicate registration (HTTP 409)
    ├── Unavailable           a dependency (queue, table, cache, endpoint) could not be reached
    │   └── Throttled         a dependency asked us to slow down
    ├── EndpointError         the model endpoint answered with an error, or a wrong number of outputs
    │   └── RowTooLarge       one row the endpoint cannot take at all (only its query fails)
    └── MalformedMessage      a queue message that cannot be decoded (poison; goes to the DLQ)
"""

from __future__ import annotations


class ClipperError(Exception):
    """Base class of every error this project raises on purpose."""


class InvalidInput(ClipperError):
    """A client sent input that does not match what the application expects."""

    def __init__(self, field: str, expectation: str, got: str | None = None) -> None:
        self.field = field
        self.expectation = expectation
        self.got = got
        detail = f"{field}: expected {expectation}"
        if got is not None:
            detail += f", got {got}"
        super().__init__(detail)


class PayloadTooLarge(InvalidInput):
    """The request body is larger than the frontend accepts."""


class NotFound(ClipperError):
    """An application, model or version does not exist."""

    def __init__(self, kind: str, name: str, detail: str = "") -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} '{name}' does not exist" + (f" ({detail})" if detail else ""))


class Conflict(ClipperError):
    """A conditional write did not apply (a concurrent writer won, or the item already exists)."""


class ChangedMeanwhile(Conflict):
    """The item was changed by another writer between this change's read and its write: read it again and redo
    the change."""


class Unavailable(ClipperError):
    """A dependency could not be reached or failed."""


class Throttled(Unavailable):
    """A dependency throttled the call."""


class AccessDenied(Unavailable):
    """A dependency refused the call for want of a grant (AWS's AccessDenied): no retry of the call succeeds."""


class EndpointError(ClipperError):
    """The model endpoint failed a batch; every member of the batch fails with it."""


class BatchRefused(EndpointError):
    """The endpoint ran and refused the batch (it answered 400, its input checks, or 500, the model failing on it):
    an input of one query may be the cause, so the batcher sends each query of the batch alone to answer the others.
    Not for an endpoint that cannot be reached, is busy or timed out (those fail every query alike)."""


class RowTooLarge(EndpointError):
    """Row ``index`` of a batch is larger than the endpoint takes in one request (SageMaker's 6 MB): the query
    holding it fails, the rest of the batch is sent without it."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


class MalformedMessage(ClipperError):
    """A queue message that cannot be decoded; retrying will not help."""
