"""Validation in a child process stopped at a time limit (clipper.models.isolated): a model whose sample run never
ends (a real ONNX Loop) is rejected at the limit, which runs from the model's loading, the reason naming it; others
get validate_model's answer. Stand-in children (shell or Python scripts passed as the interpreter) play a slow
start, a hung load, a child killed for its memory, one that answers and hangs, one whose libraries print.

Margins are wide (a loaded 2-core machine starts an interpreter and imports ONNX Runtime in seconds): what is
asserted is which limit stopped a child and that it is gone, not how close to the limit it was stopped."""

from __future__ import annotations

import json
import re
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from clipper.errors import Unavailable
from clipper.models.isolated import RETRY_LOAD_MIN_S, SubprocessValidator
from clipper.models.validation import ValidationResult, validate_model
from tests.fakes import digits_app
from tests.slow_models import looping_model

pytestmark = pytest.mark.unit

FAKE_VERDICT = {"result": {"ok": False, "signature": None, "reasons": ["the stand-in's verdict"]}}


@pytest.fixture(scope="module")
def mlp_bytes(demo_models: dict[str, Any]) -> bytes:
    entry = next(m for m in demo_models["models"] if m["name"] == "mlp")
    data: bytes = (Path(demo_models["out_dir"]) / entry["path"]).read_bytes()
    return data


def stand_in(tmp_path: Path, body: str, name: str = "child") -> str:
    """An executable given as the validator's interpreter: it gets ``-m <module> <parent pid> <answers fd>``;
    ``exec "$REAL" "$@"`` in a shell body runs the real child."""
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\nREAL="{sys.executable}"\n{body}\n')
    path.chmod(0o755)
    return str(path)


def python_stand_in(tmp_path: Path, body: str) -> str:
    path = tmp_path / "child.py"
    path.write_text(f"#!{sys.executable}\nimport json, os, sys, time\nanswers = int(sys.argv[4])\n{body}\n")
    path.chmod(0o755)
    return str(path)


def gone(pid_file: Path) -> bool:
    """Whether the process whose id is in the file has ended and been reaped (a zombie keeps its /proc entry)."""
    return not Path(f"/proc/{pid_file.read_text().strip()}").exists()


def stopped_after(reason: str) -> float:
    found = re.search(r"stopped after (\d+\.\d) s", reason)
    assert found is not None, reason
    return float(found[1])


def test_a_model_whose_sample_run_never_ends_is_stopped_at_the_limit_and_rejected_naming_it(tmp_path: Path) -> None:
    pid = tmp_path / "pid"
    child = stand_in(tmp_path, f'echo $$ > {pid}\nexec "$REAL" "$@"')
    started = time.monotonic()

    result = SubprocessValidator(2.0, python=child).validate(looping_model(), [digits_app()])

    assert 2.0 <= time.monotonic() - started < 60.0  # the limit, after the start and the load (seconds when loaded)
    assert not result.ok and len(result.reasons) == 1
    reason = result.reasons[0]
    assert reason.startswith("the model's run on a sample of 2 zero rows, shape [2, 64] float32 did not finish")
    assert "within the validation time limit of 2 s: stopped after " in reason
    assert 2.0 <= stopped_after(reason) < 30.0  # the run's own time, from its start (not the child's)
    # it loaded: its signature is known and recorded with the rejection, as for any other failed sample run
    assert result.signature is not None and result.signature.input.shape == ("N", 64)
    assert gone(pid)  # the child was killed and reaped, not left running the loop


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


def test_the_limit_runs_from_the_models_loading_not_from_the_childs_start(tmp_path: Path, mlp_bytes: bytes) -> None:
    """The limit covered the interpreter's start, the imports, the file's transfer and the session's creation: a
    child slow to start (locally at niceness 19 under query load) had a fast model rejected."""
    slow_start = stand_in(tmp_path, 'sleep 3\nexec "$REAL" "$@"')

    result = SubprocessValidator(2.0, python=slow_start).validate(mlp_bytes, [digits_app()])

    assert result == validate_model(mlp_bytes, [digits_app()]) and result.ok


def test_a_load_that_never_ends_is_stopped_by_the_backstop(tmp_path: Path) -> None:
    pid = tmp_path / "pid"
    hung = stand_in(tmp_path, f"echo $$ > {pid}\nexec sleep 600")
    started = time.monotonic()

    result = SubprocessValidator(30.0, load_limit_s=1.0, python=hung).validate(looping_model(), [digits_app()])

    assert time.monotonic() - started < 30.0  # the backstop, not the sample run's limit (nor the sleep)
    (reason,) = result.reasons
    assert not result.ok and result.signature is None
    assert reason.startswith("loading the model did not finish within the validation's 1 s for starting and loading")
    assert "(the time limit of 30 s is its sample run's)" in reason and 1.0 <= stopped_after(reason) < 30.0
    assert gone(pid)


@pytest.mark.parametrize("end", [b"\n", b""], ids=["answered-then-hung", "answer-read-only-after-the-kill"])
def test_an_answer_written_before_the_child_is_killed_is_used(tmp_path: Path, end: bytes) -> None:
    """On a timeout the child's output was dropped: a verdict at the limit, or a child hung at its exit after it
    answered, was rejected as too slow. Without a line's end the answer is read only once the kill closes the
    channel: the verdict came just as the limit passed."""
    loaded = {"sample_run": {"signature": None, "reasons": []}}
    lines = json.dumps(loaded).encode() + b"\n" + json.dumps(FAKE_VERDICT).encode() + end
    child = python_stand_in(tmp_path, f"os.write(answers, {lines!r})\ntime.sleep(600)")
    started = time.monotonic()

    result = SubprocessValidator(1.0, load_limit_s=1.0, python=child).validate(b"model", [])

    assert result == ValidationResult(False, None, ("the stand-in's verdict",))
    assert time.monotonic() - started < 30.0  # killed: at the limit, or after the grace an answered child gets


