"""The entry points of the long-running processes: each its own small module, the composition root of one process."""
