#!/usr/bin/env python3
"""The small mixture-of-experts test models of tests/data/models (moe: Qwen3.5-MoE, next: Qwen3-Next), with
Hugging Face goldens.

The trained fixtures (tiny-moe, tiny-next: hidden 256, 16 MB each) do not fit the repository's size budget, so the
tests use models of the same architectures with hidden 64 and 4 layers (3 Gated DeltaNet + 1 gated attention with
head dim 64, the smallest the CUDA attention kernels are built for),
random weights (seeded; initializer_range 0.1 so that logits and router scores are well separated), stored as
released checkpoints store them (BF16, A_log and dt_bias F32; experts as transformers 5 saves them, fused 3-D
tensors). models/tiny's tokenizer is copied in. The goldens come from tools/make_golden.py (fp32 on the CPU, a
fresh model per run, eager attention).

Usage (needs torch + transformers; not needed to build or test hybrid):
  tools/make_moe_test_models.py [--out tests/data/models]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import save_file

COMMON = dict(vocab_size=4096, hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
              head_dim=64, linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
              linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=4096, rms_norm_eps=1e-6,
              tie_word_embeddings=False, eos_token_id=1, pad_token_id=0, bos_token_id=None,
              initializer_range=0.1, num_experts=8, moe_intermediate_size=32, shared_expert_intermediate_size=64,
              layer_types=["linear_attention"] * 3 + ["full_attention"])

MODELS = {
    # Qwen3.5-MoE: every layer sparse, top-4, always renormalised
    "moe": ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig",
            dict(num_experts_per_tok=4,
                 rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                                      mrope_section=[3, 3, 2], mrope_interleaved=True))),
    # Qwen3-Next: top-2 with norm_topk_prob, layer 2 a dense MLP, fused in_proj_qkvz / in_proj_ba
    "next": ("Qwen3NextForCausalLM", "Qwen3NextConfig",
             dict(num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[2],
                  intermediate_size=96,
                  rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25))),
}

PROMPTS = [
    ("one_token", "d"),
    ("short", "def main():\n    "),
    ("sentence", "The quick brown fox jumps over the lazy dog."),
    ("code", "for i in range(10):\n    print(i * i)\n\nclass Point:\n    def __init__(self, x, y):\n"),
]
NEW_TOKENS = 24


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/models")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    import transformers
    root = os.path.dirname(os.path.abspath(__file__)) + "/.."
    for name, (cls_name, cfg_name, extra) in MODELS.items():
        out = os.path.join(a.out, name)
        os.makedirs(out, exist_ok=True)
        torch.manual_seed(a.seed)
        cfg = getattr(transformers, cfg_name)(**COMMON, **extra)
        model = getattr(transformers, cls_name)(cfg).eval()
        sd = {k: (v.float() if k.endswith(("A_log", "dt_bias")) else v.to(torch.bfloat16)).contiguous()
              for k, v in model.state_dict().items()}
        save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        cfg.dtype = "bfloat16"
        cfg.save_pretrained(out)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(root, "models/tiny", f), out)
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        cases = [{"name": n, "prompt": p, "input_ids": tok.encode(p).ids, "max_new_tokens": NEW_TOKENS}
                 for n, p in PROMPTS]
        prompts = os.path.join(out, "prompts.json")
        with open(prompts, "w") as f:
            json.dump({"cases": cases, "batch": {"names": ["short", "sentence", "code"]}}, f, indent=1)
        subprocess.check_call([sys.executable, os.path.join(root, "tools/make_golden.py"), "--model", out,
                               "--prompts", prompts, "--devices", "cpu"])
        os.remove(prompts)
        print(name, "->", out)


if __name__ == "__main__":
    main()
