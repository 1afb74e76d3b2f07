"""The batcher: one transport-agnostic core (``core``), the batch-size controllers (``controller``) and
the long-poll driver (``longpoll``, with its receive-ahead buffer ``receive_ahead`` and its background
``acker``). The Lambda driver lives in ``functions/batcher``; the long-poll process's entry module is
``clipper.entrypoints.batcher``."""
