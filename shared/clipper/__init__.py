"""Clipper on AWS serverless: the shared package (domain, policies, batching, ports, adapters)."""
