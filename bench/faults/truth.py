"""The model's own answer to each steady-load query: the suite's apps answer from the demo MLP (``digits`` from
its server, ``faults`` from the same server behind the fault proxy), so every real answer must be the label the
MLP gives that query's input. One that is not is a wrong answer: another query's output, a reply mixed up under
a fault. The reference runs the same ``model.onnx`` in ONNX Runtime here, all inputs in one batch.

A different label is counted wrong only where the reference is sure of it: the top two probabilities more than
``MARGIN`` apart (a batch of other rows may round the last bits of a near-tie differently on the server)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from bench.faults.load import Outcome

MARGIN = 1e-3


class Reference:
    """Labels and margins of the MLP for any rows (``model_path``: the demo MLP's model.onnx)."""

    def __init__(self, model_path: Path) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self._session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name

    def labels(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The label of each row and the gap between its two most probable classes."""
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        label, proba = self._session.run(["label", "probabilities"], {self._input: rows.astype(np.float32)})
        top2 = np.sort(np.asarray(proba), axis=1)[:, -2:]
        return np.asarray(label), top2[:, 1] - top2[:, 0]


def wrong_answers(
    outcomes: Iterable[Outcome],
    row_of: Callable[[int], np.ndarray],
    labels: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
) -> list[Outcome]:
    """The real answers of steady-load queries whose output is not the model's answer to their input."""
    real = [o for o in outcomes if o.kind == "real" and o.serial >= 0]
    if not real:
        return []
    expected, margin = labels(np.stack([row_of(o.serial) for o in real]))
    return [
        o
        for o, want, gap in zip(real, expected, margin, strict=True)
        if not _same(o.output, int(want)) and gap > MARGIN
    ]


def _same(output: object, label: int) -> bool:
    return isinstance(output, int | float) and not isinstance(output, bool) and output == label
