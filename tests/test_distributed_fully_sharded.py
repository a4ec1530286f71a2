"""FSDP2 through `DistributedConfig(fsdp_size=2)` (transformers' `fully_shard` per block, then the whole model) for
every architecture, on two gloo processes the test starts: three SGD steps equal one process on the union of the
ranks' batches, and the sharded save writes the ordinary checkpoint. Tied embeddings are the case to watch: tied
only after loading, FSDP2 left the output embedding a stale copy after the first step (fixed in pretrained.py)."""

import pytest
from launching import launch

from fivefold.architectures import NAMES

# Gloo processes that each import torch and transformers: an integration test, out of the quick check.
pytestmark = pytest.mark.slow


def test_fsdp2_training_equals_one_process(tmp_path):
    results = launch("fully_sharded", 2, tmp_path, {}, timeout=600)
    for result in results:
        assert set(result) == set(NAMES)
        for name, r in result.items():
            assert r["sharded"] and r["moved"] > 1e-4, (name, r)
            assert len(set(r["tied"])) <= 1, (name, r)  # tied in the sharded model where tied in one process
            assert r["vs_one_process"] <= 1e-5 and r["saved"] == 0.0, (name, r)
