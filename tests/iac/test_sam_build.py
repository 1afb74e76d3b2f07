"""`sam build` (aws-sam-cli from PyPI, no container) builds every function and the layer, each deployment
package stays within Lambda's size limits, and the layer's SDK is one consistent boto3/botocore set.

aws-sam-cli lives in its own virtualenv (.venv-sam, `make sam-venv`): it pins boto3 and click below what moto
and the dev tools use. The test creates it when missing, and is skipped only when it cannot be installed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from infra import sam_package_sizes as sizes
from infra.local import cfn
from tests.iac.conftest import MODEL_TEMPLATE, REPO_ROOT, SERVICE_TEMPLATE

pytestmark = pytest.mark.iac

SAM = REPO_ROOT / ".venv-sam" / "bin" / "sam"


@pytest.fixture(scope="module")
def sam() -> Path:
    if not SAM.exists():
        install = subprocess.run(
            ["make", "sam-venv"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, check=False
        )
        if install.returncode != 0 or not SAM.exists():
            pytest.skip(f"aws-sam-cli could not be installed: {(install.stdout + install.stderr)[-2000:]}")
    return SAM


@pytest.fixture(scope="module")
def build_dir(sam: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sam") / "build"
    sizes.sam_build(sam, out, None, cached=False)  # no cache shared with `make sam-build` or another run
    return out


@pytest.fixture(scope="module")
def packages(build_dir: Path) -> dict[str, sizes.Package]:
    return {p.name: p for p in sizes.packages(build_dir)}


def test_every_function_and_the_layer_is_built(build_dir: Path, packages: dict[str, sizes.Package]) -> None:
    declared = cfn.load_template(SERVICE_TEMPLATE)["Resources"]
    functions = {k for k, r in declared.items() if r["Type"] == "AWS::Serverless::Function"}
    layers = {k for k, r in declared.items() if r["Type"] == "AWS::Serverless::LayerVersion"}

    assert {n for n, p in packages.items() if p.kind == "function"} == functions
    assert {n for n, p in packages.items() if p.kind == "layer"} == layers == {"SharedLayer"}
    for function in functions:
        assert (build_dir / function / "app.py").is_file(), function
        assert packages[function].layers == ("SharedLayer",), function
    layer = build_dir / "SharedLayer" / "python"
    for module in ("clipper/wiring.py", "aws_lambda_powertools", "aws_xray_sdk", "pydantic", "fastapi", "orjson"):
        assert (layer / module).exists(), module
    assert (build_dir / "ModelUpdaterFunction" / "onnxruntime").is_dir()


def test_the_layer_carries_the_model_stack_template_the_functions_use(build_dir: Path) -> None:
    # the functions create and update the model stacks from this file (TemplateBody): the link in shared/ to
    # infra/model-stack.yaml becomes a file with its content, so `sam build && sam deploy` is all a deployment needs
    packaged = build_dir / "SharedLayer" / "python" / "clipper" / "adapters" / "model-stack.yaml"

    assert packaged.is_file() and not packaged.is_symlink()
    assert packaged.read_bytes() == MODEL_TEMPLATE.read_bytes()


def test_each_package_is_within_lambda_limits(packages: dict[str, sizes.Package], tmp_path: Path) -> None:
    report = sizes.report(list(packages.values()))
    (tmp_path / "sizes.json").write_text(json.dumps(report))
    print("\n" + sizes.table(list(packages.values())))  # the figures, with -s

    for package in packages.values():
        assert package.zipped <= sizes.ZIPPED_LIMIT, package
        total = package.with_layers_unzipped if package.kind == "function" else package.unzipped
        assert total <= sizes.UNZIPPED_LIMIT, package
    assert all(p["within_limits"] for p in report["packages"])


def test_a_package_over_a_limit_is_reported() -> None:
    big = sizes.Package("Fn", "function", zipped=1, unzipped=200 << 20, files=1, with_layers_unzipped=260 << 20)
    zipped = sizes.Package("Layer", "layer", zipped=51 << 20, unzipped=60 << 20, files=1)

    assert not big.within_limits and not zipped.within_limits
    assert "OVER" in sizes.table([big, zipped])


def dist_version(site: Path, name: str) -> tuple[Version, Path] | None:
    found = sorted(site.glob(f"{name}-*.dist-info"))
    if not found:
        return None
    (info,) = found
    return Version(info.name.removeprefix(f"{name}-").removesuffix(".dist-info")), info


def test_layer_sdk_is_one_consistent_set(build_dir: Path) -> None:
    # aws-xray-sdk (Powertools' tracer) pulls botocore into the layer, ahead of the runtime's on sys.path; a
    # botocore without its matching boto3 would pair the runtime's boto3 with it. shared/requirements.txt
    # therefore ships boto3 too, and pip must have chosen the botocore that boto3 requires.
    site = build_dir / "SharedLayer" / "python"
    botocore = dist_version(site, "botocore")
    boto3 = dist_version(site, "boto3")

    assert botocore is not None and boto3 is not None
    metadata = (boto3[1] / "METADATA").read_text()
    requires = [
        Requirement(line.split(":", 1)[1].strip())
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    (pin,) = [r for r in requires if r.name == "botocore" and r.marker is None]  # not the [crt] extra's
    assert pin.specifier.contains(botocore[0]), (pin, botocore[0])


def test_sizes_script_writes_its_report(build_dir: Path, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "sam-sizes.json"

    code = sizes.main(["--no-build", "--build-dir", str(build_dir), "--out", str(out)])

    assert code == 0
    written = json.loads(out.read_text())
    assert {p["name"] for p in written["packages"]} >= {"SharedLayer", "FrontendFunction", "ModelUpdaterFunction"}
    assert "ModelUpdaterFunction" in capsys.readouterr().out
