// The Jinja subset of chat templates (model/jinja.h): renderings and token ids equal to transformers'
// apply_chat_template (tests/data/chat/golden.json, made by tools/make_chat_goldens.py) for Qwen3's template and for a
// template that exercises what Qwen3.5-style templates use; the language's corners; errors.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "base/common.h"
#include "model/jinja.h"
#include "model/tokenizer.h"

namespace {

using ojson = nlohmann::ordered_json;
using hy::Status;
namespace jinja = hy::jinja;

const std::string kRoot = HY_SOURCE_DIR;

std::string read_text(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE(f.good());
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

const ojson& golden() {
    static const ojson g = ojson::parse(read_text(kRoot + "/tests/data/chat/golden.json"));
    return g;
}

// The context transformers gives a template: the conversation, tools, add_generation_prompt, the tokenizer's
// special tokens and the extra keyword arguments.
jinja::Value context_of(const ojson& c) {
    ojson ctx = ojson::object();
    ctx["messages"] = c["messages"];
    if (c.contains("tools")) ctx["tools"] = c["tools"];
    ctx["add_generation_prompt"] = c["add_generation_prompt"];
    ctx["eos_token"] = "<|im_end|>";
    ctx["pad_token"] = "<|endoftext|>";
    for (auto it = c["kwargs"].begin(); it != c["kwargs"].end(); ++it) ctx[it.key()] = it.value();
    return jinja::from_json(ctx);
}

std::string render(const std::string& source, const ojson& ctx = ojson::object()) {
    return jinja::Template(source).render(jinja::from_json(ctx));
}

template <class F>
std::string error_of(F&& f, Status expected) {
    try {
        f();
    } catch (const hy::Error& e) {
        CHECK(e.status() == expected);
        return e.what();
    }
    FAIL("no error thrown");
    return "";
}

}  // namespace

TEST_CASE("chat template: Qwen3's template gives transformers' text and token ids", "[tokenizer]") {
    const ojson config = ojson::parse(read_text(kRoot + "/tests/data/tokenizers/qwen3/tokenizer_config.json"));
    const jinja::Template tmpl(config["chat_template"].get<std::string>());
    static const hy::Tokenizer tok = hy::Tokenizer::from_folder(kRoot + "/tests/data/tokenizers/qwen3");
    REQUIRE(golden()["qwen3"].size() >= 10);
    for (const ojson& c : golden()["qwen3"]) {
        INFO("case " << c["name"].get<std::string>());
        const std::string text = tmpl.render(context_of(c));
        CHECK(text == c["text"].get<std::string>());
        CHECK(tok.encode(text) == c["ids"].get<std::vector<int32_t>>());
    }
}

TEST_CASE("chat template: the features template renders as transformers renders it", "[tokenizer]") {
    const jinja::Template tmpl(read_text(kRoot + "/tests/data/chat/features.jinja"));
    for (const ojson& c : golden()["features"]) {
        INFO("case " << c["name"].get<std::string>());
        CHECK(tmpl.render(context_of(c)) == c["text"].get<std::string>());
    }
}

TEST_CASE("chat template: whitespace control, trim_blocks and lstrip_blocks", "[tokenizer]") {
    CHECK(render("a  {{- 'b' -}}  c") == "abc");
    CHECK(render("a\n  {% if true %}\nb\n  {% endif %}\nc") == "a\nb\nc");
    CHECK(render("a {% if true %}b{% endif %} c") == "a b c");  // not at a line's start: kept
    CHECK(render("{# comment #}\nx") == "x");
    CHECK(render("  {%+ if true %}x{% endif %}") == "  x");
    CHECK(render("{{ 'a' }}\nb") == "a\nb");  // trim_blocks does not apply to expressions
    CHECK(render("{% raw %}{{ x }}{% endraw %}") == "{{ x }}");
}

TEST_CASE("chat template: values print as Python prints them", "[tokenizer]") {
    CHECK(render("{{ true }} {{ none }} {{ 1.0 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }}") ==
          "True None 1.0 1e-05 0.30000000000000004 2.5");
    CHECK(render("{{ x }}", {{"x", {{"a", "it's"}, {"b", {1, nullptr}}}}}) == "{'a': \"it's\", 'b': [1, None]}");
    CHECK(render("{{ x|tojson }}", {{"x", {{"z", 1}, {"a", "é\n"}}}}) == "{\"z\": 1, \"a\": \"é\\n\"}");
    CHECK(render("{{ 'héllo'|length }} {{ 'héllo'[1] }} {{ 'abc'[-1] }}") == "5 é c");
    CHECK(render("{{ x.missing is defined }} {{ x.missing }}", {{"x", ojson::object()}}) == "False ");
}

TEST_CASE("chat template: scoping of set in loops and namespaces", "[tokenizer]") {
    CHECK(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}") == "1");
    CHECK(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = i %}{% endfor %}{{ ns.x }}") == "2");
    CHECK(render("{% if true %}{% set x = 5 %}{% endif %}{{ x }}") == "5");
    CHECK(render(
              "{% macro m(a, b='d') %}{{ a }}{{ b }}{{ g }}{% endmacro %}{% set g = '!' %}{{ m(1) }}{{ m(2, b=3) }}") ==
          "1d!23!");
    CHECK(render("{% for a, b in x|items %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}",
                 {{"x", {{"k", 1}, {"j", 2}}}}) == "k11j22");
}

// A template can make reference cycles (a namespace holding itself, directly or through a list, or a macro that
// names itself); the renderer frees them when the render ends (the ASan build's leak check fails otherwise: the
// jinja fuzz test found the first).
TEST_CASE("chat template: reference cycles a template makes are freed", "[tokenizer]") {
    CHECK(render("{% set ns = namespace(x=0) %}{% set ns.x = ns %}{{ ns.x.x.x is defined }}") == "True");
    CHECK(render("{% set ns = namespace(l=none) %}{% set ns.l = [ns, 1] %}{{ ns.l[1] }}") == "1");
    CHECK(render("{% set a = namespace(o=none) %}{% set b = namespace(o=a) %}{% set a.o = b %}ok") == "ok");
    CHECK(render("{% macro m(n) %}{% if n > 0 %}{{ n }}{{ m(n - 1) }}{% endif %}{% endmacro %}"
                 "{% set ns = namespace(f=m) %}{{ ns.f(3) }}") == "321");
}

TEST_CASE("chat template: errors name the line and what is wrong", "[tokenizer]") {
    std::string e = error_of([] { jinja::Template("a\n{{ x | nosuchfilter }}"); }, Status::format);
    CHECK(e == "chat template line 2: unknown filter 'nosuchfilter'");
    e = error_of([] { jinja::Template("{% if x %}"); }, Status::format);
    CHECK(e.find("without {% endif %}") != std::string::npos);
    e = error_of([] { jinja::Template("{{ x "); }, Status::format);
    CHECK(e == "chat template line 1: unclosed {{");
    e = error_of([] { jinja::Template("{% while x %}"); }, Status::format);
    CHECK(e == "chat template line 1: unsupported statement {% while %}");
    e = error_of([] { render("\n\n{{ raise_exception('No messages provided.') }}"); }, Status::invalid_argument);
    CHECK(e == "chat template line 3: No messages provided.");
    e = error_of([] { render("{{ nothing.content }}"); }, Status::invalid_argument);
    CHECK(e == "chat template line 1: cannot read attribute 'content' of an undefined value ('nothing')");
    e = error_of([] { render("{{ 1 + 'a' }}"); }, Status::invalid_argument);
    CHECK(e == "chat template line 1: unsupported operand types for +: an integer and a string");

    // limits: nesting, recursion, sizes and steps are errors, not crashes or hangs
    e = error_of([] { jinja::Template("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"); },
                 Status::format);
    CHECK(e == "chat template line 1: expression nests deeper than 200 levels");
    e = error_of([] { jinja::Template(std::string(3000, '-').insert(0, "{{ ") + "1 }}"); }, Status::format);
    CHECK(e == "chat template line 1: expression nests deeper than 200 levels");
    e = error_of([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); }, Status::invalid_argument);
    CHECK(e.find("macro calls nest deeper than 64 levels") != std::string::npos);
    e = error_of([] { render("{{ range(200000)|length }}"); }, Status::invalid_argument);
    CHECK(e.find("range() has more than 100000 items") != std::string::npos);
    e = error_of([] { render("{{ 'ab' * 100000000 }}"); }, Status::invalid_argument);
    CHECK(e == "chat template line 1: a string passes 64 MiB");
    e = error_of([] { render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"); },
                 Status::invalid_argument);
    CHECK(e == "chat template line 1: the template takes more than 2000000 steps");
    e = error_of([] { render("{{ 9223372036854775807 + 1 }}"); }, Status::invalid_argument);
    CHECK(e == "chat template line 1: integer overflow");
    e = error_of([] { render("{{ 'a b'.split('') }}"); }, Status::invalid_argument);
    CHECK(e == "chat template line 1: split() needs a non-empty string separator");
    CHECK(render("{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ (-1) ** 1000000000000 }} {{ 2 ** 62 }}") ==
          "-4 2 -2 1 4611686018427387904");
}
