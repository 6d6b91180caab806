#!/usr/bin/env python3
"""Writes tests/data/chat/golden.json: chat template renderings by transformers' apply_chat_template, the goldens of
the Jinja subset in model/jinja.cpp (tests/test_chat_template.cpp).

Two templates:
  qwen3     the chat_template of tests/data/tokenizers/qwen3/tokenizer_config.json (Qwen3's), rendered and tokenized
            with that tokenizer: each case records the text and the token ids of apply_chat_template(tokenize=True);
  features  tests/data/chat/features.jinja, a template written for the tests that exercises what Qwen3.5-style
            templates use (macros, namespaces, loop.previtem/nextitem, tests, filters, slices, string methods): text.
Conversations: system prompts, multi-turn, tools, tool calls (arguments as objects and as JSON strings), tool
responses, reasoning (in <think> and as reasoning_content), thinking on and off, with and without the generation
prompt.

Needs transformers (made with 5.24.0, tokenizers 0.23.3, jinja2 3.1.6); not needed to build or test.
Usage: python3 tools/make_chat_goldens.py [--out tests/data/chat/golden.json]
"""
import argparse
import json
import os

import transformers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Web search – returns snippets (UTF-8: é, 中文)",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}

CASES = [
    ("user_only", [{"role": "user", "content": "Hello!"}], None, True, {}),
    ("system_user_no_think", [{"role": "system", "content": "You are a helpful assistant."},
                              {"role": "user", "content": "What is 2+2?"}], None, True, {"enable_thinking": False}),
    ("system_user_think", [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Name a color."}], None, True, {"enable_thinking": True}),
    ("multi_turn", [{"role": "system", "content": "You are a poet."},
                    {"role": "user", "content": "Write a line."},
                    {"role": "assistant", "content": "<think>\nShort and sweet.\n</think>\n\nRoses are red."},
                    {"role": "user", "content": "Another one."}], None, True, {}),
    ("multi_turn_no_think", [{"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hello! How can I help?"},
                             {"role": "user", "content": "Tell me a joke."},
                             {"role": "assistant", "content": "Why did the chicken cross the road?"},
                             {"role": "user", "content": "Why?"}], None, True, {"enable_thinking": False}),
    ("ends_with_assistant", [{"role": "user", "content": "Say hi."},
                             {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\nHi!"}], None, False, {}),
    ("reasoning_content_field", [{"role": "user", "content": "Pick a number."},
                                 {"role": "assistant", "content": "7", "reasoning_content": "Seven is lucky."}],
     None, False, {}),
    ("tools_first_turn", [{"role": "system", "content": "You can call tools."},
                          {"role": "user", "content": "Weather in Paris?"}], [WEATHER, SEARCH], True, {}),
    ("tools_no_system", [{"role": "user", "content": "Search for cats."}], [SEARCH], True, {"enable_thinking": False}),
    ("tool_call_and_response", [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "{\"temp\": 25}"},
    ], [WEATHER], True, {}),
    ("tool_call_then_answer", [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Search the news."},
        {"role": "assistant", "content": "<think>\nI should search.\n</think>\n\nLet me search.", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": {"query": "news", "n": [1, 2],
                                                                           "opts": {"safe": True, "x": None}}}}]},
        {"role": "tool", "content": "Nothing happened today."},
        {"role": "assistant", "content": "Nothing happened today."},
        {"role": "user", "content": "Thanks! And tomorrow?"},
    ], [SEARCH, WEATHER], True, {"enable_thinking": True}),
    ("unicode_and_specials", [{"role": "user", "content": "héllo 世界 🙂 <|im_start|> tab\there\n\nnew"}],
     None, True, {}),
    ("system_only_later", [{"role": "user", "content": "a"}, {"role": "system", "content": "late system"},
                           {"role": "user", "content": "b"}], None, True, {}),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/chat/golden.json"))
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tests/data/tokenizers/qwen3"))
    with open(os.path.join(ROOT, "tests/data/chat/features.jinja"), encoding="utf-8") as f:
        features = f.read()
    out = {"transformers": transformers.__version__, "qwen3": [], "features": []}
    for name, messages, tools, gen, kwargs in CASES:
        text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False, **kwargs)
        ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=True,
                                      return_dict=False, **kwargs)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        assert ids == tok(text, add_special_tokens=False)["input_ids"], name
        case = {"name": name, "messages": messages, "add_generation_prompt": gen, "kwargs": kwargs, "text": text,
                "ids": ids}
        if tools is not None:
            case["tools"] = tools
        out["qwen3"].append(case)
        ftext = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False,
                                        chat_template=features, **kwargs)
        fcase = {"name": name, "messages": messages, "add_generation_prompt": gen, "kwargs": kwargs, "text": ftext}
        if tools is not None:
            fcase["tools"] = tools
        out["features"].append(fcase)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {len(out['qwen3'])} qwen3 cases, {len(out['features'])} features cases")


if __name__ == "__main__":
    main()
