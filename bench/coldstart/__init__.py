"""`make bench-coldstart` (``python -m bench.coldstart``): see ``__main__``."""
