"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Processes the tests start import this checkout's package (a git worktree's, not the editable install's).
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(REPO_ROOT / "shared"), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
)
DEMO_MODELS_DIR = REPO_ROOT / "build" / "models"


@pytest.fixture(scope="session")
def demo_models() -> dict[str, Any]:
    """The demo models' manifest (``infra/demo/train_models.py``), built into ``build/models`` when missing.

    Model paths in it are relative to ``demo_models["out_dir"]``; the held-out set is
    ``demo_models["dataset"]["holdout"]`` there.
    """
    from infra.demo.train_models import ensure_models

    return ensure_models(DEMO_MODELS_DIR, log=lambda line: None)
