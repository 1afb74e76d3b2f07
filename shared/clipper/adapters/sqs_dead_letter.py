"""A queue's dead-letter queue, for a consumer that knows a message can never be processed (a message that
does not decode): it moves the message there at once, where the queue's redrive policy would only after
``maxReceiveCount`` receives, each a visibility timeout apart. The dead-letter queue keeps the message for
inspection and for SQS's redrive to its source queue once the cause is fixed."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from clipper.adapters.aws_errors import aws_call

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
else:
    SQSClient = Any

REASON_ATTRIBUTE = "clipper-error"
MAX_REASON_CHARS = 1000


class SqsDeadLetterQueue:
    def __init__(self, client: SQSClient, dlq_url: str) -> None:
        self._client = client
        self.url = dlq_url

    @classmethod
    def of(cls, client: SQSClient, queue_url: str) -> SqsDeadLetterQueue | None:
        """The dead-letter queue the redrive policy of ``queue_url`` names; None when it names none."""
        with aws_call("sqs.GetQueueAttributes(RedrivePolicy)"):
            attributes = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["RedrivePolicy"])
        policy = attributes.get("Attributes", {}).get("RedrivePolicy")
        if not policy:
            return None
        arn = str(json.loads(policy)["deadLetterTargetArn"])  # arn:aws:sqs:<region>:<account>:<name>
        account, name = arn.split(":")[4:6]
        with aws_call("sqs.GetQueueUrl(dead-letter)"):
            url = client.get_queue_url(QueueName=name, QueueOwnerAWSAccountId=account)["QueueUrl"]
        return cls(client, url)

    def send(self, body: str, reason: str) -> None:
        """Put ``body`` in the dead-letter queue, ``reason`` in its ``clipper-error`` attribute."""
        with aws_call("sqs.SendMessage(dead-letter)"):
            self._client.send_message(
                QueueUrl=self.url,
                MessageBody=body,
                MessageAttributes={
                    REASON_ATTRIBUTE: {"DataType": "String", "StringValue": reason[:MAX_REASON_CHARS] or "unknown"}
                },
            )
