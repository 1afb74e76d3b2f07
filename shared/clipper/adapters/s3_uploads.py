"""``ModelUploads`` over S3: a presigned PUT URL of ``models/<name>/<version>/model.onnx`` in the model bucket,
so a deployer needs the admin API's credentials only (the URL carries the admin function's permission to put
that one key, for a few minutes). The upload's event then reaches the model updater."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clipper.adapters.aws_errors import aws_call
from clipper.errors import Unavailable

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

    def delete_prefix(self, prefix: str) -> int:
        """In a versioned bucket each object gets a delete marker; the bucket's lifecycle removes the versions
        left behind (template.yaml's ExpireDeletedValidatedCopies)."""
        deleted = 0
        paginator = self._client.get_paginator("list_objects_v2")
        with aws_call("s3.ListObjectsV2(validated copies)"):
            pages = list(paginator.paginate(Bucket=self.bucket, Prefix=prefix))
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1,000 keys
            chunk = [{"Key": k} for k in keys[start : start + 1000]]
            with aws_call("s3.DeleteObjects(validated copies)"):
                done = self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})
            if done.get("Errors"):
                first = done["Errors"][0]
                raise Unavailable(
                    f"s3 DeleteObjects: {first.get('Code')} on {first.get('Key')}: {first.get('Message')}"
                )
            deleted += len(chunk)
        return deleted
