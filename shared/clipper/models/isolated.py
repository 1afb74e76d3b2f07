"""Validation of an uploaded model in a child process, its sample run stopped at a time limit.

A model's sample run (``clipper.models.validation``) can take any time: a Loop of a billion trips never ends, one
MatMul of two 20,000-square matrices takes minutes. ONNX Runtime's ``run`` cannot be stopped from another thread
(``RunOptions.terminate`` is read between nodes: a single long node runs to its end), and neither can a session
being loaded. So :class:`SubprocessValidator` runs ``validate_model`` in a child Python process
(``python -m clipper.models.isolated_main``) and kills it at one of two limits:

- ``time_limit_s`` (``CLIPPER_VALIDATION_TIMEOUT_S``) is the sample run's: it runs from the moment the child says
  the model is loaded and checked (its ``sample_run`` answer), so neither the interpreter's start, the file's
  transfer nor the session's creation, nor a child slowed by its niceness before that, counts against it. A model
  stopped there is rejected, the reason naming the limit and how long the run had gone on, after the reasons found
  before the run (a mismatch with a linked application).
- ``load_limit_s``, a generous backstop for all that comes before (start, transfer, loading): a model whose
  loading hangs is rejected too, the reason naming it.

An answer the child wrote before it was killed (a verdict just at the limit, a child hanging at its exit after it
answered) is used. A child that ends without an answer (a crash inside ONNX Runtime) rejects the model, naming how
it ended. One killed by a SIGKILL the validator did not send is most likely the kernel's out-of-memory killer: it
is tried once more in a fresh child (after this process frees what it can; within what the first try left of its
start-and-load backstop, so that one validation's budget is never spent twice), since a shortage can be passing (other
validations beside it locally, garbage of earlier work); killed so again, the model is rejected, the reason saying
it was likely out of memory and naming the memory known (``memory_mb``: the function's). It is rejected rather
than retried by the event source: on Lambda a function's memory is the same at every try, so a redelivery would
die the same way, and a rejection is shown to the user with its reason, where a retried event ends, unexplained,
in the failed-uploads queue (locally it would come back every 2 s for ever); a new upload of the version is
validated again. Only a child that cannot be started raises (``Unavailable``: the upload is retried).

The child reads a JSON line (the linked applications' name, input type and shape: what validation reads of them)
then the model's bytes on its stdin, fed by a thread straight from the caller's buffer (no second copy of the file
in this process: with a 512 MiB model, this process's copy and the child's loading add up). It answers JSON lines
on a channel of its own (a pipe passed as a file descriptor, so what a library prints on stdout cannot be taken for
an answer): ``{"sample_run": ...}`` (the signature and the reasons so far) when the sample run starts, then
``{"result": ...}``. Its stdout and stderr are read on another thread and their end kept for a rejection's reason.
It asks to be killed when the process that started it dies (Linux), so a launcher killed mid-validation leaves no
model running.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from clipper.core.domain import Application, InputType
from clipper.errors import Unavailable
from clipper.models.validation import Signature, TensorSpec, ValidationResult, describe_sample, validate_model

CHILD_MODULE = "clipper.models.isolated_main"
RETRY_LOAD_MIN_S = 10.0  # the least start-and-load time a second try after an out-of-memory kill is given
EXIT_GRACE_S = 5.0  # a child that answered may take this long to exit before it is killed (its answer stands)
CHILD_POLL_S = 0.5  # how often the child's end is looked for, beside its channel's
TAIL_BYTES = 4096  # of the child's stdout and stderr, kept for the reason of a rejection without an answer
_KINDS = frozenset({"sample_run", "result"})


def default_load_limit(time_limit_s: float) -> float:
    """The backstop for the child's start and the model's loading where the caller names none (no function timeout
    to fit in: locally): four times the sample run's limit, two minutes at least."""
    return max(4.0 * time_limit_s, 120.0)


@dataclass
class _Run:
    """How one child ended: its answers by kind, its exit status, and where it was stopped, if it was."""

    answers: dict[str, Any]
    returncode: int
    stopped: str = ""  # "load" or "run": killed at that phase's limit; "" when this process did not kill it
    ran_s: float = 0.0  # how long the phase it was stopped in had gone on
    tail: str = ""  # the end of its stdout and stderr
    load_limit_s: float = 0.0  # the backstop its start and load had
    tries: int = 1  # 2: this is the second child, after the first was killed unasked

    @property
    def killed_unasked(self) -> bool:
        """Killed by a SIGKILL this process did not send: most likely the out-of-memory killer."""
        return not self.stopped and "result" not in self.answers and self.returncode == -signal.SIGKILL


