"""Where the functions' model stacks get their template: infra/model-stack.yaml as packaged with the shared layer
(``TemplateBody``), so a deployment needs no copy of it in S3 and its stacks never use an older one; an https URL
set in CLIPPER_MODEL_STACK_TEMPLATE still wins (``TemplateURL``), and a path is read (the local stack)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clipper.adapters.cloudformation_stacks import PACKAGED_TEMPLATE, TEMPLATE_BODY_LIMIT, build_model_stacks
from clipper.models.serving import ModelArtifact
from clipper.settings import ModelStackSettings

pytestmark = pytest.mark.unit

SOURCE = Path(__file__).resolve().parents[2] / "infra" / "model-stack.yaml"
ARTIFACT = ModelArtifact("s3://b/models/mlp/2/model.onnx", "v2", "c" * 64)


class RecordingCloudFormation:
    """Creates every stack at once and records the CreateStack and UpdateStack requests."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def create_stack(self, **request: Any) -> None:
        self.requests.append(("create", request))

    def update_stack(self, **request: Any) -> None:
        self.requests.append(("update", request))

    def describe_stacks(self, StackName: str) -> dict[str, Any]:
        outputs = [{"OutputKey": "QueueUrl", "OutputValue": "https://q"}]
        parameters = [{"ParameterKey": "InitialInstanceCount", "ParameterValue": "1"}]
        return {"Stacks": [{"StackStatus": "CREATE_COMPLETE", "Outputs": outputs, "Parameters": parameters}]}


def settings(template: str = "") -> ModelStackSettings:
    return ModelStackSettings(
        registry_table="registry", replies_table="replies", service_stack_name="svc", model_stack_template=template
    )


def create_and_scale(template: str = "") -> list[tuple[str, dict[str, Any]]]:
    cfn = RecordingCloudFormation()
    stacks = build_model_stacks(cfn, settings(template))  # type: ignore[arg-type]
    assert stacks is not None
    stacks.create("mlp", "2", ARTIFACT, replicas=1)
    stacks.scale("mlp", "2", replicas=3)
    return cfn.requests


def test_the_packaged_template_is_infra_model_stack_yaml_and_fits_a_template_body():
    # the layer's copy is a link to the source (sam build copies its content): one file, never two to keep in step
    assert PACKAGED_TEMPLATE.read_bytes() == SOURCE.read_bytes()
    assert TEMPLATE_BODY_LIMIT == 51_200  # CloudFormation's limit on TemplateBody
    assert len(SOURCE.read_bytes()) < TEMPLATE_BODY_LIMIT


def test_with_no_template_set_stacks_are_created_and_updated_from_the_packaged_body():
    requests = create_and_scale()

    assert [kind for kind, _ in requests] == ["create", "update"]
    for _, request in requests:
        assert request["TemplateBody"] == SOURCE.read_text(encoding="utf-8") and "TemplateURL" not in request


def test_an_https_url_set_is_given_to_cloudformation_instead():
    url = "https://models.s3.us-east-1.amazonaws.com/templates/model-stack.yaml"

    requests = create_and_scale(url)

    assert [(kind, r["TemplateURL"], "TemplateBody" in r) for kind, r in requests] == [
        ("create", url, False),
        ("update", url, False),
    ]


def test_a_path_set_is_read(tmp_path: Path):
    own = tmp_path / "model-stack.yaml"
    own.write_text("Resources: {}\n", encoding="utf-8")

    requests = create_and_scale(str(own))

    assert [r["TemplateBody"] for _, r in requests] == ["Resources: {}\n"] * 2


def test_a_template_over_the_body_limit_fails_at_start_naming_the_setting(tmp_path: Path):
    big = tmp_path / "model-stack.yaml"
    big.write_text("#" * TEMPLATE_BODY_LIMIT + "\n", encoding="utf-8")

    with pytest.raises(ValueError, match=r"51201 bytes, over .*CLIPPER_MODEL_STACK_TEMPLATE"):
        build_model_stacks(RecordingCloudFormation(), settings(str(big)))  # type: ignore[arg-type]


def test_a_link_checked_out_as_text_fails_at_start_instead_of_at_the_first_upload(tmp_path: Path):
    # git's core.symlinks false (Windows' default) writes the link as a file holding its target: sent as the
    # TemplateBody, every upload's CreateStack failed and the version never registered
    text = tmp_path / "model-stack.yaml"
    text.write_text("../../../infra/model-stack.yaml", encoding="utf-8")

    with pytest.raises(ValueError, match=r"not a CloudFormation template .*make sam-build"):
        build_model_stacks(RecordingCloudFormation(), settings(str(text)))  # type: ignore[arg-type]
    json_template = tmp_path / "model-stack.json"
    json_template.write_text('{"Resources": {}}', encoding="utf-8")
    assert [r["TemplateBody"] for _, r in create_and_scale(str(json_template))] == ['{"Resources": {}}'] * 2
