"""The management API (Clipper's ``clipper_admin`` operations): one service, served over HTTP under
``/admin/``, and used by the Python client and the ``clipper`` command line."""
