"""The child interpreter that measures one cold start, and the bare baselines it is compared with."""

from __future__ import annotations

import textwrap

CHILD = textwrap.dedent(
    """
    import os, sys, time
    T0 = time.monotonic()
    DIAG = os.environ.get("CS_DIAG") == "1"
    connects = []
    if DIAG:
        def _audit(event, args):
            if event == "socket.connect":
                connects.append(str(args[1])[:120])
        sys.addaudithook(_audit)
    GC = os.environ.get("CS_GC") == "1"
    if GC:  # the what-if: no cyclic GC while the composition root runs, its objects frozen after it
        import gc
        gc.disable()
    sys.path.insert(0, os.environ["CS_DIR"])
    import app
    if GC:
        gc.freeze()
        gc.enable()
    T_READY = time.monotonic()
    CPU_READY = time.process_time()
    import json, threading

    def peak_rss_kb():
        # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over fork + exec, so a child would report
        # at least its parent's peak (this benchmark's own ~100 MB)
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])

    rss_ready = peak_rss_kb()
    mods_ready = set(sys.modules)
    connects_at_import = list(connects)
    with open(os.environ["CS_EVENTS"]) as f:
        events = json.load(f)

    class Context:
        function_name = "coldstart"
        memory_limit_in_mb = 1024
        invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:coldstart"
        aws_request_id = "00000000-0000-0000-0000-000000000000"
        def get_remaining_time_in_millis(self):
            return 30000

    created = []
    bs = sys.modules.get("botocore.session")
    if bs is not None:
        _create = bs.Session.create_client
        def _counting(self, *a, **k):
            created.append(a[0] if a else k.get("service_name"))
            return _create(self, *a, **k)
        bs.Session.create_client = _counting
    executed = set()
    if DIAG:
        def _prof(frame, event, arg):
            if event == "call":
                executed.add(frame.f_code.co_filename)
        sys.setprofile(_prof)
        threading.setprofile(_prof)
    t1 = time.monotonic()
    r1 = app.handler(events[0], Context())
    T_FIRST = time.monotonic()
    CPU_FIRST = time.process_time()
    rss_first = peak_rss_kb()
    t2 = time.monotonic()
    r2 = app.handler(events[1], Context())
    T_WARM = time.monotonic()
    if DIAG:
        sys.setprofile(None)
        threading.setprofile(None)
    out = {
        "t0": T0, "t_ready": T_READY, "t_first": T_FIRST, "cpu_ready": CPU_READY, "cpu_first": CPU_FIRST,
        "first_event_ms": (T_FIRST - t1) * 1000, "warm_event_ms": (T_WARM - t2) * 1000,
        "rss_ready_kb": rss_ready, "rss_first_kb": rss_first, "modules_at_ready": len(mods_ready),
        "clients_created_during_events": created, "responses": [r1, r2],
    }
    if DIAG:
        out["connects_at_import"] = connects_at_import
        out["executed_files"] = sorted(executed)
        out["module_files"] = {n: getattr(m, "__file__", None) for n, m in list(sys.modules.items()) if n in mods_ready}
        out["modules_loaded_by_events"] = sorted(set(sys.modules) - mods_ready)
    with open(os.environ["CS_OUT"], "w") as f:
        json.dump(out, f, default=str)
    """
)

# -- the baselines: the same handler shape on the bare frameworks ------------------------------------------
CLIENTS = {
    "frontend": ("sqs", "dynamodb", "s3"),
    "batcher": ("dynamodb", "s3", "sagemaker-runtime"),
    "feedback": ("dynamodb",),
    "admin": ("dynamodb",),
    "model_updater": ("dynamodb", "s3"),
}
ASGI_BARE = """
import boto3
from fastapi import FastAPI
from mangum import Mangum
{plus_imports}
clients = [boto3.client(s) for s in {clients!r}]
app = FastAPI()

@app.post("/{{name}}/predict")
def predict(name: str) -> dict:
    return {{"query_id": 0, "output": 0, "default": False}}

@app.get("/admin/ping")
def ping() -> dict:
    return {{"status": "pong"}}

@app.post("/admin/{{op}}")
def admin(op: str) -> dict:
    return {{}}

_asgi = Mangum(app, lifespan="off")

{decorator}
def handler(event, context):
    return _asgi(event, context)
"""
SQS_BARE = """
import boto3
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
{plus_imports}
clients = [boto3.client(s) for s in {clients!r}]
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)

def record_handler(record):
    return None

{decorator}
def handler(event, context):
    return process_partial_response(event=event, record_handler=record_handler, processor=processor, context=context)
"""
UPDATER_BARE = """
import os
import boto3
{plus_imports}
clients = [boto3.client(s) for s in {clients!r}]

{decorator}
def handler(event, context):
    import onnxruntime

    with open(os.environ["CS_MODEL_PATH"], "rb") as f:
        onnxruntime.InferenceSession(f.read(), providers=["CPUExecutionProvider"])
    return {{"outcomes": []}}
"""
PLUS_IMPORTS = """
import numpy
from aws_lambda_powertools import Logger
from pydantic_settings import BaseSettings
{extra}
logger = Logger(service="bare")

class Settings(BaseSettings):
    registry_table: str = "x"

settings = Settings()
"""
PLUS_EXTRA = {
    "frontend": "from aws_lambda_powertools.metrics import single_metric",
    "batcher": "import urllib3\nimport pydantic",
    "feedback": "import pydantic",
    "admin": "",
    "model_updater": "import pydantic",
}
BARE_FRAMEWORKS = {
    "frontend": "fastapi, mangum, boto3 (sqs, dynamodb, s3 clients)",
    "batcher": "boto3 (dynamodb, s3, sagemaker-runtime clients), Powertools batch",
    "feedback": "boto3 (dynamodb client), Powertools batch",
    "admin": "fastapi, mangum, boto3 (dynamodb client)",
    "model_updater": "boto3 (dynamodb, s3 clients); the event loads the model in onnxruntime (imported then)",
    "endpoint": "uvicorn, starlette, onnxruntime, numpy (the same model, one thread)",
}
PLUS_LIBRARIES = "bare + Powertools Logger, pydantic-settings, numpy"
BARE_ENDPOINT = """
import io, sys
import numpy as np
import onnxruntime as ort
import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name

async def ping(request):
    return Response(b"")

async def invocations(request):
    x = np.load(io.BytesIO(await request.body()), allow_pickle=False)
    (y,) = session.run([session.get_outputs()[0].name], {name: x})
    buf = io.BytesIO()
    np.save(buf, y)
    return Response(buf.getvalue(), media_type="application/x-npy")

app = Starlette(routes=[Route("/ping", ping), Route("/invocations", invocations, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


def bare_source(function: str, plus: bool) -> str:
    template = {"frontend": ASGI_BARE, "admin": ASGI_BARE, "model_updater": UPDATER_BARE}.get(function, SQS_BARE)
    plus_imports = PLUS_IMPORTS.format(extra=PLUS_EXTRA[function]) if plus else ""
    decorator = "@logger.inject_lambda_context" if plus else ""
    return template.format(plus_imports=plus_imports, clients=CLIENTS[function], decorator=decorator)


# -- small helpers -------------------------------------------------------------------------------------------
