"""The plain server the stack is compared with: what a user would write instead of Clipper.

An async FastAPI app, one ONNX Runtime session per model (one intra-op thread), ``POST /<app>/predict`` with
the same JSON body as the stack (``{"input": [...]}``, read by a pydantic model, as FastAPI teaches), one
``session.run`` per request, the label back as JSON. No batching, no cache, no queue. Run with uvicorn (uvloop
and httptools, as installed), no access log, pinned to the system-under-test core:

    FRONTDOOR_PLAIN_MODELS=fd-mlp=build/models/mlp/1/model.onnx,fd-cnn=build/models/cnn/1/model.onnx \\
        taskset -c 0 python -m uvicorn --factory bench.frontdoor.plain_server:create_app --port 8124
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

ENV = "FRONTDOOR_PLAIN_MODELS"


class Query(BaseModel):
    input: list[float]


def _session(path: str) -> tuple[Any, str, tuple[int, ...]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    spec = session.get_inputs()[0]
    shape = tuple(d if isinstance(d, int) else 1 for d in spec.shape)
    return session, spec.name, shape


def build_app(models: dict[str, str]) -> FastAPI:
    app = FastAPI(title="plain FastAPI + ONNX Runtime")
    sessions = {name: _session(path) for name, path in models.items()}

    @app.post("/{app_name}/predict")
    async def predict(app_name: str, query: Query) -> dict[str, Any]:
        if app_name not in sessions:
            raise HTTPException(404, f"no model for {app_name}")
        session, input_name, shape = sessions[app_name]
        x = np.asarray(query.input, dtype=np.float32).reshape(shape)
        label = session.run(None, {input_name: x})[0]
        return {"output": int(label[0]), "default": False}

    return app


def create_app() -> FastAPI:
    """``uvicorn --factory``: the models from ``FRONTDOOR_PLAIN_MODELS`` (``app=path,app=path``)."""
    models = dict(item.split("=", 1) for item in os.environ[ENV].split(",") if item)
    return build_app(models)
