"""Translation of botocore errors into the project's exception types, by error code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import BotoCoreError, ClientError

from clipper.errors import ClipperError, Conflict, NotFound, Throttled, Unavailable

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
_CONFLICT = {"ConditionalCheckFailedException", "TransactionConflictException"}


def error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def translate(e: Exception, what: str) -> ClipperError:
    if isinstance(e, ClientError):
        code = error_code(e)
        if code in _THROTTLING:
            return Throttled(f"{what}: throttled ({code})")
        if code in _CONFLICT:
            return Conflict(f"{what}: {code}")
        if code in _NOT_FOUND:
            return NotFound("resource", f"{what} ({code})")
        return Unavailable(f"{what}: {code}")
    return Unavailable(f"{what}: {type(e).__name__}")


@contextmanager
def aws_call(what: str) -> Iterator[None]:
    """Run a boto3 call, translating its errors; ``what`` names the operation for the message."""
    try:
        yield
    except (ClientError, BotoCoreError) as e:
        raise translate(e, what) from e
