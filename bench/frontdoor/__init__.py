"""`make bench-frontdoor`: the whole local stack measured at its HTTP front door (see ``__main__``)."""
