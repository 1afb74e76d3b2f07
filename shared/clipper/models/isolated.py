"""Validation of an uploaded model in a child process, stopped at a time limit.

A model's sample run (``clipper.models.validation``) can take any time: a Loop of a billion trips never ends, one
MatMul of two 20,000-square matrices takes minutes. ONNX Runtime's ``run`` cannot be stopped from another thread
(``RunOptions.terminate`` is read between nodes: a single long node runs to its end), and neither can a session
being loaded. So :class:`SubprocessValidator` runs ``validate_model`` in a child Python process
(``python -m clipper.models.isolated_main``) and kills it when ``time_limit_s`` has passed since it started: the
model is then rejected, the reason naming the limit, how long validation ran and what it was doing (loading the
model, or its sample run), after the reasons found before the run (a mismatch with a linked application). A child
that ends without an answer (a crash inside ONNX Runtime, killed for its memory) rejects the model too, naming how
it ended. Only a child that cannot be started raises (``Unavailable``: the upload is retried).

The child gets a JSON line (the linked applications' name, input type and shape: what validation reads of them)
then the model's bytes on its stdin, and answers JSON lines on its stdout: ``{"sample_run": ...}`` (the signature
and the reasons so far) when the sample run starts, then ``{"result": ...}``. It asks to be killed when the process
that started it dies (Linux), so a launcher killed mid-validation leaves no model running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from clipper.core.domain import Application, InputType
from clipper.errors import Unavailable
from clipper.models.validation import Signature, TensorSpec, ValidationResult, describe_sample, validate_model

CHILD_MODULE = "clipper.models.isolated_main"


class SubprocessValidator:
    """``ModelValidator`` (``clipper.models.updater``): ``validate_model`` in a child process, at most
    ``time_limit_s`` seconds (from the child's start, its interpreter's start-up included)."""

    def __init__(self, time_limit_s: float, python: str = sys.executable) -> None:
        self._limit, self._python = time_limit_s, python
        # the child imports what this process does from where it does (on Lambda: the function's folder and the
        # layer, which the runtime puts on sys.path itself), this package's folder first
        path = [str(Path(__file__).resolve().parents[2]), *(p for p in sys.path if p)]
        self._env = os.environ | {"PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}

    def validate(self, data: bytes, apps: Sequence[Application]) -> ValidationResult:
        header = {"apps": [_app_to_wire(a) for a in apps]}
        started = time.monotonic()
        try:
            child = subprocess.Popen(
                [self._python, "-m", CHILD_MODULE, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
            )
        except OSError as e:  # no process to be had now (EAGAIN, ENOMEM): the upload is tried again
            raise Unavailable(f"the model's validation process did not start: {e}") from e
        try:
            out, err = child.communicate(json.dumps(header).encode() + b"\n" + data, timeout=self._limit)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            return self._stopped(out, apps, time.monotonic() - started)
        lines = _lines(out)
        if "result" in lines:
            return _result_from_wire(lines["result"])
        how = f"was killed by signal {-child.returncode}" if child.returncode < 0 else f"exited {child.returncode}"
        tail = " ".join(err.decode(errors="replace").split()[-40:])
        return ValidationResult(
            False,
            _signature_from_wire(lines["sample_run"]["signature"]) if "sample_run" in lines else None,
            (f"the model's validation process {how} without an answer" + (f": {tail}" if tail else ""),),
        )

    def _stopped(self, out: bytes, apps: Sequence[Application], elapsed: float) -> ValidationResult:
        at = f"the validation time limit of {self._limit:g} s: stopped after {elapsed:.1f} s"
        started = _lines(out).get("sample_run")
        if started is None:
            return ValidationResult(False, None, (f"loading the model did not finish within {at}",))
        sig = _signature_from_wire(started["signature"])
        run = f"the model's run on {describe_sample(sig, apps)} did not finish within {at}"
        return ValidationResult(False, sig, (*started["reasons"], run))


def run_child(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """The child's work: read the applications and the model, validate, answer (see the module doc)."""
    apps = [_app_from_wire(a) for a in json.loads(stdin.readline())["apps"]]
    data = stdin.read()

    def say(line: dict[str, Any]) -> None:
        stdout.write(json.dumps(line).encode() + b"\n")
        stdout.flush()

    def sample_run(sig: Signature, reasons: Sequence[str]) -> None:
        say({"sample_run": {"signature": _signature_to_wire(sig), "reasons": list(reasons)}})

    result = validate_model(data, apps, sample_run)
    say({"result": _result_to_wire(result)})


def _lines(out: bytes) -> dict[str, Any]:
    """The child's answers by kind; a line cut by the kill is left out."""
    found: dict[str, Any] = {}
    for line in out.splitlines():
        try:
            found.update(json.loads(line))
        except ValueError:
            continue
    return found


# -- wire ----------------------------------------------------------------------------------------------
def _app_to_wire(app: Application) -> dict[str, Any]:
    shape = list(app.input_shape) if app.input_shape is not None else None
    return {"name": app.name, "input_type": app.input_type.value, "input_shape": shape}


def _app_from_wire(d: dict[str, Any]) -> Application:
    """What validation reads of an application; the rest (default output, SLO) is not sent."""
    shape = tuple(d["input_shape"]) if d["input_shape"] is not None else None
    return Application(d["name"], InputType(d["input_type"]), "", 1, shape)


def _spec_from_wire(d: dict[str, Any]) -> TensorSpec:
    return TensorSpec(d["name"], d["element_type"], tuple(d["shape"]))


def _signature_to_wire(sig: Signature) -> dict[str, Any]:
    return sig.to_dict() | {"input_count": sig.input_count}


def _signature_from_wire(d: dict[str, Any]) -> Signature:
    outputs = tuple(_spec_from_wire(o) for o in d["outputs"])
    return Signature(_spec_from_wire(d["input"]), outputs, d["input_count"])


def _result_to_wire(r: ValidationResult) -> dict[str, Any]:
    sig = _signature_to_wire(r.signature) if r.signature is not None else None
    return {"ok": r.ok, "signature": sig, "reasons": list(r.reasons)}


def _result_from_wire(d: dict[str, Any]) -> ValidationResult:
    sig = _signature_from_wire(d["signature"]) if d["signature"] is not None else None
    return ValidationResult(d["ok"], sig, tuple(d["reasons"]))
