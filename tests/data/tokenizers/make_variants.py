#!/usr/bin/env python3
"""Golden encodings of variants of models/tiny/tokenizer.json, made with Hugging Face `tokenizers`.

Each variant patches the tiny tokenizer.json (JSON pointer -> new value; a pointer ending in "/-" appends to an
array; "merges_as_strings" rewrites the merges as "a b" strings) to exercise a component or option that the
bundled tokenizers do not use. tests/test_tokenizer.cpp applies the same patches and compares.

  python3 tests/data/tokenizers/make_variants.py     (from the repository root; writes variants.json here)
"""
import copy
import json
import os

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
QWEN_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
           "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def split(pattern, kind="Regex"):
    return {"type": "Split", "pattern": {kind: pattern}, "behavior": "Isolated", "invert": False}


def byte_level(prefix, regex):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": False, "use_regex": regex}


def added(i, content, **kw):
    t = {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False}
    t.update(kw)
    return t


VARIANTS = [
    ("nfkc", [("/normalizer", {"type": "NFKC"})]),
    ("nfd", [("/normalizer", {"type": "NFD"})]),
    ("nfkd_then_nfc", [("/normalizer", {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "NFC"}]})]),
    ("no_normalizer", [("/normalizer", None)]),
    ("byte_level_alone", [("/pre_tokenizer", byte_level(False, True))]),
    ("byte_level_prefix_space", [("/pre_tokenizer", byte_level(True, True))]),
    ("split_then_prefix_space",
     [("/pre_tokenizer", {"type": "Sequence", "pretokenizers": [split(QWEN_RE), byte_level(True, False)]})]),
    ("split_string_and_digits",
     [("/pre_tokenizer", {"type": "Sequence", "pretokenizers": [split(" ", "String"), split("\\p{N}{1,3}"),
                                                                  byte_level(False, False)]})]),
    ("ignore_merges", [("/model/ignore_merges", True)]),
    ("merges_as_strings", "merges_as_strings"),
    ("added_token_options", [
        ("/added_tokens/-", added(4096, "xyz", lstrip=True, rstrip=True)),
        ("/added_tokens/-", added(4097, "ab", single_word=True)),
        ("/added_tokens/-", added(4098, "Caf\u00e9", normalized=True)),
        ("/added_tokens/-", added(4099, "<sp>", special=True)),
        ("/added_tokens/-", added(4100, "<sp>x")),
        ("/added_tokens/-", added(4101, "\u00e9 z")),
    ]),
    ("encode_special_tokens", []),
]

TEXTS = [
    "", " ", "a", "Hello world", " Hello", "hello  world", "I'll we've they're it's don't I'M YOU'LL",
    "1234567890 12 345", "3.14159 2,500", "naïve café résumé", "e\u0301 vs é", "Ǆ ǅ ǆ ﬁ ﬂ ½ ² Ⅻ",
    "東京は日本の首都です。", "한국어 텍스트", "🚀🔥👍🏽 emoji", "tab\tseparated\tvalues", "trailing spaces   ",
    "   leading spaces", "line1\nline2\r\nline3\rline4", "def f(x):\n    return x**2  # square\n",
    "<|im_start|>user\nHi<|im_end|>\n", "<think>\nreasoning\n</think>\n\nanswer", "text<|endoftext|>more",
    "xyz", "a xyz b", "a  xyz\t\tb", "axyzb", " xyz xyz ", "ab", "cab", "ab c", "(ab)", "ab_", "_ab", "é ab",
    "Cafe\u0301", "Café au lait", "CAFÉ", "<sp>", "<sp>x", "a<sp>b", "<sp><sp>", "é z", "e\u0301 z",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "the the the the", "x\u0000y",
]


def apply(base, patch):
    j = copy.deepcopy(base)
    if patch == "merges_as_strings":
        j["model"]["merges"] = [a + " " + b for a, b in j["model"]["merges"]]
        return j
    for ptr, value in patch:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in ptr.split("/")[1:]]
        node = j
        for p in parts[:-1]:
            node = node[int(p)] if isinstance(node, list) else node[p]
        last = parts[-1]
        if last == "-":
            node.append(value)
        else:
            node[last] = value
    return j


def main():
    base = json.load(open(os.path.join(ROOT, "models", "tiny", "tokenizer.json"), encoding="utf-8"))
    out = []
    for name, patch in VARIANTS:
        tok = Tokenizer.from_str(json.dumps(apply(base, patch)))
        special_as_text = name == "encode_special_tokens"
        tok.encode_special_tokens = special_as_text
        cases = []
        for s in TEXTS:
            ids = tok.encode(s, add_special_tokens=False).ids
            cases.append({"text": s, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
        out.append({"name": name, "patch": patch if isinstance(patch, str) else
                    [{"path": p, "value": v} for p, v in patch], "encode_special_tokens": special_as_text,
                    "cases": cases})
    path = os.path.join(HERE, "variants.json")
    json.dump({"tokenizer_version": tokenizers.__version__, "base": "models/tiny/tokenizer.json", "variants": out},
              open(path, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    print(f"{len(out)} variants -> {path}")


if __name__ == "__main__":
    main()
