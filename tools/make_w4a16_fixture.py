#!/usr/bin/env python3
"""Write tests/data/models/tiny-w4a16: models/tiny as a compressed-tensors W4A16 checkpoint, with its goldens.

What it holds: the linear weights of models/tiny quantized to symmetric int4 in groups of 128 and saved by the
compressed-tensors library itself in its "pack-quantized" format (tensors <name>.weight_packed I32 [out, in / 8],
<name>.weight_scale BF16 [out, in / 128], <name>.weight_shape I64 [2]; config.json's quantization_config with
quant_method "compressed-tensors"), so the layout is the one vLLM users' W4A16 checkpoints have. lm_head (tied to
the embeddings) and in_proj_a are in the ignore list and stay BF16, as are the embeddings (not a Linear); in_proj_b
is quantized, so both kinds of the Gated DeltaNet's small projections are covered. The scales are compressed-tensors'
own calculate_qparams of each group's min and max (absmax / 7.5, the min-max observer's choice): no calibration data.

Goldens (golden_w4a16.json, golden_w4a16_logits.safetensors):
  dequant_fnv1a64   per quantized module, FNV-1a 64 of the F32 little-endian bytes of its weight [out, in]
                    row-major as compressed-tensors dequantizes it (unpack_from_int32, then dequantize with the scale
                    in F32: code * scale exactly; in BF16 the product would be rounded)
  dequant_head      the first 8 values of row 0 of each (to read a failure)
  input_ids         the prompt; logits: F32 [T, vocab], Hugging Face transformers' forward (fp32, eager attention)
                    of the folder loaded with compressed-tensors installed, which decompresses the weights on load
The script checks that transformers' decompressed weights equal the F32 dequantization bit for bit.

How it was run (not needed to build or test hybrid; CPU wheels):
  python3 -m venv /tmp/ctvenv && /tmp/ctvenv/bin/pip install torch compressed-tensors transformers safetensors
  /tmp/ctvenv/bin/python tools/make_w4a16_fixture.py --model models/tiny --out tests/data/models/tiny-w4a16
with compressed-tensors 0.20.1, transformers and torch of that day (the versions are written into golden_w4a16.json).
hybrid-compare's golden.json (models/tiny's prompts; transformers' fp32 greedy tokens of the folder, which it
decompresses on load) was added later by tools/make_golden.py in the same environment, its 7.9 MB of logits left out
(hybrid-compare then compares the tokens alone):
  /tmp/ctvenv/bin/python tools/make_golden.py --model tests/data/models/tiny-w4a16 --prompts models/tiny/golden.json \
      --out /tmp/w4g --devices cpu && cp /tmp/w4g/golden.json tests/data/models/tiny-w4a16/
"""
import argparse
import json
import os
import shutil

import compressed_tensors
import torch
import transformers
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.lifecycle.forward import dequantize
from compressed_tensors.quantization.utils.helpers import calculate_qparams
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

GROUP = 128
IGNORE = ["lm_head", "re:.*in_proj_a$"]
PROMPT = [9, 417, 1022, 33, 2048, 5, 77, 3001, 64, 128, 256, 1999, 4000, 12, 700, 350]


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/tiny")
    ap.add_argument("--out", default="tests/data/models/tiny-w4a16")
    a = ap.parse_args()
    torch.manual_seed(0)

    # 1. quantize with compressed-tensors: schemes attached, per-group scales from calculate_qparams, compressed
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16)
    weights = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP)
    config = QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
        ignore=IGNORE,
        format="pack-quantized",
    )
    apply_quantization_config(model, config)
    n_quantized = 0
    for name, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None:
            continue
        w = module.weight.detach().float()
        g = w.reshape(w.shape[0], w.shape[1] // GROUP, GROUP)
        scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), scheme.weights)
        module.weight_scale.data.copy_(scale.to(module.weight_scale.dtype))
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zp.to(module.weight_zero_point.dtype))
        n_quantized += 1
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    if os.path.isdir(a.out):
        shutil.rmtree(a.out)
    model.save_pretrained(a.out)
    compressor.update_config(a.out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.model, f), os.path.join(a.out, f))
    if os.path.exists(os.path.join(a.out, "generation_config.json")):
        os.remove(os.path.join(a.out, "generation_config.json"))

    # 2. the F32 dequantization of every packed tensor, by compressed-tensors' own functions
    tensors = load_file(os.path.join(a.out, "model.safetensors"))
    fnv, head, exact = {}, {}, {}
    for key in sorted(tensors):
        if not key.endswith(".weight_packed"):
            continue
        module = key[: -len(".weight_packed")]
        shape = tuple(int(x) for x in tensors[module + ".weight_shape"].tolist())
        codes = unpack_from_int32(tensors[key], 4, torch.Size(shape))
        w = dequantize(x_q=codes, scale=tensors[module + ".weight_scale"].float(), args=weights)
        assert w.dtype == torch.float32 and tuple(w.shape) == shape
        exact[module] = w
        fnv[module] = fnv1a64(w.contiguous().numpy().astype("<f4").tobytes())
        head[module] = [float(x) for x in w[0, :8]]
    assert len(fnv) == n_quantized, (len(fnv), n_quantized)

    # 3. transformers' logits on the folder as it loads it (decompressed), checked against the exact dequantization
    # (transformers keeps the packed tensors and decompresses them on the first forward, compressed-tensors'
    # decompression hook; in F32, since the model's dtype gives the scales' dtype)
    ref = AutoModelForCausalLM.from_pretrained(a.out, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = ref(torch.tensor([PROMPT])).logits[0].float().contiguous()
    params = dict(ref.named_parameters())
    for module, w in exact.items():
        p = params[module + ".weight"].detach()
        assert p.dtype == torch.float32 and torch.equal(p, w), module + ": transformers' weight differs from code * scale"
    save_file({"logits": logits}, os.path.join(a.out, "golden_w4a16_logits.safetensors"))
    golden = {
        "versions": {
            "compressed-tensors": compressed_tensors.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
        "group_size": GROUP,
        "ignore": IGNORE,
        "input_ids": PROMPT,
        "dequant_fnv1a64": fnv,
        "dequant_head": head,
    }
    with open(os.path.join(a.out, "golden_w4a16.json"), "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
    print("wrote", a.out, "with", n_quantized, "packed modules")


if __name__ == "__main__":
    main()
