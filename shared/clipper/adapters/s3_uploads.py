"""``ModelUploads`` over S3: a presigned PUT URL of ``models/<name>/<version>/model.onnx`` in the model bucket,
so a deployer needs the admin API's credentials only (the URL carries the admin function's permission to put
that one key, for a few minutes). The upload's event then reaches the model updater."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clipper.adapters.aws_errors import aws_call

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
else:
    S3Client = Any


class S3ModelUploads:
    def __init__(self, client: S3Client, bucket: str) -> None:
        self._client = client
        self.bucket = bucket

    def upload_url(self, key: str, expires_s: int, metadata: dict[str, str] | None = None) -> str:
        """``metadata`` is signed into the URL: the PUT must send each as an ``x-amz-meta-<key>`` header."""
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if metadata:
            params["Metadata"] = metadata
        with aws_call("s3.PresignPutObject(model)"):
            url: str = self._client.generate_presigned_url("put_object", Params=params, ExpiresIn=expires_s)
        return url
