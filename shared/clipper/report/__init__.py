"""The selection report: what the running system learned from live feedback.

``entry`` is one applied feedback joined with the prediction it is about (what the feedback log keeps),
``recorder`` appends entries from the feedback processor without ever failing it, ``figures`` computes the
report from a list of entries (pure), and ``plot`` draws it (matplotlib, imported when called).
"""
