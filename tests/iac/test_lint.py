"""cfn-lint finds no error and no warning in either template."""

from __future__ import annotations

from pathlib import Path

import pytest
from cfnlint.api import lint_file

from tests.iac.conftest import MODEL_TEMPLATE, SERVICE_TEMPLATE

pytestmark = pytest.mark.iac


@pytest.mark.parametrize("template", [SERVICE_TEMPLATE, MODEL_TEMPLATE], ids=lambda p: p.name)
def test_template_is_lint_clean(template: Path) -> None:
    matches = lint_file(template)

    assert [f"{m.rule.id} {m.linenumber}: {m.message}" for m in matches] == []
