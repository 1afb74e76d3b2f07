"""The model endpoint image cannot be built here (no Docker engine), so its Dockerfile is checked against
the code it packages: the files it copies exist, it runs the same entrypoint and module the local stack
runs, and its requirements cover every package the server imports, within the project's own bounds."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.iac

REPO = Path(__file__).resolve().parents[2]
IMAGE = REPO / "model-images" / "onnx-runtime"
# import name -> the package that provides it in the image
PROVIDERS = {"onnxruntime": "onnxruntime-gpu", "numpy": "numpy", "starlette": "starlette", "uvicorn": "uvicorn"}


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (IMAGE / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def pins() -> dict[str, Version]:
    out = {}
    for line in (IMAGE / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{line}: the image pins exact versions"
            out[req.name] = Version(spec.version)
    return out


def test_every_copied_path_exists_in_the_build_context():
    copies = [rest.split() for word, rest in instructions() if word == "COPY"]
    assert copies
    for parts in copies:
        for source in parts[:-1]:
            assert (REPO / source).exists(), f"COPY {source}: not in the repository (the build context)"


def test_entrypoint_runs_the_server_module_and_the_batcher_command():
    entry = [rest for word, rest in instructions() if word == "ENTRYPOINT"]
    assert entry == ['["serve"]']
    serve = (IMAGE / "serve").read_text()
    assert "python -m clipper_endpoint" in serve and (IMAGE / "clipper_endpoint" / "__main__.py").is_file()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "clipper-batcher" in serve and scripts["clipper-batcher"] == "clipper.entrypoints.batcher:main"
    exposed = [rest for word, rest in instructions() if word == "EXPOSE"]
    assert exposed == ["8080"] and "SAGEMAKER_BIND_TO_PORT=8080" in (IMAGE / "Dockerfile").read_text()


def test_requirements_cover_the_servers_imports_within_the_projects_bounds():
    imported = set()
    for path in (IMAGE / "clipper_endpoint").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m in PROVIDERS}
    assert third_party == {"onnxruntime", "numpy", "starlette", "uvicorn"}, imported - set(PROVIDERS)
    pinned = pins()
    for module in third_party:
        assert PROVIDERS[module] in pinned, f"{module} is imported but {PROVIDERS[module]} is not in requirements.txt"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["endpoint"]
    for line in extras:
        req = Requirement(line)
        name = "onnxruntime-gpu" if req.name == "onnxruntime" else req.name
        assert name in pinned, f"{req.name} (endpoint extra) is missing from the image"
        assert req.specifier.contains(pinned[name]), f"{name}=={pinned[name]} is outside {req.specifier}"
