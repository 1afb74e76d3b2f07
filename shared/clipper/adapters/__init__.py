"""Adapters: implementations of the ports over boto3, redis and HTTP. Each takes its client in the
constructor and translates SDK errors into ``clipper.errors`` types."""
