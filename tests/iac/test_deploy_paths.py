"""`make sam-build` then `sam deploy` (the README's steps) deploy the built packages: the build lands where
`sam deploy` looks for it (SAM's default, .aws-sam/build) and samconfig points it nowhere else. Built into
build/sam, `sam deploy` packaged the unbuilt source template: a layer without its packages, every function failing
to import on AWS (found by a review with `sam package` against moto's S3)."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.iac.conftest import REPO_ROOT

pytestmark = pytest.mark.iac


def test_make_sam_build_builds_where_sam_deploy_looks() -> None:
    recipe = (REPO_ROOT / "Makefile").read_text().split("\nsam-build:", 1)[1].split("\n\n", 1)[0]
    (build_dir,) = re.findall(r"--build-dir (\S+)", recipe)
    assert build_dir == ".aws-sam/build"
    config = tomllib.loads((REPO_ROOT / "samconfig.toml").read_text())
    for env in config.values():
        if isinstance(env, dict):
            for command in env.values():
                assert "template_file" not in command and "build_dir" not in command
