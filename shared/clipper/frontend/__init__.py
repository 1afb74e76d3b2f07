"""The query frontend: the query path's core (``query``) and its HTTP face (``api``)."""
