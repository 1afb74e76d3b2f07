"""A version deleted and registered again (another upload under its name) is another model for the prediction
cache: its predictions are cached under other keys, so the deleted one's are never answered for it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from clipper.adapters.dynamodb_registry import DynamoDBRegistry
from clipper.core.cache_keys import row_keys
from tests.fakes import model_version

pytestmark = pytest.mark.integration


def test_a_version_registered_again_after_its_delete_has_other_cache_keys(aws, monkeypatch):
    """The keys named (model, version, input) only: for up to the cache's TTL (an hour) the deleted version's
    predictions were answered as the new file's (a review: the key was the same before and after)."""
    registry = DynamoDBRegistry(aws.dynamodb, aws.registry_table)
    registry.put_version(model_version("mlp", "1"), activate=True)
    registry.put_version(model_version("mlp", "2"))
    first = registry.get_version("mlp", "2")
    assert first.created_at > 0 and registry.get_version("mlp", "2") == first  # read again: the same keys
    registry.delete_version("mlp", "2")
    later = time.time() + 5
    monkeypatch.setattr(time, "time", lambda: later)  # uploaded again, a few seconds later
    registry.put_version(model_version("mlp", "2"))
    again = registry.get_version("mlp", "2")
    rows = np.ones((1, 64), dtype=np.float32)
    assert row_keys("mlp", first.cache_version, rows) != row_keys("mlp", again.cache_version, rows)
    assert first.version == again.version == "2"
