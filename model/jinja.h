// A Jinja2 subset for chat templates: enough of the language to render the chat_template of Hugging Face model
// folders (Qwen2/Qwen3/Qwen3.5 and templates like them) exactly as transformers' apply_chat_template renders them.
//
// The environment is transformers' (ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loop
// controls): the first newline after a block or comment tag is dropped, spaces and tabs before a block or comment
// tag that starts a line are dropped, `-` in a tag strips the whitespace on that side, `+` turns lstrip off.
//
// Statements: if/elif/else, for (tuple targets, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/
// length/previtem/nextitem), break/continue, set (name, ns.attribute, and the block form), macro (defaults,
// keyword arguments), generation/endgeneration (rendered as its body), raw.
// Expressions: literals (strings with Python escapes, ints, floats, true/false/none in both cases, lists, tuples,
// dicts), names, attributes, subscripts and slices, calls, filters, tests (`is [not]`), `not/and/or`, `in/not in`,
// comparisons, + - * / // % ** ~, unary minus, `a if c else b`.
// Globals: namespace(), range(), dict(), raise_exception(), strftime_now(). Filters, tests and the methods of
// strings, dicts and lists: see jinja.cpp (an unknown filter or test is an error when the template is parsed).
// Values follow Python: `{{ true }}` prints True, `|string` of a dict is its repr, `|tojson` is transformers' own
// (json.dumps with ensure_ascii=False, separators ", " and ": ", keys in insertion order), strings are indexed
// and measured in code points.
//
// Errors: hy::Error(Status::format) "chat template line L: ..." for a template that does not parse,
// hy::Error(Status::invalid_argument) "chat template line L: ..." when rendering fails (raise_exception's message,
// an undefined value used as an object, a type error). Rendering has no side effects outside its output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace hy::jinja {

struct Value;
using Array = std::vector<Value>;
// A dict, keys in insertion order (as Python's). A namespace() is an object with `ns` set (only a namespace's
// attributes can be assigned with `set`).
struct Object {
    std::vector<std::pair<std::string, Value>> items;
    bool ns = false;
    const Value* find(const std::string& key) const;
    void set(const std::string& key, Value v);
};
struct Args;
class Renderer;
using Function = std::function<Value(Renderer&, Args&)>;

struct Value {
    enum class Type { undefined, none, boolean, integer, number, string, array, object, function };
    Type type = Type::undefined;
    bool b = false;
    int64_t i = 0;
    double d = 0;
    std::string s;
    std::shared_ptr<Array> a;  // shared: a namespace's lists and dicts are mutated in place, as in Python
    std::shared_ptr<Object> o;
    std::shared_ptr<Function> f;

    Value() = default;
    Value(std::nullptr_t) : type(Type::none) {}
    Value(bool v) : type(Type::boolean), b(v) {}
    Value(int v) : type(Type::integer), i(v) {}
    Value(int64_t v) : type(Type::integer), i(v) {}
    Value(double v) : type(Type::number), d(v) {}
    Value(std::string v) : type(Type::string), s(std::move(v)) {}
    Value(const char* v) : type(Type::string), s(v) {}
    static Value array(Array items = {});
    static Value object();
    static Value function(Function fn);

    bool is_undefined() const { return type == Type::undefined; }
    bool is_none() const { return type == Type::none; }
    bool is_string() const { return type == Type::string; }
    bool is_array() const { return type == Type::array; }
    bool is_object() const { return type == Type::object; }
    bool is_number() const { return type == Type::integer || type == Type::number || type == Type::boolean; }
    bool truthy() const;
};

// JSON (ordered: keys keep the request's order) to a Value and back.
Value from_json(const nlohmann::ordered_json& j);
nlohmann::ordered_json to_json(const Value& v);

// Python's str() of a value as Jinja prints it ("" for undefined, None, True, 1.5, ['a', 1], {'k': 'v'}).
std::string to_str(const Value& v);
// transformers' tojson: json.dumps(v, ensure_ascii=False, indent=indent (< 0: none)).
std::string to_json_text(const Value& v, int indent = -1);

struct Node;

class Template {
public:
    // Parses `source`; throws Error(format) "chat template line L: ..." naming what is wrong.
    explicit Template(const std::string& source);
    ~Template();
    Template(Template&&) noexcept;
    Template& operator=(Template&&) noexcept;

    // Renders with `context` (an object: messages, tools, add_generation_prompt, ...). Throws
    // Error(invalid_argument) "chat template line L: ..." (raise_exception, type errors).
    std::string render(const Value& context) const;

private:
    std::unique_ptr<Node> root_;
};

}  // namespace hy::jinja
