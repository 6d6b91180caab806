#!/usr/bin/env python3
"""Hugging Face transformers decode and prefill speed on a model folder, the baseline hybrid-bench is compared with.

Loads the folder in bf16 on the GPU (attn_implementation as given, eager by default) and times, after a warm-up:
  prefill: one forward over a --prompt-token prompt (random ids in [0, 4096));
  decode:  generate(greedy) of --new tokens after that prompt, minus the prefill time, per new token.
Without flash-linear-attention installed, transformers runs the Gated DeltaNet layers with its torch fallback.
Prints one line: "HF <version> <attn>: prefill N tok/s, decode M tok/s (prompt P, new K)".

Usage: python3 tools/gpu/hf_decode_baseline.py --model /tmp/q4b [--prompt 512] [--new 32] [--attn eager]
"""
import argparse
import time

import torch
import transformers
from transformers import AutoModelForCausalLM


def sync_time():
    torch.cuda.synchronize()
    return time.perf_counter()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--attn", default="eager")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation=a.attn)
    model = model.cuda().eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4096, (1, a.prompt), generator=g).cuda()
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:, :16], max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        pre, dec = [], []
        for _ in range(a.reps):
            t0 = sync_time()
            model(ids)
            t1 = sync_time()
            model.generate(ids, max_new_tokens=a.new, min_new_tokens=a.new, **kw)
            t2 = sync_time()
            pre.append(t1 - t0)
            dec.append((t2 - t1) - (t1 - t0))
    p, d = sorted(pre)[len(pre) // 2], sorted(dec)[len(dec) // 2]
    print(f"HF {transformers.__version__} {a.attn}: prefill {a.prompt / p:.1f} tok/s, decode {a.new / d:.2f} tok/s "
          f"(prompt {a.prompt}, new {a.new}, median of {a.reps})")


if __name__ == "__main__":
    main()
