from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clipper.adapters.aws_errors import aws_call

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
else:
    S3Client = Any


class S3ClaimStore:
    """Claim checks in the model bucket: inputs too large for an SQS message."""

    def __init__(self, client: S3Client, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

    def put(self, key: str, data: bytes) -> None:
        with aws_call("s3.PutObject"):
            self._client.put_object(Bucket=self._bucket, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        with aws_call("s3.GetObject"):
            data: bytes = self._client.get_object(Bucket=self._bucket, Key=key)["Body"].read()
        return data
