"""Files named on the command line: numpy arrays (``--npy``, ``--sample-npy``) and fitted scikit-learn models
(``deploy model.joblib``). Whatever goes wrong reading one is a single line naming the file (``SystemExit``),
never a traceback."""

from __future__ import annotations

from typing import Any


def load_npy(path: str, option: str) -> Any:
    """An array from a .npy file (no pickled objects: a .npy of numbers)."""
    import numpy as np

    try:
        return np.load(path, allow_pickle=False)
    except Exception as e:  # a missing file, a pickle, a truncated or foreign file: one line
        raise SystemExit(f"clipper: {option}: cannot load {path} as a .npy array: {type(e).__name__}: {e}") from e


def load_estimator(path: str) -> Any:
    """A fitted scikit-learn model from a joblib file (.joblib) or a pickle (.pkl/.pickle)."""
    try:
        if path.endswith(".joblib"):
            import joblib

            return joblib.load(path)
        import pickle

        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception as e:  # unpickling runs arbitrary code: whatever it raises, say it in one line
        raise SystemExit(f"clipper: cannot load {path}: {type(e).__name__}: {e}") from e
