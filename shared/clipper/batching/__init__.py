"""The batcher: one transport-agnostic core (``core``), the batch-size controllers (``controller``) and
the long-poll driver (``longpoll``). The Lambda driver lives in ``functions/batcher``."""
