#!/usr/bin/env python3
"""Regenerate Hugging Face golden outputs for a model folder, each reference run on a freshly loaded model.

Why: ../shared/tools/make_fixture.py reuses one module for every run and calls `model.to(torch.bfloat16)` for the
bf16 greedy run of each case. That rounds the F32 parameters A_log and dt_bias and the RoPE `inv_freq` buffer to
bf16 for every later case, so its fp32 goldens after the first case describe a slightly different model (logit
differences up to 0.1 on the 300-token case; a fresh fp32 model diverges from its `long` greedy at step 8). This
tool loads the checkpoint anew for each dtype/device, so every golden is what Hugging Face computes for the file.

Usage (needs torch + transformers; not needed to build or test hybrid):
  tools/make_golden.py --model models/tiny [--prompts models/tiny/golden.json] [--out DIR] [--devices cpu,cuda]
Writes golden.json and golden_logits.safetensors (fp32 logits [T, vocab] per case) into --out (default: --model).
Keys written per case: input_ids, prompt, max_new_tokens, last_logits_top20, greedy_fp32_cpu, and with CUDA
greedy_fp32_cuda and greedy_bf16_cuda; greedy_fp32_text when a tokenizer.json is present; `batch` rows are the
left-padded fp32 batch run (eager attention) on the first device.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def load(model_dir, device, dtype):
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    return m.to(device).eval()


@torch.no_grad()
def greedy(m, ids, n, device):
    x = torch.tensor([ids], device=device)
    out = m.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                     eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", help="golden.json whose cases (names, input_ids, prompt) and batch names to reuse")
    ap.add_argument("--out")
    ap.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    out_dir = a.out or a.model
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    src = json.load(open(a.prompts or os.path.join(a.model, "golden.json")))
    devices = a.devices.split(",")
    tok = None
    if os.path.exists(os.path.join(a.model, "tokenizer.json")):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))

    cases = [{k: c[k] for k in ("name", "prompt", "input_ids", "max_new_tokens") if k in c} for c in src["cases"]]
    logits = {}
    first = devices[0]
    ref = load(a.model, first, torch.float32)
    for c in cases:
        with torch.no_grad():
            lg = ref(input_ids=torch.tensor([c["input_ids"]], device=first)).logits[0].float().cpu()
        logits[c["name"]] = lg.contiguous()
        top = torch.topk(lg[-1], 20)
        c["last_logits_top20"] = [[int(i), float(v)] for v, i in zip(top.values, top.indices)]
    for dev in devices:
        for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            if dtype == torch.bfloat16 and dev == "cpu":
                continue
            m = load(a.model, dev, dtype)
            for c in cases:
                c[f"greedy_{tag}_{dev}"] = greedy(m, c["input_ids"], c["max_new_tokens"], dev)
                print(c["name"], tag, dev, c[f"greedy_{tag}_{dev}"][:8], flush=True)
            del m
    if tok is not None:
        for c in cases:
            c["greedy_fp32_text"] = tok.decode(c[f"greedy_fp32_{first}"])

    golden = {k: v for k, v in src.items() if k not in ("cases", "batch")}
    import transformers
    golden.update({"transformers": transformers.__version__, "torch": torch.__version__, "device": first,
                   "note": "made by tools/make_golden.py: each reference run on a freshly loaded model; greedy_* are "
                           "HF generate() continuations (do_sample=False, no EOS stop); logits fp32",
                   "cases": cases})
    if "batch" in src:
        names = src["batch"]["names"]
        rows = [next(c for c in cases if c["name"] == n) for n in names]
        L = max(len(r["input_ids"]) for r in rows)
        x = torch.tensor([[0] * (L - len(r["input_ids"])) + r["input_ids"] for r in rows], device=first)
        am = torch.tensor([[0] * (L - len(r["input_ids"])) + [1] * len(r["input_ids"]) for r in rows], device=first)
        with torch.no_grad():
            out = ref.generate(input_ids=x, attention_mask=am, max_new_tokens=rows[0]["max_new_tokens"],
                               do_sample=False, eos_token_id=None, pad_token_id=0)
        golden["batch"] = {"names": names, "greedy_fp32_left_padded": out[:, L:].tolist()}
    os.makedirs(out_dir, exist_ok=True)
    json.dump(golden, open(os.path.join(out_dir, "golden.json"), "w"), indent=1, ensure_ascii=False)
    save_file(logits, os.path.join(out_dir, "golden_logits.safetensors"))
    print("wrote", out_dir)


if __name__ == "__main__":
    main()
