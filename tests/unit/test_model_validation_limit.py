"""Validation in a child process stopped at a time limit (clipper.models.isolated): a model whose sample run never
ends (a real ONNX Loop) is rejected within the limit, the reason naming it; others get validate_model's answer."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from clipper.errors import Unavailable
from clipper.models.isolated import SubprocessValidator
from clipper.models.validation import validate_model
from tests.fakes import digits_app
from tests.slow_models import looping_model

pytestmark = pytest.mark.unit


def children() -> set[int]:
    """The processes this one started that are still there (zombies included)."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        found.update(int(p) for p in (task / "children").read_text().split())
    return found


@pytest.fixture(scope="module")
def mlp_bytes(demo_models: dict[str, Any]) -> bytes:
    entry = next(m for m in demo_models["models"] if m["name"] == "mlp")
    data: bytes = (Path(demo_models["out_dir"]) / entry["path"]).read_bytes()
    return data


def test_a_model_whose_sample_run_never_ends_is_stopped_at_the_limit_and_rejected_naming_it() -> None:
    before = children()
    started = time.monotonic()

    result = SubprocessValidator(2.0).validate(looping_model(), [digits_app()])

    took = time.monotonic() - started
    assert 2.0 <= took < 4.0  # the limit, and the kill and the reaping of the child after it
    assert not result.ok and len(result.reasons) == 1
    reason = result.reasons[0]
    assert reason.startswith("the model's run on a sample of 2 zero rows, shape [2, 64] float32 did not finish")
    assert "within the validation time limit of 2 s: stopped after 2." in reason
    # it loaded: its signature is known and recorded with the rejection, as for any other failed sample run
    assert result.signature is not None and result.signature.input.shape == ("N", 64)
    assert children() == before  # the child was killed and reaped, not left running the loop


def test_reasons_found_before_the_sample_run_are_kept_beside_the_limit() -> None:
    narrow = digits_app(name="narrow", input_shape=(32,))

    result = SubprocessValidator(2.0).validate(looping_model(), [narrow])

    assert len(result.reasons) == 2
    assert "application 'narrow' has input shape [32]" in result.reasons[0]
    assert "shape [2, 64] float32 did not finish within the validation time limit of 2 s" in result.reasons[1]


def test_a_model_that_finishes_in_time_gets_validate_models_own_answer(mlp_bytes: bytes) -> None:
    wide = digits_app(name="wide", input_shape=(128,))
    for data, apps in ((mlp_bytes, [digits_app()]), (mlp_bytes, [wide]), (looping_model(1000), []), (b"junk", [])):
        assert SubprocessValidator(30.0).validate(data, apps) == validate_model(data, apps)


def test_a_child_that_ends_without_an_answer_rejects_the_model_saying_how() -> None:
    result = SubprocessValidator(10.0, python="/bin/false").validate(b"any", [])

    assert result == type(result)(False, None, ("the model's validation process exited 1 without an answer",))


def test_a_child_that_cannot_be_started_is_unavailable_so_the_upload_is_retried() -> None:
    with pytest.raises(Unavailable, match="validation process did not start"):
        SubprocessValidator(10.0, python="/nonexistent/python").validate(b"any", [])
