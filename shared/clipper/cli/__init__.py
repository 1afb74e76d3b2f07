"""``clipper``: the management API, queries and the local stack from the command line.

export CLIPPER_URL=http://127.0.0.1:8080 CLIPPER_ADMIN_TOKEN=...    # make run prints both
clipper apps
clipper register-app sentiment strings "neutral" 100000
clipper deploy mlp 2 build/models/mlp.onnx          # check, upload, wait for the updater, make it active
clipper predict digits --input '[0, 0, 5, ...]'     # a query, as the app's input type wants it
clipper inspect                                     # apps, models, versions, links, processes: a table
clipper logs batcher-mlp -n 50                      # the local stack's process logs
"""

from clipper.cli.main import main
from clipper.cli.tables import metrics_table

__all__ = ["main", "metrics_table"]
