"""Translation of botocore errors into the project's exception types, by error code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import BotoCoreError, ClientError

from clipper.errors import AccessDenied, ClipperError, Conflict, NotFound, Throttled, Unavailable

_THROTTLING = {
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
    "SlowDown",
}
_NOT_FOUND = {
    "ResourceNotFoundException",
    "NoSuchKey",
    "NoSuchBucket",
    "AWS.SimpleQueueService.NonExistentQueue",
    "QueueDoesNotExist",
}
_ACCESS_DENIED = {"AccessDenied", "AccessDeniedException", "KMS.AccessDeniedException"}
_CONFLICT = {"ConditionalCheckFailedException", "TransactionConflictException"}


def error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def cancellation_codes(e: ClientError) -> list[str]:
    """Why DynamoDB cancelled a transaction (``TransactionCanceledException``): one code per item, in the
    order of the request (``"None"`` for an item that was not the cause); empty for any other error.
    ``ConditionalCheckFailed``: that item's condition was false. ``TransactionConflict``: another request
    was changing that item at the same time (transient: the same transaction may succeed on a retry)."""
    if error_code(e) != "TransactionCanceledException":
        return []
    return [str(r.get("Code") or "None") for r in e.response.get("CancellationReasons", [])]


def translate(e: Exception, what: str) -> ClipperError:
    if isinstance(e, ClientError):
        code = error_code(e)
        if code in _THROTTLING:
            return Throttled(f"{what}: throttled ({code})")
        if code in _CONFLICT:
            return Conflict(f"{what}: {code}")
        if code in _NOT_FOUND:
            return NotFound("resource", f"{what} ({code})")
        if code in _ACCESS_DENIED:
            return AccessDenied(f"{what}: {code}")
        return Unavailable(f"{what}: {code}")
    return Unavailable(f"{what}: {type(e).__name__}")


@contextmanager
def aws_call(what: str) -> Iterator[None]:
    """Run a boto3 call, translating its errors; ``what`` names the operation for the message."""
    try:
        yield
    except (ClientError, BotoCoreError) as e:
        raise translate(e, what) from e
