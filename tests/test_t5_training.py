"""Training-side behaviour of T5: gradient checkpointing gives the same gradients, encoder included (the encoder
states reach cross-attention as a positional input, which reentrant checkpointing follows)."""

import torch

from fivefold import FivefoldT5Config, FivefoldT5ForConditionalGeneration


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    config = FivefoldT5Config(
        vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=3, num_heads=4,
        dropout_rate=0.0, decoder_start_token_id=0,
    )  # fmt: skip
    model = FivefoldT5ForConditionalGeneration(config).train()
    batch = {
        "input_ids": torch.randint(2, 99, (2, 9)),
        "attention_mask": torch.tensor([[1] * 9, [1] * 6 + [0] * 3]),
        "labels": torch.randint(2, 99, (2, 5)),
    }

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad()
        model(**batch).loss.backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    checkpointed = grads()
    assert set(plain) == set(checkpointed) and "encoder.layers.0.attn.q_proj.weight" in plain
    assert all(torch.allclose(plain[k], checkpointed[k], atol=1e-6) for k in plain)
