"""The adaptive batching benchmark (``python -m bench.batching``, ``make bench-batching``); see ``__main__``."""
