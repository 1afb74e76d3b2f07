"""The pure core: no I/O, no environment reads; clocks and random sources are injected."""
