#!/usr/bin/env python3
"""Prompt logits of Hugging Face's bf16 model (fresh load, eager attention, CUDA) for the cases of a golden.json,
and their distance to the fp32 golden logits: how far a bf16 forward that rounds where PyTorch rounds lands from
fp32. Writes the bf16 logits (as F32) for `hybrid-compare --logits`, to measure hybrid's distance to HF bf16.

  hf_bf16_logits.py --model DIR --golden G/golden.json --fp32 G/golden_logits.safetensors --out bf16.safetensors
"""
import argparse
import json

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--golden", required=True)
ap.add_argument("--fp32", required=True)
ap.add_argument("--out", required=True)
a = ap.parse_args()
m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, attn_implementation="eager").to("cuda").eval()
ref = load_file(a.fp32)
out = {}
worst = 0.0
for c in json.load(open(a.golden))["cases"]:
    with torch.no_grad():
        lg = m(input_ids=torch.tensor([c["input_ids"]], device="cuda")).logits[0].float().cpu()
    out[c["name"]] = lg.contiguous()
    d = (lg - ref[c["name"]]).abs()
    worst = max(worst, d.max().item())
    print(f"HF bf16 vs fp32 {c['name']:16s} prompt {len(c['input_ids']):4d}  max abs {d.max().item():.4g}  "
          f"last row {d[-1].max().item():.4g}  mean abs {d.mean().item():.3g}", flush=True)
print(f"HF bf16 vs fp32 worst {worst:.4g}")
save_file(out, a.out)