class SubprocessValidator:
    """``ModelValidator`` (``clipper.models.updater``): ``validate_model`` in a child process, its sample run at
    most ``time_limit_s`` seconds, what comes before it at most ``load_limit_s`` (see the module doc)."""

    def __init__(
        self,
        time_limit_s: float,
        load_limit_s: float | None = None,
        python: str = sys.executable,
        memory_mb: int | None = None,
    ) -> None:
        self._limit, self._python, self._memory_mb = time_limit_s, python, memory_mb
        self._load_limit = load_limit_s if load_limit_s is not None else default_load_limit(time_limit_s)
        # the child imports what this process does from where it does (on Lambda: the function's folder and the
        # layer, which the runtime puts on sys.path itself), this package's folder first
        path = [str(Path(__file__).resolve().parents[2]), *(p for p in sys.path if p)]
        self._env = os.environ | {"PYTHONPATH": os.pathsep.join(dict.fromkeys(path))}

    def validate(self, data: bytes, apps: Sequence[Application]) -> ValidationResult:
        started = time.monotonic()
        run = self._run(data, apps, self._load_limit)
        if run.killed_unasked:  # a shortage may be passing: once more, with what this process can free freed
            # within what the first try left of the whole budget (its start and load, then its run): the function's
            # timeout holds one validation, not two (the settings fit one in it)
            left = self._load_limit - (time.monotonic() - started)
            if left >= RETRY_LOAD_MIN_S:
                gc.collect()
                run = self._run(data, apps, left)
                run.tries = 2
        return self._verdict(run, apps)

    def _run(self, data: bytes, apps: Sequence[Application], load_limit_s: float) -> _Run:
        header = json.dumps({"apps": [_app_to_wire(a) for a in apps]}).encode() + b"\n"
        answers_r, answers_w = os.pipe()
        child: subprocess.Popen[bytes] | None = None
        threads: list[threading.Thread] = []
        try:
            try:
                child = subprocess.Popen(
                    [self._python, "-m", CHILD_MODULE, str(os.getpid()), str(answers_w)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    pass_fds=(answers_w,),
                    env=self._env,
                )
            except (OSError, subprocess.SubprocessError) as e:  # no process to be had now (EAGAIN, ENOMEM): the
                raise Unavailable(f"the model's validation process did not start: {e}") from e  # upload is retried
            finally:
                os.close(answers_w)  # the child's copy is the only one left: the channel ends when the child does
            assert child.stdin is not None and child.stdout is not None
            channel = _Answers(answers_r)  # its thread closes the read end from here
            answers_r = -1
            threads.append(channel)
            tail = _Tail(child.stdout)
            threads.append(tail)
            feeder = threading.Thread(
                target=_feed, args=(child.stdin, header, data), name="validation-feed", daemon=True
            )
            feeder.start()
            threads.append(feeder)
            stopped, ran_s = self._await(child, channel, load_limit_s)
        finally:
            if answers_r >= 0:  # a failure before its reader thread took it
                os.close(answers_r)
            if child is not None:
                if child.poll() is None:
                    child.kill()
                child.wait()
            for thread in threads:  # each ends with the child (a pipe's other end closed)
                thread.join(EXIT_GRACE_S)
        return _Run(dict(channel.answers), child.returncode, stopped, ran_s, tail.text(), load_limit_s)

    def _await(self, child: subprocess.Popen[bytes], channel: _Answers, load_limit_s: float) -> tuple[str, float]:
        """Wait for the child's result, or its end, or a limit; returns the phase it was stopped in, if it was, and
        how long that phase had gone on."""
        started = time.monotonic()
        phase, since, deadline = "load", started, started + load_limit_s
        while True:
            channel.wait_for_news(min(deadline, time.monotonic() + CHILD_POLL_S))
            if "result" in channel.answers:  # it answered: it may take a moment to exit, not its limit
                with contextlib.suppress(subprocess.TimeoutExpired):  # then killed by the caller; the answer stands
                    child.wait(EXIT_GRACE_S)
                return "", 0.0
            loaded = channel.times.get("sample_run")
            if phase == "load" and loaded is not None:  # the limit runs from the moment the model was loaded
                phase, since, deadline = "run", loaded, loaded + self._limit
                continue
            if channel.closed:  # it ended (or closed its channel) without a result
                try:
                    child.wait(max(0.0, deadline - time.monotonic()))
                    return "", 0.0
                except subprocess.TimeoutExpired:
                    pass
            elif child.poll() is not None:  # it ended, its channel held open by a process it left behind
                channel.wait_for_news(time.monotonic() + CHILD_POLL_S)  # what it wrote last, still in the pipe
                return "", 0.0
            if time.monotonic() >= deadline:
                child.kill()
                return phase, time.monotonic() - since

    def _verdict(self, run: _Run, apps: Sequence[Application]) -> ValidationResult:
        if "result" in run.answers:  # an answer written before a kill is used too
            return _result_from_wire(run.answers["result"])
        loaded = run.answers.get("sample_run")
        sig = _signature_from_wire(loaded["signature"]) if loaded is not None else None
        if run.stopped == "load":
            why = (
                f"loading the model did not finish within the validation's {run.load_limit_s:g} s for starting "
                f"and loading (the time limit of {self._limit:g} s is its sample run's): stopped after "
                f"{run.ran_s:.1f} s"
            )
            return ValidationResult(False, sig, (why,))
        if run.stopped == "run" and loaded is not None and sig is not None:
            at = f"the validation time limit of {self._limit:g} s: stopped after {run.ran_s:.1f} s"
            why = f"the model's run on {describe_sample(sig, apps)} did not finish within {at}"
            return ValidationResult(False, sig, (*loaded["reasons"], why))
        if run.killed_unasked:
            memory = f" (the function's memory: {self._memory_mb} MB)" if self._memory_mb else ""
            why = (
                "the model's validation process was killed (SIGKILL) without an answer"
                + (", in each of two tries" if run.tries == 2 else " (no time left to try again)")
                + f": most likely out of memory{memory}; upload the version again to try again"
            )
            return ValidationResult(False, sig, (why,))
        how = f"was killed by {_signal_name(-run.returncode)}" if run.returncode < 0 else f"exited {run.returncode}"
        tail = " ".join(run.tail.split()[-40:])
        why = f"the model's validation process {how} without an answer" + (f": {tail}" if tail else "")
        return ValidationResult(False, sig, (why,))


def run_child(stdin: IO[bytes], answers: IO[bytes]) -> None:
    """The child's work: read the applications and the model, validate, answer on ``answers`` (see the module
    doc)."""
    apps = [_app_from_wire(a) for a in json.loads(stdin.readline())["apps"]]
    data = stdin.read()

    def say(line: dict[str, Any]) -> None:
        answers.write(json.dumps(line).encode() + b"\n")
        answers.flush()

    def sample_run(sig: Signature, reasons: Sequence[str]) -> None:
        say({"sample_run": {"signature": _signature_to_wire(sig), "reasons": list(reasons)}})

    result = validate_model(data, apps, sample_run)
    say({"result": _result_to_wire(result)})


# -- the parent's threads --------------------------------------------------------------------------------
def _feed(stdin: IO[bytes], header: bytes, data: bytes) -> None:
    """The header, then the model straight from the caller's buffer; then the end of the file."""
    try:
        stdin.write(header)
        stdin.write(memoryview(data))  # a buffered writer writes a large buffer through, not copied
    except OSError:  # the child ended, or was killed, before it read it all: its end says why
        pass
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


class _Answers(threading.Thread):
    """The child's answers on its channel, read as they come: by kind, and when each came (``time.monotonic``)."""

    def __init__(self, fd: int) -> None:
        super().__init__(name="validation-answers", daemon=True)
        self._fd = fd
        self.answers: dict[str, Any] = {}
        self.times: dict[str, float] = {}
        self.closed = False
        self._changed = threading.Condition()
        self._seen = 0
        self.start()

    def run(self) -> None:
        try:
            with open(self._fd, "rb") as channel:
                for line in channel:
                    found = _answer(line)
                    with self._changed:
                        for kind, value in found.items():
                            self.answers[kind], self.times[kind] = value, time.monotonic()
                        self._changed.notify_all()
        finally:  # at the child's end, or a failure here: the validator does not wait for answers that cannot come
            with self._changed:
                self.closed = True
                self._changed.notify_all()

    def wait_for_news(self, deadline: float) -> None:
        """Until an answer comes that was not seen at the last call, the channel closes, or ``deadline``."""
        with self._changed:
            self._changed.wait_for(
                lambda: len(self.answers) > self._seen or self.closed, timeout=max(0.0, deadline - time.monotonic())
            )
            self._seen = len(self.answers)


class _Tail(threading.Thread):
    """Reads the child's stdout and stderr to their end, keeping the last ``TAIL_BYTES``."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(name="validation-output", daemon=True)
        self._stream, self._kept = stream, bytearray()
        self.start()

    def run(self) -> None:
        with self._stream:
            while chunk := self._stream.read1(65536):  # type: ignore[attr-defined]
                self._kept += chunk
                del self._kept[:-TAIL_BYTES]

    def text(self) -> str:
        return bytes(self._kept).decode(errors="replace")


def _answer(line: bytes) -> dict[str, Any]:
    """The answers of one line on the channel: a JSON object's known kinds; nothing from anything else (a line cut
    by the kill, whatever else got there)."""
    try:
        found = json.loads(line)
    except ValueError:
        return {}
    return {k: v for k, v in found.items() if k in _KINDS} if isinstance(found, dict) else {}


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


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
