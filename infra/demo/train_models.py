"""Build the demo models: four scikit-learn model families on the bundled digits dataset, as ONNX.

Everything is deterministic (fixed split, fixed seeds) and offline (``load_digits`` ships with scikit-learn).
The result, under ``--out`` (default ``build/models``)::

    <out>/<name>/1/model.onnx      float32 input ``input`` [N, 64]; outputs ``label`` int64 [N] and
                                   ``probabilities`` float32 [N, 10]
    <out>/manifest.json            one entry per model (paths relative to <out>), held-out accuracy
    <out>/digits_holdout.npz       the held-out set: X float32 [N, 64], y int64 [N]

The families differ clearly in accuracy, so that model selection has something to learn: ``mlp``, ``logreg``
and ``forest`` are strong, ``tree`` (a depth-4 decision tree) is deliberately weak. The held-out accuracy is
measured with ONNX Runtime and checked against scikit-learn's own predictions.

Run ``python infra/demo/train_models.py [--out DIR] [--force]``; without ``--force`` it returns at once when
the files exist and were made by this recipe. Tests and the local stack call :func:`ensure_models`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

VERSION = "1"
INPUT_NAME = "input"
N_FEATURES = 64
N_CLASSES = 10
TEST_SIZE = 0.3
SPLIT_SEED = 0
MODEL_SEED = 0
# ONNX opsets pinned low so that any ONNX Runtime from 1.12 on (the GPU image pins its own) loads the models.
TARGET_OPSET = {"": 15, "ai.onnx.ml": 3}
# Most predictions that ONNX Runtime (float32) may disagree with scikit-learn (float64) on, per model.
MAX_MISMATCH_FRACTION = 0.002
MANIFEST = "manifest.json"
HOLDOUT = "digits_holdout.npz"
# Change this when the recipe changes, so that existing builds are redone.
RECIPE_REVISION = 2
# A build made with other versions of these is redone.
LIBRARIES = ("scikit-learn", "skl2onnx", "onnx", "onnxruntime", "numpy")


@dataclass(frozen=True)
class ModelSpec:
    """One demo model: its name, a short description and a factory for the unfitted estimator."""

    name: str
    family: str
    params: dict[str, Any]

    def build(self) -> Any:
        from sklearn.ensemble import RandomForestClassifier
        from sklearn.linear_model import LogisticRegression
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
        from sklearn.tree import DecisionTreeClassifier

        if self.family == "logistic_regression":
            return make_pipeline(StandardScaler(), LogisticRegression(**self.params))
        if self.family == "mlp":
            return make_pipeline(StandardScaler(), MLPClassifier(**self.params))
        if self.family == "random_forest":
            return RandomForestClassifier(**self.params)
        if self.family == "decision_tree":
            return DecisionTreeClassifier(**self.params)
        raise ValueError(f"unknown model family {self.family!r}")


SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("logreg", "logistic_regression", {"C": 0.1, "max_iter": 2000, "random_state": MODEL_SEED}),
    ModelSpec(
        "mlp",
        "mlp",
        {"hidden_layer_sizes": (256, 256), "max_iter": 300, "random_state": MODEL_SEED},
    ),
    ModelSpec("forest", "random_forest", {"n_estimators": 100, "random_state": MODEL_SEED, "n_jobs": 1}),
    ModelSpec("tree", "decision_tree", {"max_depth": 4, "random_state": MODEL_SEED}),
)


def recipe_fingerprint() -> str:
    """A short hash of everything that decides the models' content (not of the library versions)."""
    text = repr(
        (RECIPE_REVISION, VERSION, TEST_SIZE, SPLIT_SEED, TARGET_OPSET, [(s.name, s.family, s.params) for s in SPECS])
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The fixed train/held-out split of the digits dataset: X float32 [N, 64], y int64 [N]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=TEST_SIZE, random_state=SPLIT_SEED, stratify=y)
    return x_train, x_test, y_train, y_test


def to_onnx(model: Any, name: str) -> bytes:
    """Convert a fitted classifier to ONNX: input ``input`` float32 [None, 64], outputs label, probabilities.

    The graph is named after the model (skl2onnx would pick a random name), so the bytes are reproducible.
    """
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    onx = convert_sklearn(
        model,
        initial_types=[(INPUT_NAME, FloatTensorType([None, N_FEATURES]))],
        options={"zipmap": False},
        target_opset=TARGET_OPSET,
        name=f"clipper_demo_{name}",
    )
    names = [o.name for o in onx.graph.output]
    if names != ["label", "probabilities"]:
        raise RuntimeError(f"unexpected ONNX outputs {names}, expected ['label', 'probabilities']")
    return bytes(onx.SerializeToString())


