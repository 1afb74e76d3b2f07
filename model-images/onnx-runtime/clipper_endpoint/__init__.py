"""Clipper's model endpoint: an ONNX model behind the SageMaker inference contract.

``GET /ping`` answers 200 once the model is loaded; ``POST /invocations`` takes a batch as ``.npy``
(``application/x-npy``) or JSON (``{"instances": [...]}``) and answers one output row per input row;
``GET /metadata`` describes the model. Run it with ``python -m clipper_endpoint``.

Errors::

    EndpointError            base of this package's errors
    ├── ModelLoadError       the model file is missing or unusable (the server does not start)
    ├── InputError           the request's batch does not fit the model (HTTP 400)
    └── PredictionError      the model failed on a valid batch (HTTP 500)
"""

from __future__ import annotations

from clipper_endpoint.model import (
    EndpointError,
    InputError,
    ModelLoadError,
    OnnxModel,
    PredictionError,
)

__all__ = ["EndpointError", "InputError", "ModelLoadError", "OnnxModel", "PredictionError"]
