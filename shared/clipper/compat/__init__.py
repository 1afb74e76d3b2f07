"""Clipper compatibility: the real clipper_admin client against this stack."""