def onnx_predict(model_bytes: bytes, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels and probabilities from ONNX Runtime (CPU, one thread) for float32 rows ``x``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
    label, proba = session.run(None, {INPUT_NAME: x})
    return np.asarray(label), np.asarray(proba)


def train_one(
    spec: ModelSpec, split: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
) -> tuple[bytes, dict[str, Any]]:
    """Fit, convert and evaluate one model; return the ONNX bytes and its manifest entry (without path).

    BLAS and OpenMP run on one thread: the result then does not depend on the machine's core count, and
    training stays fast on a busy machine (spinning BLAS threads collapse under oversubscription).
    """
    from threadpoolctl import threadpool_limits

    x_train, x_test, y_train, y_test = split
    started = time.perf_counter()
    model = spec.build()
    with threadpool_limits(limits=1):
        model.fit(x_train, y_train)
    fit_s = time.perf_counter() - started
    model_bytes = to_onnx(model, spec.name)

    label, proba = onnx_predict(model_bytes, x_test)
    if label.shape != y_test.shape or proba.shape != (len(y_test), N_CLASSES):
        raise RuntimeError(f"{spec.name}: ONNX output shapes {label.shape}, {proba.shape} are wrong")
    sk_label = model.predict(x_test)
    mismatches = int(np.count_nonzero(label != sk_label))
    if mismatches > MAX_MISMATCH_FRACTION * len(y_test):
        raise RuntimeError(
            f"{spec.name}: ONNX Runtime disagrees with scikit-learn on {mismatches} of {len(y_test)} rows"
        )
    entry = {
        "name": spec.name,
        "version": VERSION,
        "family": spec.family,
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in spec.params.items()},
        "input": {"name": INPUT_NAME, "dtype": "float32", "shape": [None, N_FEATURES]},
        "outputs": [
            {"name": "label", "dtype": "int64", "shape": [None]},
            {"name": "probabilities", "dtype": "float32", "shape": [None, N_CLASSES]},
        ],
        "accuracy": round(float(np.mean(label == y_test)), 6),
        "sklearn_accuracy": round(float(np.mean(sk_label == y_test)), 6),
        "onnx_sklearn_mismatches": mismatches,
        "sha256": hashlib.sha256(model_bytes).hexdigest(),
        "fit_seconds": round(fit_s, 3),
    }
    return model_bytes, entry


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, so a reader never sees half a model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def model_relpath(name: str, version: str = VERSION) -> str:
    return f"{name}/{version}/model.onnx"


def read_manifest(out_dir: Path) -> dict[str, Any] | None:
    """The manifest under ``out_dir`` when it and every file it names exist and match this recipe and the
    installed libraries; else None."""
    try:
        manifest: dict[str, Any] = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("recipe") != recipe_fingerprint() or manifest.get("versions") != library_versions():
        return None
    if not (out_dir / HOLDOUT).is_file():
        return None
    names = [m.get("name") for m in manifest.get("models", [])]
    if names != [s.name for s in SPECS]:
        return None
    if not all((out_dir / m["path"]).is_file() for m in manifest["models"]):
        return None
    return manifest


def build_models(out_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train, convert, evaluate and write every demo model, the held-out set and the manifest."""
    split = load_split()
    x_train, x_test, _, y_test = split
    log(f"digits: {len(x_train)} training rows, {len(x_test)} held-out rows, {N_FEATURES} features")
    buf = _npz_bytes(X=x_test, y=y_test)
    write_atomic(out_dir / HOLDOUT, buf)

    entries = []
    for spec in SPECS:
        started = time.perf_counter()
        model_bytes, entry = train_one(spec, split)
        entry["path"] = model_relpath(spec.name)
        write_atomic(out_dir / entry["path"], model_bytes)
        entries.append(entry)
        log(
            f"{spec.name:>7}: held-out accuracy {entry['accuracy']:.4f} "
            f"(scikit-learn {entry['sklearn_accuracy']:.4f}), {len(model_bytes)} bytes, "
            f"{time.perf_counter() - started:.2f} s"
        )
    manifest = {
        "recipe": recipe_fingerprint(),
        "dataset": {
            "name": "sklearn.datasets.load_digits",
            "test_size": TEST_SIZE,
            "random_state": SPLIT_SEED,
            "train_rows": len(x_train),
            "holdout_rows": len(x_test),
            "holdout": HOLDOUT,
        },
        "versions": library_versions(),
        "models": entries,
    }
    write_atomic(out_dir / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest


def _npz_bytes(**arrays: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def library_versions() -> dict[str, str]:
    """The versions of the libraries that shape the models' bytes (read without importing them)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = "absent"
    return versions


def ensure_models(
    out_dir: str | os.PathLike[str] = "build/models", force: bool = False, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Build the demo models under ``out_dir`` unless they are up to date; return the manifest.

    The returned dict is the manifest as written, plus ``out_dir`` (the folder, as given) which is not
    written to the file. Model paths in the manifest are relative to that folder.
    """
    out = Path(out_dir)
    manifest = None if force else read_manifest(out)
    if manifest is not None:
        log(f"demo models in {out} are up to date ({len(manifest['models'])} models)")
    else:
        started = time.perf_counter()
        log(f"building demo models in {out}")
        manifest = build_models(out, log)
        log(f"built {len(manifest['models'])} demo models in {time.perf_counter() - started:.1f} s")
    return {**manifest, "out_dir": str(out)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="build/models", help="output folder (default: build/models)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the files are up to date")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, flush=True)

    ensure_models(args.out, force=args.force, log=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