def test_what_a_library_prints_is_not_taken_for_an_answer(tmp_path: Path, mlp_bytes: bytes) -> None:
    """The answers came on the child's stdout: a library printing a number there raised TypeError."""
    noisy = stand_in(tmp_path, 'echo 42\necho "[1, 2]"\necho \'{"result": 7}\'\nexec "$REAL" "$@"')

    assert SubprocessValidator(30.0, python=noisy).validate(mlp_bytes, []) == validate_model(mlp_bytes, [])


def test_lines_on_the_channel_that_are_not_answers_are_skipped(tmp_path: Path) -> None:
    junk = b'42\n"text"\n[1]\nnull\n{"other": 1}\nnot json\n' + json.dumps(FAKE_VERDICT).encode() + b"\n"
    child = python_stand_in(tmp_path, f"os.write(answers, {junk!r})")

    assert SubprocessValidator(10.0, python=child).validate(b"model", []).reasons == ("the stand-in's verdict",)


def test_the_model_is_streamed_to_the_child_not_copied(tmp_path: Path) -> None:
    """The header and the file were concatenated: a second full copy of the model in this process while the child
    loaded its own (on Lambda, with a 512 MiB model, past the function's memory)."""
    reader = stand_in(tmp_path, "cat > /dev/null\nexit 3")
    data = bytes(32 * 1024 * 1024)
    tracemalloc.start()
    try:
        result = SubprocessValidator(30.0, python=reader).validate(data, [digits_app()])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert result.reasons == ("the model's validation process exited 3 without an answer",)
    assert peak < len(data) // 4  # pipes' buffers and the threads' own, not a copy of the file


def test_a_child_killed_unasked_is_tried_again_so_a_passing_shortage_rejects_nothing(
    tmp_path: Path, mlp_bytes: bytes
) -> None:
    tried = tmp_path / "tried"
    once = stand_in(tmp_path, f'if [ ! -e {tried} ]; then touch {tried}; kill -9 $$; fi\nexec "$REAL" "$@"')

    assert SubprocessValidator(30.0, python=once).validate(mlp_bytes, []) == validate_model(mlp_bytes, [])


def test_a_child_killed_unasked_twice_rejects_the_model_as_likely_out_of_memory(tmp_path: Path) -> None:
    """The OOM killer's SIGKILL read "was killed by signal 9": nothing said why or what to do."""
    tries = tmp_path / "tries"
    oom = stand_in(tmp_path, f"echo try >> {tries}\nkill -9 $$")

    result = SubprocessValidator(10.0, python=oom, memory_mb=2048).validate(b"model", [])

    assert result == ValidationResult(
        False,
        None,
        (
            "the model's validation process was killed (SIGKILL) without an answer, in each of two tries: most "
            "likely out of memory (the function's memory: 2048 MB); upload the version again to try again",
        ),
    )
    assert tries.read_text().split() == ["try", "try"]


def test_a_second_try_after_an_out_of_memory_kill_fits_in_what_the_first_left(tmp_path: Path) -> None:
    """Each try had its own start-and-load backstop and run limit: a model killed late in its first try had a
    second as long, past the function's timeout (which the settings fit one validation in), and Lambda retried
    the event. The second try gets what the first left of the backstop, and none when that is too little."""
    tries = tmp_path / "tries"
    late = stand_in(tmp_path, f"echo try >> {tries}\nsleep 1\nkill -9 $$")

    result = SubprocessValidator(10.0, load_limit_s=RETRY_LOAD_MIN_S + 0.5, python=late).validate(b"model", [])

    assert tries.read_text().split() == ["try"]  # 1 s of its 10.5 gone: under the 10 a second try needs
    assert result.reasons == (
        "the model's validation process was killed (SIGKILL) without an answer (no time left to try again): most "
        "likely out of memory; upload the version again to try again",
    )


def test_a_child_that_ended_is_seen_though_a_process_it_left_holds_its_channel(tmp_path: Path) -> None:
    """Only the channel's end told the child had ended: a process it left behind (a library's) holding the channel
    made an ended child read as a model still loading, rejected at the backstop for the wrong reason."""
    leaver = stand_in(tmp_path, "sleep 4 &\nexit 3")

    result = SubprocessValidator(10.0, load_limit_s=2.0, python=leaver).validate(b"model", [])

    assert result.reasons == ("the model's validation process exited 3 without an answer",)


def test_a_child_that_ends_without_an_answer_rejects_the_model_saying_how(tmp_path: Path) -> None:
    result = SubprocessValidator(10.0, python="/bin/false").validate(b"any", [])
    assert result == ValidationResult(False, None, ("the model's validation process exited 1 without an answer",))

    crash = stand_in(tmp_path, "echo 'Segmentation fault in MatMul' >&2\nkill -11 $$")
    (reason,) = SubprocessValidator(10.0, python=crash).validate(b"any", []).reasons
    assert reason == (
        "the model's validation process was killed by signal 11 (SIGSEGV) without an answer: "
        "Segmentation fault in MatMul"
    )


def test_a_child_that_cannot_be_started_is_unavailable_so_the_upload_is_retried() -> None:
    with pytest.raises(Unavailable, match="validation process did not start"):
        SubprocessValidator(10.0, python="/nonexistent/python").validate(b"any", [])
