#!/usr/bin/env python3
"""A Qwen3.5 checkpoint of a make_fixture.py preset's shapes with random weights, built on the GPU.

make_fixture.py --preset 4b --no-golden initialises the 4.2 B parameters on the CPU (about 100 s on the GPU
machine); this script takes the same config and Hugging Face initialisation but runs it on the GPU, converts
to bf16 there (A_log and dt_bias stay fp32, as --ssm-fp32) and writes config.json + model.safetensors (about
20 s). For speed runs only: the weights are random.

Usage: python3 tools/gpu/random_checkpoint.py --out /tmp/q4b [--preset 4b] [--fixture-tools .carry/tools]
"""
import argparse
import os
import sys
import time

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="4b")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--fixture-tools", default=".carry/tools", help="folder holding make_fixture.py")
    a = ap.parse_args()
    sys.path.insert(0, a.fixture_tools)
    import make_fixture as mf
    from transformers import Qwen3_5ForCausalLM

    t0 = time.time()
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    cfg = mf.build_config(mf.PRESETS[a.preset], "causal")
    with torch.device("cuda"):
        model = Qwen3_5ForCausalLM(cfg)
    sd = {}
    for k, v in model.state_dict().items():
        if cfg.tie_word_embeddings and k == "lm_head.weight":
            continue
        keep32 = k.endswith("A_log") or k.endswith("dt_bias")
        sd[k] = v.detach().to(torch.float32 if keep32 else torch.bfloat16).contiguous().cpu()
    del model
    save_file(sd, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    mf.write_config(cfg, a.out, "causal", "bfloat16")
    n = sum(v.numel() for v in sd.values())
    print(f"wrote {a.out}: {n / 1e9:.2f} B parameters in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
