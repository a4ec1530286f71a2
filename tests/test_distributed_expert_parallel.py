"""Expert parallelism through `from_pretrained(..., distributed_config=DistributedConfig(ep_size=2, fsdp_size=2))`
on two gloo processes (tests/workers/expert_parallel.py): each rank holds and reads half the experts, tokens travel
by all-to-all, and every result equals one process."""

from launching import launch

import fivefold

from helpers import read_tensors

CONFIG = dict(
    vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=8192, num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
EXPERT_MIB = 2 * 4 * 3 * 64 * 8192 * 4 / 2**20  # layers x experts x projections x weights x fp32


def test_expert_parallel_equals_one_process(tmp_path):
    import torch

    torch.manual_seed(0)
    model = fivefold.FivefoldMixtralForCausalLM(fivefold.FivefoldMixtralConfig(**CONFIG))
    model.save_pretrained(tmp_path / "checkpoint")
    small = {**CONFIG, "num_local_experts": 3, "intermediate_size": 16}
    fivefold.FivefoldMixtralForCausalLM(fivefold.FivefoldMixtralConfig(**small)).save_pretrained(tmp_path / "three")
    args = {"checkpoint": str(tmp_path / "checkpoint"), "three_experts": str(tmp_path / "three")}
    results = launch("expert_parallel", 2, tmp_path, args, timeout=150)
    assert [r["held"] for r in results] == [[0, 1], [2, 3]]
    for r in results:
        assert "divisible by 2" in r["error"] and "has 3" in r["error"]
        assert r["held_mib"] == EXPERT_MIB / 2, r  # the weights this rank holds: half of the experts
        # Peak RSS growth over loading and one forward is reported, not asserted: measured 40-47 MiB per rank
        # against 24 MiB of held experts and 48 MiB in the file (read in the closing note of issue 13).
        print(r["rss_after_load"], r["rss_growth_mib"])
        assert r["logits"] <= 1e-5 and r["aux_loss"] <= 1e-6, r
        assert r["expert_grads"] <= 1e-5 and r["router_grad"] <= 1e-5, results
        assert r["generate"]
    saved, original = read_tensors(tmp_path / "saved"), read_tensors(tmp_path / "checkpoint")
    assert saved.keys() == original.keys()
    assert all(torch.equal(saved[k], original[k]) for k in original)
