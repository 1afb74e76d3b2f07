"""What a prediction costs on AWS (``clipper cost``, ``make bench-cost``)."""
