"""Every architecture trains under `torchrun --nproc_per_node 2` with Trainer and gradient checkpointing (gloo):
the ranks end with identical weights, equal to a one-process run on the same global batch.
The learning rate is small because the tiny random T5 has large gradients: at lr 1e-2 one process on a batch
and on its two halves drift from 1e-7 to 0.1 apart within three steps; at 1e-3 they stay within 1e-6."""

import json

import pytest
import torch
from launching import WORKERS, torchrun

from fivefold.architectures import NAMES


@pytest.mark.slow  # two torchrun launches
def test_trainer_under_torchrun_equals_one_process(tmp_path):
    for nproc in (2, 1):
        torchrun([str(WORKERS / "trainer.py"), str(tmp_path)], nproc, tmp_path, timeout=600, warmed=True)
        for rank in range(nproc):
            results = json.loads((tmp_path / f"result-{rank}.json").read_text())
            assert set(results) == set(NAMES)
            assert all(r["vs_rank_0"] == 0.0 and r["moved"] > 1e-4 for r in results.values()), results
    two, one = (torch.load(tmp_path / f"trained-{n}.pt") for n in (2, 1))
    for name in NAMES:
        assert two[name].keys() == one[name].keys()
        for key in one[name]:
            assert torch.allclose(two[name][key], one[name][key], atol=1e-5, rtol=0), (name, key)
