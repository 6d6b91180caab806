// The Jinja2 subset of chat templates (see jinja.h): the template is split into text and tags, each tag's
// expression is parsed into a small tree, and the tree is rendered by a tree walker over Python-like values.
#include "model/jinja.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>

#include "base/common.h"
#include "model/utf8.h"

namespace hy::jinja {

// ---- values -----------------------------------------------------------------------------------------------------

const Value* Object::find(const std::string& key) const {
    for (const auto& [k, v] : items)
        if (k == key) return &v;
    return nullptr;
}

void Object::set(const std::string& key, Value v) {
    for (auto& [k, old] : items)
        if (k == key) {
            old = std::move(v);
            return;
        }
    items.emplace_back(key, std::move(v));
}

Value Value::array(Array items) {
    Value v;
    v.type = Type::array;
    v.a = std::make_shared<Array>(std::move(items));
    return v;
}

Value Value::object() {
    Value v;
    v.type = Type::object;
    v.o = std::make_shared<Object>();
    return v;
}

Value Value::function(Function fn) {
    Value v;
    v.type = Type::function;
    v.f = std::make_shared<Function>(std::move(fn));
    return v;
}

bool Value::truthy() const {
    switch (type) {
        case Type::undefined:
        case Type::none: return false;
        case Type::boolean: return b;
        case Type::integer: return i != 0;
        case Type::number: return d != 0;
        case Type::string: return !s.empty();
        case Type::array: return !a->empty();
        case Type::object: return !o->items.empty();
        case Type::function: return true;
    }
    return false;
}

Value from_json(const nlohmann::ordered_json& j) {
    switch (j.type()) {
        case nlohmann::ordered_json::value_t::null: return Value(nullptr);
        case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
        case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
        case nlohmann::ordered_json::value_t::number_unsigned: return Value(int64_t(j.get<uint64_t>()));
        case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
        case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
        case nlohmann::ordered_json::value_t::array: {
            Array items;
            for (const auto& e : j) items.push_back(from_json(e));
            return Value::array(std::move(items));
        }
        case nlohmann::ordered_json::value_t::object: {
            Value v = Value::object();
            for (auto it = j.begin(); it != j.end(); ++it) v.o->items.emplace_back(it.key(), from_json(it.value()));
            return v;
        }
        default: return Value();
    }
}

nlohmann::ordered_json to_json(const Value& v) {
    using T = Value::Type;
    switch (v.type) {
        case T::undefined:
        case T::none:
        case T::function: return nullptr;
        case T::boolean: return v.b;
        case T::integer: return v.i;
        case T::number: return v.d;
        case T::string: return v.s;
        case T::array: {
            auto j = nlohmann::ordered_json::array();
            for (const Value& e : *v.a) j.push_back(to_json(e));
            return j;
        }
        case T::object: {
            auto j = nlohmann::ordered_json::object();
            for (const auto& [k, e] : v.o->items) j[k] = to_json(e);
            return j;
        }
    }
    return nullptr;
}

namespace {

// Python's repr of a float (the shortest digits that read back, fixed notation for exponents in [-4, 16)).
std::string float_repr(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
    char buf[64];
    for (int prec = 0; prec < 17; prec++) {
        std::snprintf(buf, sizeof buf, "%.*e", prec, x);
        if (std::strtod(buf, nullptr) == x) break;
    }
    std::string m = buf;
    const size_t e = m.find('e');
    const int exp = std::atoi(m.c_str() + e + 1);
    std::string digits;
    const bool neg = m[0] == '-';
    for (size_t k = neg ? 1 : 0; k < e; k++)
        if (m[k] != '.') digits += m[k];
    std::string out = neg ? "-" : "";
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out += "0." + std::string(size_t(-exp - 1), '0') + digits;
        } else if (size_t(exp + 1) >= digits.size()) {
            out += digits + std::string(size_t(exp + 1) - digits.size(), '0') + ".0";
        } else {
            out += digits.substr(0, size_t(exp + 1)) + "." + digits.substr(size_t(exp + 1));
        }
        return out;
    }
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
}

std::string str_repr(const std::string& s) {
    const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
    const char q = dq ? '"' : '\'';
    std::string out(1, q);
    for (unsigned char c : s) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == q) {
            out += '\\';
            out += char(c);
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7f) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            out += b;
        } else {
            out += char(c);
        }
    }
    return out + q;
}

std::string repr(const Value& v) {
    if (v.is_string()) return str_repr(v.s);
    if (v.is_array()) {
        std::string out = "[";
        for (size_t k = 0; k < v.a->size(); k++) out += (k ? ", " : "") + repr((*v.a)[k]);
        return out + "]";
    }
    if (v.is_object()) {
        std::string out = "{";
        bool first = true;
        for (const auto& [key, e] : v.o->items) {
            out += (first ? "" : ", ") + str_repr(key) + ": " + repr(e);
            first = false;
        }
        return out + "}";
    }
    return to_str(v);
}

void json_string(std::string& out, const std::string& s) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (c < 0x20) {
                    char b[8];
                    std::snprintf(b, sizeof b, "\\u%04x", c);
                    out += b;
                } else {
                    out += char(c);
                }
        }
    }
    out += '"';
}

void json_text(std::string& out, const Value& v, int indent, int depth) {
    using T = Value::Type;
    const auto newline = [&](int d) {
        out += '\n';
        out.append(size_t(indent * d), ' ');
    };
    switch (v.type) {
        case T::undefined:
        case T::none:
        case T::function: out += "null"; return;
        case T::boolean: out += v.b ? "true" : "false"; return;
        case T::integer: out += std::to_string(v.i); return;
        case T::number:
            out += std::isnan(v.d) ? "NaN" : std::isinf(v.d) ? (v.d > 0 ? "Infinity" : "-Infinity") : float_repr(v.d);
            return;
        case T::string: json_string(out, v.s); return;
        case T::array:
            if (v.a->empty()) {
                out += "[]";
                return;
            }
            out += '[';
            for (size_t k = 0; k < v.a->size(); k++) {
                if (k) out += indent >= 0 ? "," : ", ";
                if (indent >= 0) newline(depth + 1);
                json_text(out, (*v.a)[k], indent, depth + 1);
            }
            if (indent >= 0) newline(depth);
            out += ']';
            return;
        case T::object: {
            if (v.o->items.empty()) {
                out += "{}";
                return;
            }
            out += '{';
            bool first = true;
            for (const auto& [key, e] : v.o->items) {
                if (!first) out += indent >= 0 ? "," : ", ";
                first = false;
                if (indent >= 0) newline(depth + 1);
                json_string(out, key);
                out += ": ";
                json_text(out, e, indent, depth + 1);
            }
            if (indent >= 0) newline(depth);
            out += '}';
            return;
        }
    }
}

// Code point boundaries of a UTF-8 string: offsets of each code point, then s.size().
std::vector<size_t> cp_offsets(const std::string& s) {
    std::vector<size_t> off;
    for (size_t p = 0; p < s.size();) {
        off.push_back(p);
        const Utf8Step st = utf8_step(reinterpret_cast<const unsigned char*>(s.data()) + p, s.size() - p);
        p += size_t(st.len);
    }
    off.push_back(s.size());
    return off;
}

}  // namespace

std::string to_str(const Value& v) {
    using T = Value::Type;
    switch (v.type) {
        case T::undefined: return "";
        case T::none: return "None";
        case T::boolean: return v.b ? "True" : "False";
        case T::integer: return std::to_string(v.i);
        case T::number: return float_repr(v.d);
        case T::string: return v.s;
        case T::array:
        case T::object: return repr(v);
        case T::function: return "<function>";
    }
    return "";
}

std::string to_json_text(const Value& v, int indent) {
    std::string out;
    json_text(out, v, indent, 0);
    return out;
}

// ---- the template's pieces -----------------------------------------------------------------------------------------

namespace {

struct Piece {
    enum Kind { text, expr, stmt } kind;
    std::string s;
    int line;
};

[[noreturn]] void parse_fail(int line, const std::string& msg) {
    throw Error(Status::format, "chat template line " + std::to_string(line) + ": " + msg);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string rstrip_ws(std::string s) {
    while (!s.empty() && is_space(s.back())) s.pop_back();
    return s;
}

// Splits the source into text, {{ expressions }} and {% statements %} (comments dropped), applying whitespace
// control and transformers' trim_blocks and lstrip_blocks.
std::vector<Piece> split_template(const std::string& src) {
    std::vector<Piece> out;
    size_t pos = 0;
    bool lstrip_next = false, trim_newline = false;
    int line = 1;
    auto count_lines = [&](size_t from, size_t to) {
        for (size_t k = from; k < to; k++) line += src[k] == '\n';
    };
    while (true) {
        size_t open = pos;
        while ((open = src.find('{', open)) != std::string::npos) {
            if (open + 1 < src.size() && (src[open + 1] == '{' || src[open + 1] == '%' || src[open + 1] == '#')) break;
            open++;
        }
        size_t text_begin = pos;
        const size_t text_end = open == std::string::npos ? src.size() : open;
        if (lstrip_next) {
            while (text_begin < text_end && is_space(src[text_begin])) text_begin++;
        } else if (trim_newline) {
            if (text_begin < text_end && src[text_begin] == '\n')
                text_begin++;
            else if (text_begin + 1 < text_end && src[text_begin] == '\r' && src[text_begin + 1] == '\n')
                text_begin += 2;
        }
        std::string text = src.substr(text_begin, text_end - text_begin);
        const int text_line = line;
        count_lines(pos, text_end);
        if (open == std::string::npos) {
            if (!text.empty()) out.push_back({Piece::text, text, text_line});
            break;
        }
        const char kind = src[open + 1];
        size_t inner = open + 2;
        const char mark = inner < src.size() ? src[inner] : 0;
        if (mark == '-') {
            text = rstrip_ws(text);
            inner++;
        } else if (mark == '+') {
            inner++;
        } else if (kind != '{') {  // lstrip_blocks: spaces and tabs from the line's start up to a block tag
            const size_t nl = text.rfind('\n');
            const size_t from = nl == std::string::npos ? 0 : nl + 1;
            const bool line_start = nl != std::string::npos || text_begin == 0 || src[text_begin - 1] == '\n';
            if (line_start && text.find_first_not_of(" \t", from) == std::string::npos) text.resize(from);
        }
        if (!text.empty()) out.push_back({Piece::text, text, text_line});
        const int tag_line = line;
        // Find the closing delimiter (outside string literals for expressions and statements).
        const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
        size_t end = inner;
        if (kind == '#') {
            end = src.find(close, inner);
        } else {
            char quote = 0;
            int depth = 0;  // brackets open: {'a': {}}}} closes after the dict
            for (; end < src.size(); end++) {
                const char c = src[end];
                if (quote) {
                    if (c == '\\')
                        end++;
                    else if (c == quote)
                        quote = 0;
                } else if (c == '\'' || c == '"') {
                    quote = c;
                } else if (depth == 0 && src.compare(end, 2, close) == 0) {
                    break;
                } else if (c == '(' || c == '[' || c == '{') {
                    depth++;
                } else if ((c == ')' || c == ']' || c == '}') && depth > 0) {
                    depth--;
                }
            }
            if (end >= src.size()) end = std::string::npos;
        }
        if (end == std::string::npos)
            parse_fail(tag_line, std::string("unclosed ") + (kind == '{' ? "{{" : kind == '%' ? "{%" : "{#"));
        std::string body = src.substr(inner, end - inner);
        lstrip_next = trim_newline = false;
        if (!body.empty() && body.back() == '-') {
            body.pop_back();
            lstrip_next = true;
        } else if (!body.empty() && body.back() == '+') {
            body.pop_back();
        } else {
            trim_newline = kind != '{';
        }
        count_lines(open, end + 2);
        pos = end + 2;
        if (kind == '#') continue;
        // {% raw %} ... {% endraw %}: the text between is output as is.
        const size_t b0 = body.find_first_not_of(" \t\r\n");
        if (kind == '%' && b0 != std::string::npos && rstrip_ws(body.substr(b0)) == "raw") {
            size_t r = pos;
            size_t found = std::string::npos, after = std::string::npos;
            while ((r = src.find("{%", r)) != std::string::npos) {
                size_t k = r + 2;
                if (k < src.size() && (src[k] == '-' || src[k] == '+')) k++;
                while (k < src.size() && is_space(src[k])) k++;
                if (src.compare(k, 6, "endraw") == 0) {
                    size_t c = src.find("%}", k);
                    if (c == std::string::npos) break;
                    found = r;
                    after = c + 2;
                    if (src[r + 2] == '-') {
                        std::string t = src.substr(pos, r - pos);
                        out.push_back({Piece::text, rstrip_ws(t), tag_line});
                    } else {
                        out.push_back({Piece::text, src.substr(pos, r - pos), tag_line});
                    }
                    lstrip_next = src[c - 1] == '-';
                    trim_newline = !lstrip_next;
                    break;
                }
                r += 2;
            }
            if (found == std::string::npos) parse_fail(tag_line, "{% raw %} without {% endraw %}");
            count_lines(pos, after);
            pos = after;
            continue;
        }
        out.push_back({kind == '{' ? Piece::expr : Piece::stmt, body, tag_line});
    }
    return out;
}

// ---- expression tokens -----------------------------------------------------------------------------------------

struct Tok {
    enum Kind { name, integer, number, string, op, end } kind = end;
    std::string s;
    int64_t i = 0;
    double d = 0;
};

std::vector<Tok> lex(const std::string& src, int line) {
    std::vector<Tok> out;
    size_t p = 0;
    while (p < src.size()) {
        const char c = src[p];
        if (is_space(c)) {
            p++;
            continue;
        }
        Tok t;
        if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
            size_t q = p;
            while (q < src.size() && (std::isalnum(static_cast<unsigned char>(src[q])) || src[q] == '_')) q++;
            t.kind = Tok::name;
            t.s = src.substr(p, q - p);
            p = q;
        } else if (std::isdigit(static_cast<unsigned char>(c))) {
            size_t q = p;
            bool is_float = false;
            while (q < src.size() && (std::isdigit(static_cast<unsigned char>(src[q])) || src[q] == '_')) q++;
            if (q + 1 < src.size() && src[q] == '.' && std::isdigit(static_cast<unsigned char>(src[q + 1]))) {
                is_float = true;
                q++;
                while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) q++;
            }
            if (q < src.size() && (src[q] == 'e' || src[q] == 'E')) {
                size_t r = q + 1;
                if (r < src.size() && (src[r] == '+' || src[r] == '-')) r++;
                if (r < src.size() && std::isdigit(static_cast<unsigned char>(src[r]))) {
                    is_float = true;
                    q = r;
                    while (q < src.size() && std::isdigit(static_cast<unsigned char>(src[q]))) q++;
                }
            }
            std::string num;
            for (size_t k = p; k < q; k++)
                if (src[k] != '_') num += src[k];
            if (is_float) {
                t.kind = Tok::number;
                t.d = std::strtod(num.c_str(), nullptr);
            } else {
                t.kind = Tok::integer;
                t.i = std::strtoll(num.c_str(), nullptr, 10);
            }
            p = q;
        } else if (c == '\'' || c == '"') {
            t.kind = Tok::string;
            size_t q = p + 1;
            for (; q < src.size() && src[q] != c; q++) {
                if (src[q] != '\\' || q + 1 >= src.size()) {
                    t.s += src[q];
                    continue;
                }
                const char e = src[++q];
                switch (e) {
                    case 'n': t.s += '\n'; break;
                    case 't': t.s += '\t'; break;
                    case 'r': t.s += '\r'; break;
                    case '0': t.s += '\0'; break;
                    case 'b': t.s += '\b'; break;
                    case 'f': t.s += '\f'; break;
                    case 'v': t.s += '\v'; break;
                    case '\\':
                    case '\'':
                    case '"': t.s += e; break;
                    case '\n': break;
                    case 'x':
                    case 'u':
                    case 'U': {
                        const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                        const std::string hex = src.substr(q + 1, n);
                        if (hex.size() != n || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
                            parse_fail(line, "bad \\" + std::string(1, e) + " escape in string");
                        const unsigned long cp = std::strtoul(hex.c_str(), nullptr, 16);
                        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                            parse_fail(line, "\\" + std::string(1, e) + hex + " is not a Unicode scalar value");
                        append_utf8(t.s, uint32_t(cp));
                        q += n;
                        break;
                    }
                    default: t.s += '\\'; t.s += e;
                }
            }
            if (q >= src.size()) parse_fail(line, "unterminated string literal");
            p = q + 1;
        } else {
            static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".",
                                        ",",  ":",  "|",  "~",  "+",  "-",  "*", "/", "%", "<", ">", "="};
            t.kind = Tok::op;
            for (const char* o : ops)
                if (src.compare(p, std::strlen(o), o) == 0) {
                    t.s = o;
                    break;
                }
            if (t.s.empty()) parse_fail(line, std::string("unexpected character '") + c + "'");
            p += t.s.size();
        }
        out.push_back(std::move(t));
    }
    out.push_back(Tok{});
    return out;
}

}  // namespace

// ---- syntax tree ---------------------------------------------------------------------------------------------------

struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    // The argument `name` at position k or by keyword, else `def`.
    Value get(size_t k, const char* name, Value def = Value()) const {
        for (const auto& [n, v] : kw)
            if (n == name) return v;
        return k < pos.size() ? pos[k] : def;
    }
};

namespace {

using FilterFn = Value (*)(Renderer&, const Value&, const Args&);
using TestFn = bool (*)(Renderer&, const Value&, const Args&);

enum class Op { add, sub, mul, div, floordiv, mod, pow, concat, eq, ne, lt, le, gt, ge, in, not_in };

struct Expr {
    enum Kind {
        literal,
        var,
        list,
        tuple,
        dict,
        attr,
        index,
        slice,
        call,
        filter,
        test,
        not_,
        neg,
        binary,
        and_,
        or_,
        cond
    } kind;
    Value value;                              // literal
    std::string name;                         // name, attr, filter/test name
    std::vector<std::unique_ptr<Expr>> kids;  // operands; call/filter/test: subject first, then arguments
    std::vector<std::string> kw;              // keyword names of the last kw.size() arguments
    Op op = Op::add;
    FilterFn filter_fn = nullptr;
    TestFn test_fn = nullptr;
    bool negate = false;
    bool has[3] = {false, false, false};  // slice: start, stop, step given
};
using ExprP = std::unique_ptr<Expr>;

}  // namespace

struct Node {
    enum Kind { block, raw_text, output, if_, for_, set, set_block, macro, brk, cont } kind = block;
    int line = 0;
    std::string text;                         // text; set/set_block/macro: the name
    std::string attr;                         // set: the attribute of a namespace (set ns.attr = ...)
    std::vector<ExprP> exprs;                 // output: [e]; if_: conditions; for_: [iterable, filter?]; set: [e]
    std::vector<std::unique_ptr<Node>> kids;  // block: statements; if_: bodies (one per condition, then else)
    std::vector<std::string> targets;         // for_: loop variables; macro: parameters
    std::vector<ExprP> defaults;              // macro: default of each parameter (null: none)
    std::unique_ptr<Node> body, else_body;    // for_, set_block, macro
    bool has_filter = false;
};

// ---- filters and tests (declared here, defined below) ---------------------------------------------------------------

namespace {
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
}  // namespace

// ---- parser ------------------------------------------------------------------------------------------------------

namespace {

class Parser {
public:
    Parser(std::vector<Tok> toks, int line) : t_(std::move(toks)), line_(line) {}

    const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
    bool at_op(const char* o) const { return peek().kind == Tok::op && peek().s == o; }
    bool at_name(const char* n) const { return peek().kind == Tok::name && peek().s == n; }
    bool at_end() const { return peek().kind == Tok::end; }
    const Tok& next() { return t_[std::min(p_++, t_.size() - 1)]; }
    [[noreturn]] void fail(const std::string& msg) const { parse_fail(line_, msg); }
    std::string describe(const Tok& t) const {
        return t.kind == Tok::end ? "end of tag" : t.kind == Tok::string ? "string" : "'" + t.s + "'";
    }
    void expect_op(const char* o) {
        if (!at_op(o)) fail(std::string("expected '") + o + "', found " + describe(peek()));
        p_++;
    }
    std::string expect_name() {
        if (peek().kind != Tok::name) fail("expected a name, found " + describe(peek()));
        return next().s;
    }
    void expect_end() {
        if (!at_end()) fail("unexpected " + describe(peek()));
    }

    ExprP make(Expr::Kind k) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        return e;
    }

    ExprP expression(bool with_cond = true) {
        const Nesting guard(*this);
        ExprP e = or_expr();
        if (with_cond && at_name("if")) {
            next();
            ExprP c = make(Expr::cond);
            ExprP test = or_expr();
            ExprP other;
            if (at_name("else")) {
                next();
                other = expression();
            }
            c->kids.push_back(std::move(e));
            c->kids.push_back(std::move(test));
            c->kids.push_back(std::move(other));
            return c;
        }
        return e;
    }
    // A tuple without parentheses (for loops' iterables and set's values): `a, b` or a single expression.
    ExprP tuple_or_expr(bool with_cond = true) {
        ExprP e = expression(with_cond);
        if (!at_op(",")) return e;
        ExprP t = make(Expr::tuple);
        t->kids.push_back(std::move(e));
        while (at_op(",")) {
            next();
            if (at_end() || at_name("if")) break;
            t->kids.push_back(expression(with_cond));
        }
        return t;
    }

private:
    ExprP binary(Op op, ExprP a, ExprP b) {
        ExprP e = make(Expr::binary);
        e->op = op;
        e->kids.push_back(std::move(a));
        e->kids.push_back(std::move(b));
        return e;
    }
    ExprP or_expr() {
        ExprP e = and_expr();
        while (at_name("or")) {
            next();
            ExprP o = make(Expr::or_);
            o->kids.push_back(std::move(e));
            o->kids.push_back(and_expr());
            e = std::move(o);
        }
        return e;
    }
    ExprP and_expr() {
        ExprP e = not_expr();
        while (at_name("and")) {
            next();
            ExprP o = make(Expr::and_);
            o->kids.push_back(std::move(e));
            o->kids.push_back(not_expr());
            e = std::move(o);
        }
        return e;
    }
    ExprP not_expr() {
        const Nesting guard(*this);
        if (at_name("not")) {
            next();
            ExprP e = make(Expr::not_);
            e->kids.push_back(not_expr());
            return e;
        }
        return compare();
    }
    ExprP compare() {
        ExprP e = math1();
        while (true) {
            Op op;
            if (peek().kind == Tok::op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" ||
                                           peek().s == "<=" || peek().s == ">" || peek().s == ">=")) {
                const std::string& s = next().s;
                op = s == "=="   ? Op::eq
                     : s == "!=" ? Op::ne
                     : s == "<"  ? Op::lt
                     : s == "<=" ? Op::le
                     : s == ">"  ? Op::gt
                                 : Op::ge;
            } else if (at_name("in")) {
                next();
                op = Op::in;
            } else if (at_name("not") && peek(1).kind == Tok::name && peek(1).s == "in") {
                p_ += 2;
                op = Op::not_in;
            } else {
                return e;
            }
            e = binary(op, std::move(e), math1());
        }
    }
    ExprP math1() {
        ExprP e = concat();
        while (at_op("+") || at_op("-")) {
            const Op op = next().s == "+" ? Op::add : Op::sub;
            e = binary(op, std::move(e), concat());
        }
        return e;
    }
    ExprP concat() {
        ExprP e = math2();
        while (at_op("~")) {
            next();
            e = binary(Op::concat, std::move(e), math2());
        }
        return e;
    }
    ExprP math2() {
        ExprP e = pow_expr();
        while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
            const std::string& s = next().s;
            const Op op = s == "*" ? Op::mul : s == "/" ? Op::div : s == "//" ? Op::floordiv : Op::mod;
            e = binary(op, std::move(e), pow_expr());
        }
        return e;
    }
    ExprP pow_expr() {
        ExprP e = unary();
        while (at_op("**")) {
            next();
            e = binary(Op::pow, std::move(e), unary());
        }
        return e;
    }
    ExprP unary() {
        const Nesting guard(*this);
        if (at_op("-")) {
            next();
            ExprP e = make(Expr::neg);
            e->kids.push_back(unary_no_filter());
            return filters(std::move(e));
        }
        if (at_op("+")) {
            next();
            return filters(unary_no_filter());
        }
        return filters(postfix(primary()));
    }
    ExprP unary_no_filter() {
        const Nesting guard(*this);
        if (at_op("-")) {
            next();
            ExprP e = make(Expr::neg);
            e->kids.push_back(unary_no_filter());
            return e;
        }
        return postfix(primary());
    }
    void call_args(Expr& e) {
        expect_op("(");
        while (!at_op(")")) {
            if (peek().kind == Tok::name && peek(1).kind == Tok::op && peek(1).s == "=") {
                e.kw.push_back(next().s);
                next();
                e.kids.push_back(expression());
            } else {
                if (!e.kw.empty()) fail("a positional argument follows a keyword argument");
                e.kids.push_back(expression());
            }
            if (!at_op(",")) break;
            next();
        }
        expect_op(")");
    }
    ExprP filters(ExprP e) {
        while (true) {
            if (at_op("|")) {
                next();
                std::string name = expect_name();
                while (at_op(".")) {  // dotted filter names are not ours
                    next();
                    name += "." + expect_name();
                }
                ExprP f = make(Expr::filter);
                f->name = name;
                f->filter_fn = find_filter(name);
                if (!f->filter_fn) fail("unknown filter '" + name + "'");
                f->kids.push_back(std::move(e));
                if (at_op("(")) call_args(*f);
                e = std::move(f);
            } else if (at_name("is")) {
                next();
                ExprP t = make(Expr::test);
                if (at_name("not")) {
                    next();
                    t->negate = true;
                }
                std::string name = expect_name();
                t->name = name;
                t->test_fn = find_test(name);
                if (!t->test_fn) fail("unknown test '" + name + "'");
                t->kids.push_back(std::move(e));
                if (at_op("(")) {
                    call_args(*t);
                } else if ((peek().kind == Tok::name || peek().kind == Tok::string || peek().kind == Tok::integer ||
                            peek().kind == Tok::number || at_op("[") || at_op("{")) &&
                           !at_name("else") && !at_name("or") && !at_name("and") && !at_name("if") && !at_name("in") &&
                           !at_name("is") && !at_name("not")) {
                    t->kids.push_back(postfix(primary()));
                }
                e = std::move(t);
            } else if (at_op("(")) {
                ExprP c = make(Expr::call);
                c->kids.push_back(std::move(e));
                call_args(*c);
                e = std::move(c);
            } else {
                return e;
            }
        }
    }
    ExprP postfix(ExprP e) {
        while (true) {
            if (at_op(".")) {
                next();
                ExprP a = make(Expr::attr);
                if (peek().kind == Tok::integer) {  // x.0 is x[0]
                    a->kind = Expr::index;
                    a->kids.push_back(std::move(e));
                    ExprP lit = make(Expr::literal);
                    lit->value = Value(next().i);
                    a->kids.push_back(std::move(lit));
                } else {
                    a->name = expect_name();
                    a->kids.push_back(std::move(e));
                }
                e = std::move(a);
            } else if (at_op("[")) {
                next();
                ExprP parts[3];
                bool is_slice = false;
                for (int k = 0; k < 3; k++) {
                    if (!at_op(":") && !at_op("]")) parts[k] = expression();
                    if (at_op(":") && k < 2) {
                        next();
                        is_slice = true;
                    } else {
                        break;
                    }
                }
                expect_op("]");
                ExprP s = make(is_slice ? Expr::slice : Expr::index);
                if (!is_slice && !parts[0]) fail("empty subscript");
                s->kids.push_back(std::move(e));
                for (int k = 0; k < (is_slice ? 3 : 1); k++) {
                    s->has[k] = parts[k] != nullptr;
                    s->kids.push_back(parts[k] ? std::move(parts[k]) : make(Expr::literal));
                }
                e = std::move(s);
            } else if (at_op("(")) {
                ExprP c = make(Expr::call);
                c->kids.push_back(std::move(e));
                call_args(*c);
                e = std::move(c);
            } else {
                return e;
            }
        }
    }
    ExprP primary() {
        const Tok& t = next();
        ExprP e;
        switch (t.kind) {
            case Tok::name:
                e = make(Expr::literal);
                if (t.s == "true" || t.s == "True") {
                    e->value = Value(true);
                } else if (t.s == "false" || t.s == "False") {
                    e->value = Value(false);
                } else if (t.s == "none" || t.s == "None") {
                    e->value = Value(nullptr);
                } else {
                    e->kind = Expr::var;
                    e->name = t.s;
                }
                return e;
            case Tok::integer:
                e = make(Expr::literal);
                e->value = Value(t.i);
                return e;
            case Tok::number:
                e = make(Expr::literal);
                e->value = Value(t.d);
                return e;
            case Tok::string: {
                e = make(Expr::literal);
                std::string s = t.s;
                while (peek().kind == Tok::string) s += next().s;
                e->value = Value(s);
                return e;
            }
            case Tok::op:
                if (t.s == "(") {
                    if (at_op(")")) {
                        next();
                        return make(Expr::tuple);
                    }
                    ExprP first = expression();
                    if (at_op(")")) {
                        next();
                        return first;
                    }
                    e = make(Expr::tuple);
                    e->kids.push_back(std::move(first));
                    while (at_op(",")) {
                        next();
                        if (at_op(")")) break;
                        e->kids.push_back(expression());
                    }
                    expect_op(")");
                    return e;
                }
                if (t.s == "[") {
                    e = make(Expr::list);
                    while (!at_op("]")) {
                        e->kids.push_back(expression());
                        if (!at_op(",")) break;
                        next();
                    }
                    expect_op("]");
                    return e;
                }
                if (t.s == "{") {
                    e = make(Expr::dict);
                    while (!at_op("}")) {
                        e->kids.push_back(expression());
                        expect_op(":");
                        e->kids.push_back(expression());
                        if (!at_op(",")) break;
                        next();
                    }
                    expect_op("}");
                    return e;
                }
                break;
            default: break;
        }
        fail("unexpected " + describe(t) + " in an expression");
    }

    // The parser recurses once per nesting level (parentheses, lists, unary operators): a template that nests
    // deeper than kMaxDepth is refused rather than overflowing the stack.
    static constexpr int kMaxDepth = 200;
    struct Nesting {
        Parser& p;
        explicit Nesting(Parser& parser) : p(parser) {
            if (++p.depth_ > kMaxDepth) p.fail("expression nests deeper than " + std::to_string(kMaxDepth) + " levels");
        }
        ~Nesting() { p.depth_--; }
    };
    std::vector<Tok> t_;
    size_t p_ = 0;
    int line_;
    int depth_ = 0;
};

// Builds the statement tree from the pieces.
class TreeBuilder {
public:
    explicit TreeBuilder(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

    std::unique_ptr<Node> build() {
        auto root = std::make_unique<Node>();
        std::string end = parse_block(*root, {});
        if (!end.empty()) parse_fail(last_line_, "unexpected {% " + end + " %}");
        return root;
    }

private:
    // Parses pieces into `block` until a statement whose first word is in `stops`; returns that word ("" at the
    // end of the template), leaving the statement's parser in stop_parser_.
    std::string parse_block(Node& block, std::initializer_list<const char*> stops) {
        struct Depth {
            int& d;
            explicit Depth(int& x) : d(x) { d++; }
            ~Depth() { d--; }
        } guard(depth_);
        if (depth_ > 200) parse_fail(last_line_, "blocks nest deeper than 200 levels");
        while (k_ < pieces_.size()) {
            const Piece& pc = pieces_[k_++];
            last_line_ = pc.line;
            auto n = std::make_unique<Node>();
            n->line = pc.line;
            if (pc.kind == Piece::text) {
                n->kind = Node::raw_text;
                n->text = pc.s;
                block.kids.push_back(std::move(n));
                continue;
            }
            Parser p(lex(pc.s, pc.line), pc.line);
            if (pc.kind == Piece::expr) {
                n->kind = Node::output;
                n->exprs.push_back(p.tuple_or_expr());
                p.expect_end();
                block.kids.push_back(std::move(n));
                continue;
            }
            const std::string word = p.expect_name();
            for (const char* s : stops)
                if (word == s) {
                    stop_parser_ = std::make_unique<Parser>(std::move(p));
                    return word;
                }
            if (word == "if") {
                n->kind = Node::if_;
                n->exprs.push_back(p.expression());
                p.expect_end();
                while (true) {
                    auto body = std::make_unique<Node>();
                    const std::string end = parse_block(*body, {"elif", "else", "endif"});
                    n->kids.push_back(std::move(body));
                    if (end == "elif") {
                        n->exprs.push_back(stop_parser_->expression());
                        stop_parser_->expect_end();
                    } else if (end == "else") {
                        stop_parser_->expect_end();
                        auto other = std::make_unique<Node>();
                        if (parse_block(*other, {"endif"}) != "endif") parse_fail(pc.line, "{% if %} without endif");
                        stop_parser_->expect_end();
                        n->kids.push_back(std::move(other));
                        break;
                    } else if (end == "endif") {
                        stop_parser_->expect_end();
                        break;
                    } else {
                        parse_fail(pc.line, "{% if %} without {% endif %}");
                    }
                }
            } else if (word == "for") {
                n->kind = Node::for_;
                n->targets.push_back(p.expect_name());
                while (p.at_op(",")) {
                    p.next();
                    n->targets.push_back(p.expect_name());
                }
                if (!p.at_name("in")) p.fail("expected 'in' in {% for %}");
                p.next();
                n->exprs.push_back(p.tuple_or_expr(false));
                if (p.at_name("if")) {
                    p.next();
                    n->exprs.push_back(p.expression());
                    n->has_filter = true;
                }
                if (p.at_name("recursive")) p.fail("recursive loops are not supported");
                p.expect_end();
                n->body = std::make_unique<Node>();
                std::string end = parse_block(*n->body, {"else", "endfor"});
                if (end == "else") {
                    stop_parser_->expect_end();
                    n->else_body = std::make_unique<Node>();
                    end = parse_block(*n->else_body, {"endfor"});
                }
                if (end != "endfor") parse_fail(pc.line, "{% for %} without {% endfor %}");
                stop_parser_->expect_end();
            } else if (word == "set") {
                n->text = p.expect_name();
                if (p.at_op(".")) {
                    p.next();
                    n->attr = p.expect_name();
                }
                if (p.at_op(",")) p.fail("tuple assignment in {% set %} is not supported");
                if (p.at_op("=")) {
                    p.next();
                    n->kind = Node::set;
                    n->exprs.push_back(p.tuple_or_expr());
                    p.expect_end();
                } else {
                    if (!n->attr.empty()) p.fail("expected '=' after a namespace attribute");
                    p.expect_end();
                    n->kind = Node::set_block;
                    n->body = std::make_unique<Node>();
                    if (parse_block(*n->body, {"endset"}) != "endset")
                        parse_fail(pc.line, "{% set %} without {% endset %}");
                    stop_parser_->expect_end();
                }
            } else if (word == "macro") {
                n->kind = Node::macro;
                n->text = p.expect_name();
                p.expect_op("(");
                while (!p.at_op(")")) {
                    n->targets.push_back(p.expect_name());
                    if (p.at_op("=")) {
                        p.next();
                        n->defaults.push_back(p.expression());
                    } else {
                        n->defaults.push_back(nullptr);
                    }
                    if (!p.at_op(",")) break;
                    p.next();
                }
                p.expect_op(")");
                p.expect_end();
                n->body = std::make_unique<Node>();
                if (parse_block(*n->body, {"endmacro"}) != "endmacro")
                    parse_fail(pc.line, "{% macro %} without {% endmacro %}");
            } else if (word == "generation") {  // transformers' assistant-mask marker: just its body
                p.expect_end();
                n->kind = Node::block;
                if (parse_block(*n, {"endgeneration"}) != "endgeneration")
                    parse_fail(pc.line, "{% generation %} without {% endgeneration %}");
            } else if (word == "break" || word == "continue") {
                p.expect_end();
                n->kind = word == "break" ? Node::brk : Node::cont;
            } else {
                p.fail("unsupported statement {% " + word + " %}");
            }
            block.kids.push_back(std::move(n));
        }
        return "";
    }

    std::vector<Piece> pieces_;
    size_t k_ = 0;
    int last_line_ = 1;
    int depth_ = 0;
    std::unique_ptr<Parser> stop_parser_;
};

}  // namespace

// ---- rendering -----------------------------------------------------------------------------------------------------

class Renderer {
public:
    using Frame = std::vector<std::pair<std::string, Value>>;
    enum class Flow { normal, brk, cont };

    explicit Renderer(const Value& context) : context_(context) { frames_.push_back(new_frame()); }
    // Empties what the render made and is still alive (frames, namespaces): a namespace can hold itself (set ns.x =
    // ns) and a macro the frame that holds it, reference cycles that would otherwise never be freed (the jinja fuzz
    // test's leak). The render's result is a string: nothing it made outlives it.
    ~Renderer() {
        for (const auto& w : made_objects_)
            if (auto o = w.lock()) o->items.clear();
        for (const auto& w : made_frames_)
            if (auto f = w.lock()) f->clear();
    }
    Renderer(const Renderer&) = delete;
    Renderer& operator=(const Renderer&) = delete;

    std::shared_ptr<Frame> new_frame() {
        auto f = std::make_shared<Frame>();
        made_frames_.push_back(f);
        return f;
    }
    // A namespace() object the render made (emptied at the end, as the frames).
    void made(const std::shared_ptr<Object>& o) { made_objects_.push_back(o); }

    [[noreturn]] void fail(const std::string& msg) const {
        throw Error(Status::invalid_argument, "chat template line " + std::to_string(line_) + ": " + msg);
    }

    Value lookup(const std::string& name) const {
        for (size_t k = frames_.size(); k-- > 0;)
            for (const auto& [n, v] : *frames_[k])
                if (n == name) return v;
        if (context_.is_object())
            if (const Value* v = context_.o->find(name)) return *v;
        return builtin(name);
    }

    void assign(const std::string& name, Value v) {
        Frame& f = *frames_.back();
        for (auto& [n, old] : f)
            if (n == name) {
                old = std::move(v);
                return;
            }
        f.emplace_back(name, std::move(v));
    }

    Flow exec(const Node& n, std::string& out) {
        if (n.line) line_ = n.line;
        tick();
        if (out.size() > kMaxText) fail("the rendered text passes " + std::to_string(kMaxText >> 20) + " MiB");
        switch (n.kind) {
            case Node::block:
                for (const auto& k : n.kids) {
                    const Flow f = exec(*k, out);
                    if (f != Flow::normal) return f;
                }
                return Flow::normal;
            case Node::raw_text: out += n.text; return Flow::normal;
            case Node::output: out += to_str(eval(*n.exprs[0])); return Flow::normal;
            case Node::if_:
                for (size_t k = 0; k < n.exprs.size(); k++)
                    if (eval(*n.exprs[k]).truthy()) return exec(*n.kids[k], out);
                if (n.kids.size() > n.exprs.size()) return exec(*n.kids.back(), out);
                return Flow::normal;
            case Node::for_: exec_for(n, out); return Flow::normal;
            case Node::set: {
                Value v = eval(*n.exprs[0]);
                if (n.attr.empty()) {
                    assign(n.text, std::move(v));
                } else {
                    const Value ns = lookup(n.text);
                    if (!ns.is_object() || !ns.o->ns)
                        fail("cannot set attribute '" + n.attr + "' of '" + n.text + "': it is not a namespace()");
                    ns.o->set(n.attr, std::move(v));
                }
                return Flow::normal;
            }
            case Node::set_block: {
                std::string s;
                exec(*n.body, s);
                assign(n.text, Value(s));
                return Flow::normal;
            }
            case Node::macro: {
                const Node* def = &n;
                // (weak: the macro is stored in the frame it refers to, and a cycle would never be freed)
                std::weak_ptr<Frame> root = frames_.front();
                std::vector<Value> defaults;
                for (const auto& d : n.defaults) defaults.push_back(d ? eval(*d) : Value());
                assign(n.text, Value::function([def, root, defaults](Renderer& r, Args& args) {
                           const std::shared_ptr<Frame> frame = root.lock();
                           if (!frame) r.fail("macro '" + def->text + "' called after its template ended");
                           return r.call_macro(*def, frame, defaults, args);
                       }));
                return Flow::normal;
            }
            case Node::brk: return Flow::brk;
            case Node::cont: return Flow::cont;
        }
        return Flow::normal;
    }

    Value call_macro(const Node& def, const std::shared_ptr<Frame>& root, const std::vector<Value>& defaults,
                     Args& args) {
        if (macro_depth_ >= 64) fail("macro calls nest deeper than 64 levels (a recursive macro?)");
        auto frame = new_frame();
        if (args.pos.size() > def.targets.size())
            fail("macro '" + def.text + "' takes " + std::to_string(def.targets.size()) + " arguments, " +
                 std::to_string(args.pos.size()) + " given");
        for (const auto& [name, v] : args.kw)
            if (std::find(def.targets.begin(), def.targets.end(), name) == def.targets.end())
                fail("macro '" + def.text + "' has no argument '" + name + "'");
        for (size_t k = 0; k < def.targets.size(); k++)
            frame->emplace_back(def.targets[k], args.get(k, def.targets[k].c_str(), defaults[k]));
        std::vector<std::shared_ptr<Frame>> saved = std::move(frames_);
        frames_ = {root, frame};
        const int line = line_;
        std::string out;
        macro_depth_++;
        try {
            exec(*def.body, out);
        } catch (...) {
            macro_depth_--;
            frames_ = std::move(saved);
            throw;
        }
        macro_depth_--;
        frames_ = std::move(saved);
        line_ = line;
        return Value(out);
    }

    // The items a for loop or a filter iterates over: list items, dict keys, string characters; undefined and
    // none are empty.
    std::vector<Value> iterate(const Value& v) {
        switch (v.type) {
            case Value::Type::array: return *v.a;
            case Value::Type::object: {
                std::vector<Value> keys;
                for (const auto& [k, e] : v.o->items) keys.emplace_back(k);
                return keys;
            }
            case Value::Type::string: {
                std::vector<Value> chars;
                const std::vector<size_t> off = cp_offsets(v.s);
                for (size_t k = 0; k + 1 < off.size(); k++) chars.emplace_back(v.s.substr(off[k], off[k + 1] - off[k]));
                return chars;
            }
            case Value::Type::undefined:
            case Value::Type::none: return {};
            default: fail("cannot iterate over " + type_name(v));
        }
    }

    static std::string type_name(const Value& v) {
        switch (v.type) {
            case Value::Type::undefined: return "an undefined value";
            case Value::Type::none: return "none";
            case Value::Type::boolean: return "a boolean";
            case Value::Type::integer: return "an integer";
            case Value::Type::number: return "a float";
            case Value::Type::string: return "a string";
            case Value::Type::array: return "a list";
            case Value::Type::object: return "a dict";
            case Value::Type::function: return "a function";
        }
        return "a value";
    }

    void exec_for(const Node& n, std::string& out) {
        std::vector<Value> items = iterate(eval(*n.exprs[0]));
        frames_.push_back(new_frame());
        auto bind = [&](const Value& item) {
            if (n.targets.size() == 1) {
                assign(n.targets[0], item);
                return;
            }
            if (!item.is_array() || item.a->size() != n.targets.size())
                fail("cannot unpack " + type_name(item) + " into " + std::to_string(n.targets.size()) +
                     " loop variables");
            for (size_t k = 0; k < n.targets.size(); k++) assign(n.targets[k], (*item.a)[k]);
        };
        if (n.has_filter) {
            std::vector<Value> kept;
            for (const Value& item : items) {
                bind(item);
                if (eval(*n.exprs[1]).truthy()) kept.push_back(item);
            }
            items = std::move(kept);
        }
        try {
            const size_t len = items.size();
            for (size_t k = 0; k < len; k++) {
                bind(items[k]);
                Value loop = Value::object();
                auto& L = loop.o->items;
                L.emplace_back("index", Value(int64_t(k + 1)));
                L.emplace_back("index0", Value(int64_t(k)));
                L.emplace_back("revindex", Value(int64_t(len - k)));
                L.emplace_back("revindex0", Value(int64_t(len - k - 1)));
                L.emplace_back("first", Value(k == 0));
                L.emplace_back("last", Value(k + 1 == len));
                L.emplace_back("length", Value(int64_t(len)));
                L.emplace_back("previtem", k > 0 ? items[k - 1] : Value());
                L.emplace_back("nextitem", k + 1 < len ? items[k + 1] : Value());
                assign("loop", loop);
                if (exec(*n.body, out) == Flow::brk) break;
            }
            if (len == 0 && n.else_body) exec(*n.else_body, out);
        } catch (...) {
            frames_.pop_back();
            throw;
        }
        frames_.pop_back();
    }

    Args eval_args(const Expr& e, size_t first) {
        Args a;
        const size_t n_kw = e.kw.size();
        const size_t n_pos = e.kids.size() - first - n_kw;
        for (size_t k = 0; k < n_pos; k++) a.pos.push_back(eval(*e.kids[first + k]));
        for (size_t k = 0; k < n_kw; k++) a.kw.emplace_back(e.kw[k], eval(*e.kids[first + n_pos + k]));
        return a;
    }

    Value eval(const Expr& e);
    Value call_method(const Value& obj, const std::string& name, Args& args);
    Value builtin(const std::string& name) const;
    Value binary(Op op, const Value& a, const Value& b);

    static bool equal(const Value& a, const Value& b) {
        using T = Value::Type;
        if (a.is_number() && b.is_number()) {
            if (a.type != T::number && b.type != T::number) return num_i(a) == num_i(b);
            return num_d(a) == num_d(b);
        }
        if (a.type != b.type) return false;
        switch (a.type) {
            case T::undefined:
            case T::none: return true;
            case T::string: return a.s == b.s;
            case T::array:
                if (a.a->size() != b.a->size()) return false;
                for (size_t k = 0; k < a.a->size(); k++)
                    if (!equal((*a.a)[k], (*b.a)[k])) return false;
                return true;
            case T::object:
                if (a.o->items.size() != b.o->items.size()) return false;
                for (const auto& [k, v] : a.o->items) {
                    const Value* w = b.o->find(k);
                    if (!w || !equal(v, *w)) return false;
                }
                return true;
            case T::function: return a.f == b.f;
            default: return false;
        }
    }
    static int64_t num_i(const Value& v) { return v.type == Value::Type::boolean ? int64_t(v.b) : v.i; }
    static double num_d(const Value& v) {
        return v.type == Value::Type::number ? v.d : v.type == Value::Type::boolean ? double(v.b) : double(v.i);
    }
    int compare(const Value& a, const Value& b) {
        if (a.is_number() && b.is_number()) {
            const double x = num_d(a), y = num_d(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        if (a.is_string() && b.is_string()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
        fail("cannot compare " + type_name(a) + " with " + type_name(b));
    }
    bool contains(const Value& hay, const Value& needle) {
        switch (hay.type) {
            case Value::Type::string:
                if (!needle.is_string()) fail("'in <string>' needs a string on the left, not " + type_name(needle));
                return hay.s.find(needle.s) != std::string::npos;
            case Value::Type::array:
                for (const Value& v : *hay.a)
                    if (equal(v, needle)) return true;
                return false;
            case Value::Type::object: return needle.is_string() && hay.o->find(needle.s) != nullptr;
            case Value::Type::undefined: fail("'in' on an undefined value");
            default: fail("'in' needs a string, list or dict on the right, not " + type_name(hay));
        }
    }

    int line_ = 0;
    // Limits that keep a template from hanging or exhausting the process: steps (statements and expressions
    // evaluated) per render, and the length of any string made and of the output.
    static constexpr uint64_t kMaxSteps = 2'000'000;
    static constexpr size_t kMaxText = size_t(64) << 20;
    void tick() {
        if (++steps_ > kMaxSteps) fail("the template takes more than " + std::to_string(kMaxSteps) + " steps");
    }
    void check_size(size_t n) {
        if (n > kMaxText) fail("a string passes " + std::to_string(kMaxText >> 20) + " MiB");
    }

private:
    uint64_t steps_ = 0;
    int macro_depth_ = 0;
    const Value& context_;
    std::vector<std::shared_ptr<Frame>> frames_;
    std::vector<std::weak_ptr<Frame>> made_frames_;    // every frame the render made (~Renderer)
    std::vector<std::weak_ptr<Object>> made_objects_;  // every namespace() it made (~Renderer)
};

namespace {

// Python slice semantics over n items: the indices selected by [start:stop:step].
std::vector<size_t> slice_indices(Renderer& r, int64_t n, const Value& start, const Value& stop, const Value& step) {
    auto as_int = [&](const Value& v, const char* what) -> int64_t {
        if (v.type == Value::Type::integer) return v.i;
        r.fail(std::string("slice ") + what + " must be an integer");
    };
    int64_t st = step.is_undefined() || step.is_none() ? 1 : as_int(step, "step");
    if (st == 0) r.fail("slice step cannot be zero");
    st = std::clamp<int64_t>(st, -n - 1, n + 1);  // (a larger step selects the same single item)
    auto clamp = [&](const Value& v, int64_t def, bool is_start) {
        if (v.is_undefined() || v.is_none()) return def;
        int64_t x = std::clamp<int64_t>(as_int(v, is_start ? "start" : "stop"), -n - 1, n + 1);
        if (x < 0) x += n;
        if (st > 0) return std::clamp<int64_t>(x, 0, n);
        return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t a = clamp(start, st > 0 ? 0 : n - 1, true), b = clamp(stop, st > 0 ? n : -1, false);
    std::vector<size_t> idx;
    for (int64_t k = a; st > 0 ? k < b : k > b; k += st) idx.push_back(size_t(k));
    return idx;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
    auto strip_cp = [&](uint32_t cp) {
        if (chars.is_string()) {
            std::vector<size_t> off = cp_offsets(chars.s);
            for (size_t k = 0; k + 1 < off.size(); k++) {
                const Utf8Step st =
                    utf8_step(reinterpret_cast<const unsigned char*>(chars.s.data()) + off[k], chars.s.size() - off[k]);
                if (st.cp == cp) return true;
            }
            return false;
        }
        return is_white_space(cp) || (cp >= 0x1c && cp <= 0x1f);
    };
    const std::vector<size_t> off = cp_offsets(s);
    size_t a = 0, b = off.size() - 1;
    auto cp_at = [&](size_t k) {
        return utf8_step(reinterpret_cast<const unsigned char*>(s.data()) + off[k], s.size() - off[k]).cp;
    };
    if (left)
        while (a < b && strip_cp(cp_at(a))) a++;
    if (right)
        while (b > a && strip_cp(cp_at(b - 1))) b--;
    return s.substr(off[a], off[b] - off[a]);
}

Value py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
    Array parts;
    if (sep.is_undefined() || sep.is_none()) {
        size_t p = 0;
        while (true) {
            while (p < s.size() && is_space(s[p])) p++;
            if (p >= s.size()) break;
            if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) {
                parts.emplace_back(s.substr(p));
                break;
            }
            size_t q = p;
            while (q < s.size() && !is_space(s[q])) q++;
            parts.emplace_back(s.substr(p, q - p));
            p = q;
        }
        return Value::array(std::move(parts));
    }
    size_t p = 0;
    while (true) {
        const size_t q = maxsplit >= 0 && int64_t(parts.size()) == maxsplit ? std::string::npos : s.find(sep.s, p);
        if (q == std::string::npos) {
            parts.emplace_back(s.substr(p));
            break;
        }
        parts.emplace_back(s.substr(p, q - p));
        p = q + sep.s.size();
    }
    return Value::array(std::move(parts));
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
    std::string out;
    size_t p = 0;
    int64_t n = 0;
    if (from.empty()) {
        const std::vector<size_t> off = cp_offsets(s);
        for (size_t k = 0; k + 1 < off.size(); k++) {
            if (count < 0 || n < count) {
                out += to;
                n++;
            }
            out += s.substr(off[k], off[k + 1] - off[k]);
        }
        if (count < 0 || n < count) out += to;
        return out;
    }
    while (true) {
        const size_t q = (count >= 0 && n >= count) ? std::string::npos : s.find(from, p);
        if (q == std::string::npos) break;
        out += s.substr(p, q - p) + to;
        p = q + from.size();
        n++;
    }
    return out + s.substr(p);
}

std::string ascii_upper(std::string s) {
    for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
    return s;
}
std::string ascii_lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

Value Renderer::builtin(const std::string& name) const {
    if (name == "namespace")
        return Value::function([](Renderer& r, Args& a) {
            Value v = Value::object();
            v.o->ns = true;
            r.made(v.o);
            for (const Value& p : a.pos) {
                if (!p.is_object()) r.fail("namespace() takes keyword arguments or dicts");
                for (const auto& [k, e] : p.o->items) v.o->set(k, e);
            }
            for (auto& [k, e] : a.kw) v.o->set(k, e);
            return v;
        });
    if (name == "dict")
        return Value::function([](Renderer&, Args& a) {
            Value v = Value::object();
            for (auto& [k, e] : a.kw) v.o->set(k, e);
            return v;
        });
    if (name == "range")
        return Value::function([](Renderer& r, Args& a) {
            for (const Value& v : a.pos)
                if (v.type != Value::Type::integer) r.fail("range() takes integers");
            int64_t start = 0, stop = 0, step = 1;
            if (a.pos.size() == 1) {
                stop = a.pos[0].i;
            } else if (a.pos.size() >= 2) {
                start = a.pos[0].i;
                stop = a.pos[1].i;
                if (a.pos.size() > 2) step = a.pos[2].i;
            }
            if (step == 0) r.fail("range() step cannot be zero");
            Array out;
            for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
                out.emplace_back(k);
                if (out.size() > 100'000) r.fail("range() has more than 100000 items (as Jinja's sandbox)");
            }
            return Value::array(std::move(out));
        });
    if (name == "raise_exception")
        return Value::function([](Renderer& r, Args& a) -> Value { r.fail(to_str(a.get(0, "message"))); });
    if (name == "strftime_now")
        return Value::function([](Renderer&, Args& a) {
            const std::time_t now = std::time(nullptr);
            std::tm tm{};
            localtime_r(&now, &tm);
            char buf[256];
            const size_t n = std::strftime(buf, sizeof buf, to_str(a.get(0, "format")).c_str(), &tm);
            return Value(std::string(buf, n));
        });
    return Value();
}

Value Renderer::binary(Op op, const Value& a, const Value& b) {
    using T = Value::Type;
    switch (op) {
        case Op::eq: return Value(equal(a, b));
        case Op::ne: return Value(!equal(a, b));
        case Op::lt: return Value(compare(a, b) < 0);
        case Op::le: return Value(compare(a, b) <= 0);
        case Op::gt: return Value(compare(a, b) > 0);
        case Op::ge: return Value(compare(a, b) >= 0);
        case Op::in: return Value(contains(b, a));
        case Op::not_in: return Value(!contains(b, a));
        case Op::concat: {
            std::string x = to_str(a), y = to_str(b);
            check_size(x.size() + y.size());
            return Value(x + y);
        }
        default: break;
    }
    if (op == Op::add) {
        if (a.is_string() && b.is_string()) {
            check_size(a.s.size() + b.s.size());
            return Value(a.s + b.s);
        }
        if (a.is_array() && b.is_array()) {
            check_size(a.a->size() + b.a->size());
            Array out = *a.a;
            out.insert(out.end(), b.a->begin(), b.a->end());
            return Value::array(std::move(out));
        }
    }
    if (op == Op::mul && (a.is_string() || a.is_array()) && b.type == T::integer) {
        check_size(size_t(std::max<int64_t>(0, b.i)) > kMaxText
                       ? kMaxText + 1
                       : (a.is_string() ? a.s.size() : a.a->size()) * size_t(std::max<int64_t>(0, b.i)));
        if (a.is_string()) {
            std::string out;
            for (int64_t k = 0; k < b.i; k++) out += a.s;
            return Value(out);
        }
        Array out;
        for (int64_t k = 0; k < b.i; k++) out.insert(out.end(), a.a->begin(), a.a->end());
        return Value::array(std::move(out));
    }
    if (!a.is_number() || !b.is_number()) {
        static const char* names[] = {"+", "-", "*", "/", "//", "%", "**"};
        fail(std::string("unsupported operand types for ") + names[int(op)] + ": " + type_name(a) + " and " +
             type_name(b));
    }
    const bool ints = a.type != T::number && b.type != T::number;
    const int64_t x = num_i(a), y = num_i(b);
    const double fx = num_d(a), fy = num_d(b);
    switch (op) {
        case Op::add:
        case Op::sub:
        case Op::mul: {
            if (!ints) return Value(op == Op::add ? fx + fy : op == Op::sub ? fx - fy : fx * fy);
            int64_t r = 0;
            const bool over = op == Op::add   ? __builtin_add_overflow(x, y, &r)
                              : op == Op::sub ? __builtin_sub_overflow(x, y, &r)
                                              : __builtin_mul_overflow(x, y, &r);
            if (over) fail("integer overflow");
            return Value(r);
        }
        case Op::div:
            if (fy == 0) fail("division by zero");
            return Value(fx / fy);
        case Op::floordiv:
            if (fy == 0) fail("division by zero");
            if (ints) {
                if (x == INT64_MIN && y == -1) fail("integer overflow");
                int64_t q = x / y;
                if (x % y != 0 && ((x < 0) != (y < 0))) q--;
                return Value(q);
            }
            return Value(std::floor(fx / fy));
        case Op::mod:
            if (fy == 0) fail("modulo by zero");
            if (ints) {
                if (y == -1) return Value(int64_t(0));
                int64_t r = x % y;
                if (r != 0 && ((r < 0) != (y < 0))) r += y;
                return Value(r);
            }
            return Value(fx - std::floor(fx / fy) * fy);
        case Op::pow:
            if (ints && y >= 0) {
                if (x == 0 || x == 1) return Value(y == 0 ? int64_t(1) : x);
                if (x == -1) return Value(y % 2 ? int64_t(-1) : int64_t(1));
                int64_t p = 1;  // |x| >= 2: overflow comes within 63 factors
                for (int64_t k = 0; k < y; k++)
                    if (__builtin_mul_overflow(p, x, &p)) fail("integer overflow");
                return Value(p);
            }
            return Value(std::pow(fx, fy));
        default: break;
    }
    return Value();
}

Value Renderer::call_method(const Value& obj, const std::string& name, Args& args) {
    if (obj.is_string()) {
        const std::string& s = obj.s;
        if (name == "startswith" || name == "endswith") {
            const Value p = args.get(0, "prefix");
            std::vector<std::string> opts;
            if (p.is_string()) {
                opts.push_back(p.s);
            } else if (p.is_array()) {
                for (const Value& v : *p.a) opts.push_back(to_str(v));
            } else {
                fail(name + "() takes a string");
            }
            for (const std::string& o : opts)
                if (name == "startswith" ? s.rfind(o, 0) == 0
                                         : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0)
                    return Value(true);
            return Value(false);
        }
        if (name == "strip") return Value(py_strip(s, args.get(0, "chars"), true, true));
        if (name == "lstrip") return Value(py_strip(s, args.get(0, "chars"), true, false));
        if (name == "rstrip") return Value(py_strip(s, args.get(0, "chars"), false, true));
        if (name == "split") {
            const Value m = args.get(1, "maxsplit", Value(int64_t(-1)));
            const Value sep = args.get(0, "sep");
            if (!sep.is_undefined() && !sep.is_none() && (!sep.is_string() || sep.s.empty()))
                fail("split() needs a non-empty string separator");
            return py_split(s, args.get(0, "sep"), m.type == Value::Type::integer ? m.i : -1);
        }
        if (name == "upper") return Value(ascii_upper(s));
        if (name == "lower") return Value(ascii_lower(s));
        if (name == "replace") {
            const Value c = args.get(2, "count", Value(int64_t(-1)));
            return Value(py_replace(s, to_str(args.get(0, "old")), to_str(args.get(1, "new")),
                                    c.type == Value::Type::integer ? c.i : -1));
        }
        if (name == "find") {
            const size_t p = s.find(to_str(args.get(0, "sub")));
            return Value(p == std::string::npos ? int64_t(-1) : int64_t(cp_offsets(s.substr(0, p)).size() - 1));
        }
        if (name == "count") {
            const std::string sub = to_str(args.get(0, "sub"));
            if (sub.empty()) return Value(int64_t(cp_offsets(s).size()));
            int64_t n = 0;
            for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) n++;
            return Value(n);
        }
        if (name == "join") {
            std::string out;
            bool first = true;
            for (const Value& v : iterate(args.get(0, "iterable"))) {
                if (!first) out += s;
                out += to_str(v);
                first = false;
            }
            return Value(out);
        }
        if (name == "capitalize") return Value(s.empty() ? s : ascii_upper(s.substr(0, 1)) + ascii_lower(s.substr(1)));
        if (name == "title") {
            std::string out = s;
            bool start = true;
            for (char& c : out) {
                c = start ? char(std::toupper(static_cast<unsigned char>(c)))
                          : char(std::tolower(static_cast<unsigned char>(c)));
                start = !std::isalpha(static_cast<unsigned char>(c));
            }
            return Value(out);
        }
        if (name == "isdigit") return Value(!s.empty() && s.find_first_not_of("0123456789") == std::string::npos);
    } else if (obj.is_object()) {
        if (name == "get") {
            const Value* v = obj.o->find(to_str(args.get(0, "key")));
            return v ? *v : args.get(1, "default", Value(nullptr));
        }
        if (name == "items" || name == "keys" || name == "values") {
            Array out;
            for (const auto& [k, v] : obj.o->items) {
                if (name == "items")
                    out.push_back(Value::array({Value(k), v}));
                else
                    out.push_back(name == "keys" ? Value(k) : v);
            }
            return Value::array(std::move(out));
        }
    }
    if (const Value* v = obj.is_object() ? obj.o->find(name) : nullptr; v && v->type == Value::Type::function)
        return (*v->f)(*this, args);
    fail(type_name(obj) + " has no method '" + name + "'");
}

Value Renderer::eval(const Expr& e) {
    tick();
    switch (e.kind) {
        case Expr::literal: return e.value;
        case Expr::var: return lookup(e.name);
        case Expr::list:
        case Expr::tuple: {
            Array items;
            for (const auto& k : e.kids) items.push_back(eval(*k));
            return Value::array(std::move(items));
        }
        case Expr::dict: {
            Value v = Value::object();
            for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
                const Value key = eval(*e.kids[k]);
                v.o->set(to_str(key), eval(*e.kids[k + 1]));
            }
            return v;
        }
        case Expr::attr: {
            const Value obj = eval(*e.kids[0]);
            if (obj.is_undefined())
                fail("cannot read attribute '" + e.name + "' of an undefined value" +
                     (e.kids[0]->kind == Expr::var ? " ('" + e.kids[0]->name + "')" : std::string()));
            if (obj.is_object())
                if (const Value* v = obj.o->find(e.name)) return *v;
            return Value();
        }
        case Expr::index: {
            const Value obj = eval(*e.kids[0]);
            const Value key = eval(*e.kids[1]);
            if (obj.is_undefined()) fail("cannot index an undefined value");
            if (obj.is_object()) {
                if (!key.is_string()) return Value();
                const Value* v = obj.o->find(key.s);
                return v ? *v : Value();
            }
            if ((obj.is_array() || obj.is_string()) && key.type == Value::Type::integer) {
                if (obj.is_array()) {
                    const int64_t n = int64_t(obj.a->size());
                    const int64_t k = key.i < 0 ? key.i + n : key.i;
                    return k >= 0 && k < n ? (*obj.a)[size_t(k)] : Value();
                }
                const std::vector<size_t> off = cp_offsets(obj.s);
                const int64_t n = int64_t(off.size()) - 1;
                const int64_t k = key.i < 0 ? key.i + n : key.i;
                if (k < 0 || k >= n) return Value();
                return Value(obj.s.substr(off[size_t(k)], off[size_t(k) + 1] - off[size_t(k)]));
            }
            return Value();
        }
        case Expr::slice: {
            const Value obj = eval(*e.kids[0]);
            const Value a = e.has[0] ? eval(*e.kids[1]) : Value();
            const Value b = e.has[1] ? eval(*e.kids[2]) : Value();
            const Value c = e.has[2] ? eval(*e.kids[3]) : Value();
            if (obj.is_array()) {
                Array out;
                for (size_t k : slice_indices(*this, int64_t(obj.a->size()), a, b, c)) out.push_back((*obj.a)[k]);
                return Value::array(std::move(out));
            }
            if (obj.is_string()) {
                const std::vector<size_t> off = cp_offsets(obj.s);
                std::string out;
                for (size_t k : slice_indices(*this, int64_t(off.size()) - 1, a, b, c))
                    out += obj.s.substr(off[k], off[k + 1] - off[k]);
                return Value(out);
            }
            fail("cannot slice " + type_name(obj));
        }
        case Expr::call: {
            const Expr& callee = *e.kids[0];
            Args args = eval_args(e, 1);
            if (callee.kind == Expr::attr) {
                const Value obj = eval(*callee.kids[0]);
                if (obj.is_undefined())
                    fail("cannot call '" + callee.name + "' on an undefined value" +
                         (callee.kids[0]->kind == Expr::var ? " ('" + callee.kids[0]->name + "')" : std::string()));
                return call_method(obj, callee.name, args);
            }
            const Value f = eval(callee);
            if (f.type != Value::Type::function)
                fail(callee.kind == Expr::var ? "'" + callee.name + "' is not a function"
                                              : type_name(f) + " is not callable");
            return (*f.f)(*this, args);
        }
        case Expr::filter: {
            const Value subject = eval(*e.kids[0]);
            Args args = eval_args(e, 1);
            return e.filter_fn(*this, subject, args);
        }
        case Expr::test: {
            const Value subject = eval(*e.kids[0]);
            Args args = eval_args(e, 1);
            return Value(e.test_fn(*this, subject, args) != e.negate);
        }
        case Expr::not_: return Value(!eval(*e.kids[0]).truthy());
        case Expr::neg: {
            const Value v = eval(*e.kids[0]);
            if (v.type == Value::Type::number) return Value(-v.d);
            if (v.is_number()) {
                if (num_i(v) == INT64_MIN) fail("integer overflow");
                return Value(-num_i(v));
            }
            fail("bad operand for unary -: " + type_name(v));
        }
        case Expr::binary: return binary(e.op, eval(*e.kids[0]), eval(*e.kids[1]));
        case Expr::and_: {
            Value a = eval(*e.kids[0]);
            return a.truthy() ? eval(*e.kids[1]) : a;
        }
        case Expr::or_: {
            Value a = eval(*e.kids[0]);
            return a.truthy() ? a : eval(*e.kids[1]);
        }
        case Expr::cond:
            if (eval(*e.kids[1]).truthy()) return eval(*e.kids[0]);
            return e.kids[2] ? eval(*e.kids[2]) : Value();
    }
    return Value();
}

// ---- filters -------------------------------------------------------------------------------------------------------

namespace {

int64_t length_of(Renderer& r, const Value& v) {
    switch (v.type) {
        case Value::Type::string: return int64_t(cp_offsets(v.s).size()) - 1;
        case Value::Type::array: return int64_t(v.a->size());
        case Value::Type::object: return int64_t(v.o->items.size());
        case Value::Type::undefined: return 0;
        default: r.fail("length of " + Renderer::type_name(v) + " is undefined");
    }
}

Value attribute_of(const Value& v, const std::string& path) {
    Value cur = v;
    size_t p = 0;
    while (p <= path.size()) {
        const size_t q = std::min(path.find('.', p), path.size());
        const std::string part = path.substr(p, q - p);
        if (cur.is_object()) {
            const Value* n = cur.o->find(part);
            cur = n ? *n : Value();
        } else if (cur.is_array() && !part.empty() && std::isdigit(static_cast<unsigned char>(part[0]))) {
            const unsigned long long k = std::strtoull(part.c_str(), nullptr, 10);
            cur = k < cur.a->size() ? (*cur.a)[size_t(k)] : Value();
        } else {
            return Value();
        }
        p = q + 1;
    }
    return cur;
}

Value f_tojson(Renderer&, const Value& v, const Args& a) {
    const Value ind = a.get(0, "indent");
    return Value(to_json_text(v, ind.type == Value::Type::integer ? int(ind.i) : -1));
}
Value f_safe(Renderer&, const Value& v, const Args&) { return v; }
Value f_string(Renderer&, const Value& v, const Args&) { return Value(to_str(v)); }
Value f_trim(Renderer&, const Value& v, const Args& a) {
    return Value(py_strip(to_str(v), a.get(0, "chars"), true, true));
}
Value f_length(Renderer& r, const Value& v, const Args&) { return Value(length_of(r, v)); }
Value f_items(Renderer& r, const Value& v, const Args&) {
    if (v.is_undefined() || v.is_none()) return Value::array();
    if (!v.is_object()) r.fail("items of " + Renderer::type_name(v) + ": a dict is needed");
    Array out;
    for (const auto& [k, e] : v.o->items) out.push_back(Value::array({Value(k), e}));
    return Value::array(std::move(out));
}
Value f_first(Renderer& r, const Value& v, const Args&) {
    std::vector<Value> items = r.iterate(v);
    return items.empty() ? Value() : items.front();
}
Value f_last(Renderer& r, const Value& v, const Args&) {
    std::vector<Value> items = r.iterate(v);
    return items.empty() ? Value() : items.back();
}
Value f_join(Renderer& r, const Value& v, const Args& a) {
    const std::string sep = to_str(a.get(0, "d", Value("")));
    const Value attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& e : r.iterate(v)) {
        if (!first) out += sep;
        out += to_str(attr.is_undefined() ? e : attribute_of(e, to_str(attr)));
        first = false;
    }
    return Value(out);
}
Value f_upper(Renderer&, const Value& v, const Args&) { return Value(ascii_upper(to_str(v))); }
Value f_lower(Renderer&, const Value& v, const Args&) { return Value(ascii_lower(to_str(v))); }
Value f_capitalize(Renderer&, const Value& v, const Args&) {
    const std::string s = to_str(v);
    return Value(s.empty() ? s : ascii_upper(s.substr(0, 1)) + ascii_lower(s.substr(1)));
}
Value f_default(Renderer&, const Value& v, const Args& a) {
    const bool boolean = a.get(1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", Value(""));
    return v;
}
Value f_list(Renderer& r, const Value& v, const Args&) { return Value::array(r.iterate(v)); }
Value f_reverse(Renderer& r, const Value& v, const Args&) {
    if (v.is_string()) {
        std::vector<Value> chars = r.iterate(v);
        std::string out;
        for (size_t k = chars.size(); k-- > 0;) out += chars[k].s;
        return Value(out);
    }
    std::vector<Value> items = r.iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::array(std::move(items));
}
Value f_replace(Renderer&, const Value& v, const Args& a) {
    const Value c = a.get(2, "count");
    return Value(py_replace(to_str(v), to_str(a.get(0, "old")), to_str(a.get(1, "new")),
                            c.type == Value::Type::integer ? c.i : -1));
}
// A double's integer part, when an int64 holds it.
bool to_int64(double d, int64_t& out) {
    if (!(d > -9.2e18 && d < 9.2e18)) return false;
    out = int64_t(d);
    return true;
}
Value f_int(Renderer&, const Value& v, const Args& a) {
    int64_t i = 0;
    if (v.type == Value::Type::number && to_int64(v.d, i)) return Value(i);
    if (v.is_number()) return Value(Renderer::num_i(v));
    if (v.is_string()) {
        char* end = nullptr;
        const long long x = std::strtoll(v.s.c_str(), &end, 10);
        if (end && *end == 0 && !v.s.empty()) return Value(int64_t(x));
        const double d = std::strtod(v.s.c_str(), &end);
        if (end && *end == 0 && !v.s.empty() && to_int64(d, i)) return Value(i);
    }
    return a.get(0, "default", Value(int64_t(0)));
}
Value f_float(Renderer&, const Value& v, const Args& a) {
    if (v.is_number()) return Value(Renderer::num_d(v));
    if (v.is_string()) {
        char* end = nullptr;
        const double d = std::strtod(v.s.c_str(), &end);
        if (end && *end == 0 && !v.s.empty()) return Value(d);
    }
    return a.get(0, "default", Value(0.0));
}
Value f_abs(Renderer& r, const Value& v, const Args&) {
    if (v.type == Value::Type::number) return Value(std::fabs(v.d));
    if (v.is_number()) {
        if (Renderer::num_i(v) == INT64_MIN) r.fail("integer overflow");
        return Value(std::abs(Renderer::num_i(v)));
    }
    r.fail("abs of " + Renderer::type_name(v));
}
Value f_round(Renderer& r, const Value& v, const Args& a) {
    if (!v.is_number()) r.fail("round of " + Renderer::type_name(v));
    const Value p = a.get(0, "precision", Value(int64_t(0)));
    const std::string method = to_str(a.get(1, "method", Value("common")));
    const double scale = std::pow(10.0, double(p.type == Value::Type::integer ? p.i : 0));
    const double x = Renderer::num_d(v) * scale;
    const double y = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::round(x);
    return Value(y / scale);
}
Value f_title(Renderer& r, const Value& v, const Args& a) {
    Args none;
    return r.call_method(Value(to_str(v)), "title", none);
}
Value f_indent(Renderer&, const Value& v, const Args& a) {
    const Value w = a.get(0, "width", Value(int64_t(4)));
    const std::string pad = w.is_string() ? w.s : std::string(size_t(std::max<int64_t>(0, w.i)), ' ');
    const bool first = a.get(1, "first", Value(false)).truthy(), blank = a.get(2, "blank", Value(false)).truthy();
    const std::string s = to_str(v);
    std::string out;
    size_t p = 0;
    bool first_line = true;
    while (p <= s.size()) {
        size_t q = s.find('\n', p);
        const bool last = q == std::string::npos;
        if (last) q = s.size();
        const std::string line = s.substr(p, q - p);
        if ((!first_line || first) && (blank || !line.empty())) out += pad;
        out += line;
        if (!last) out += '\n';
        first_line = false;
        if (last) break;
        p = q + 1;
    }
    return Value(out);
}
Value f_unique(Renderer& r, const Value& v, const Args&) {
    Array out;
    for (const Value& e : r.iterate(v)) {
        bool seen = false;
        for (const Value& o : out) seen = seen || Renderer::equal(o, e);
        if (!seen) out.push_back(e);
    }
    return Value::array(std::move(out));
}
Value f_sum(Renderer& r, const Value& v, const Args& a) {
    Value acc = a.get(1, "start", Value(int64_t(0)));
    const Value attr = a.get(0, "attribute");
    for (const Value& e : r.iterate(v))
        acc = r.binary(Op::add, acc, attr.is_undefined() ? e : attribute_of(e, to_str(attr)));
    return acc;
}
Value f_sort(Renderer& r, const Value& v, const Args& a) {
    std::vector<Value> items = r.iterate(v);
    const bool rev = a.get(0, "reverse", Value(false)).truthy();
    const Value attr = a.get(2, "attribute");
    auto key = [&](const Value& e) { return attr.is_undefined() ? e : attribute_of(e, to_str(attr)); };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        const int c = r.compare(key(x), key(y));
        return rev ? c > 0 : c < 0;
    });
    return Value::array(std::move(items));
}
Value f_map(Renderer& r, const Value& v, const Args& a) {
    Array out;
    const Value attr = a.get(99, "attribute");
    if (!attr.is_undefined()) {
        const Value def = a.get(99, "default");
        for (const Value& e : r.iterate(v)) {
            Value x = attribute_of(e, to_str(attr));
            out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
        }
        return Value::array(std::move(out));
    }
    if (a.pos.empty() || !a.pos[0].is_string()) r.fail("map() needs a filter name or attribute=");
    const FilterFn f = find_filter(a.pos[0].s);
    if (!f) r.fail("unknown filter '" + a.pos[0].s + "'");
    Args rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& e : r.iterate(v)) out.push_back(f(r, e, rest));
    return Value::array(std::move(out));
}
// select/reject(test, args...) and selectattr/rejectattr(attribute, test, args...).
Value select_impl(Renderer& r, const Value& v, const Args& a, bool by_attr, bool keep) {
    const size_t t0 = by_attr ? 1 : 0;
    const Value attr = by_attr ? a.get(0, "attribute") : Value();
    TestFn test = nullptr;
    Args rest;
    if (a.pos.size() > t0) {
        if (!a.pos[t0].is_string()) r.fail("select filters take a test name");
        test = find_test(a.pos[t0].s);
        if (!test) r.fail("unknown test '" + a.pos[t0].s + "'");
        rest.pos.assign(a.pos.begin() + std::ptrdiff_t(t0) + 1, a.pos.end());
    }
    Array out;
    for (const Value& e : r.iterate(v)) {
        const Value x = by_attr ? attribute_of(e, to_str(attr)) : e;
        const bool pass = test ? test(r, x, rest) : x.truthy();
        if (pass == keep) out.push_back(e);
    }
    return Value::array(std::move(out));
}
Value f_select(Renderer& r, const Value& v, const Args& a) { return select_impl(r, v, a, false, true); }
Value f_reject(Renderer& r, const Value& v, const Args& a) { return select_impl(r, v, a, false, false); }
Value f_selectattr(Renderer& r, const Value& v, const Args& a) { return select_impl(r, v, a, true, true); }
Value f_rejectattr(Renderer& r, const Value& v, const Args& a) { return select_impl(r, v, a, true, false); }
Value f_escape(Renderer&, const Value& v, const Args&) {
    std::string out;
    for (char c : to_str(v)) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&#34;"; break;
            case '\'': out += "&#39;"; break;
            default: out += c;
        }
    }
    return Value(out);
}
Value f_minmax(Renderer& r, const Value& v, bool max) {
    std::vector<Value> items = r.iterate(v);
    if (items.empty()) return Value();
    Value best = items[0];
    for (const Value& e : items)
        if (max ? r.compare(e, best) > 0 : r.compare(e, best) < 0) best = e;
    return best;
}
Value f_min(Renderer& r, const Value& v, const Args&) { return f_minmax(r, v, false); }
Value f_max(Renderer& r, const Value& v, const Args&) { return f_minmax(r, v, true); }

FilterFn find_filter(const std::string& name) {
    static const std::map<std::string, FilterFn> table = {
        {"tojson", f_tojson},
        {"safe", f_safe},
        {"string", f_string},
        {"trim", f_trim},
        {"length", f_length},
        {"count", f_length},
        {"items", f_items},
        {"first", f_first},
        {"last", f_last},
        {"join", f_join},
        {"upper", f_upper},
        {"lower", f_lower},
        {"default", f_default},
        {"d", f_default},
        {"list", f_list},
        {"reverse", f_reverse},
        {"replace", f_replace},
        {"int", f_int},
        {"float", f_float},
        {"abs", f_abs},
        {"round", f_round},
        {"title", f_title},
        {"capitalize", f_capitalize},
        {"indent", f_indent},
        {"unique", f_unique},
        {"sum", f_sum},
        {"sort", f_sort},
        {"map", f_map},
        {"select", f_select},
        {"reject", f_reject},
        {"selectattr", f_selectattr},
        {"rejectattr", f_rejectattr},
        {"escape", f_escape},
        {"e", f_escape},
        {"min", f_min},
        {"max", f_max},
    };
    auto it = table.find(name);
    return it == table.end() ? nullptr : it->second;
}

// ---- tests ---------------------------------------------------------------------------------------------------------

using T = Value::Type;
bool t_defined(Renderer&, const Value& v, const Args&) { return !v.is_undefined(); }
bool t_undefined(Renderer&, const Value& v, const Args&) { return v.is_undefined(); }
bool t_none(Renderer&, const Value& v, const Args&) { return v.is_none(); }
bool t_string(Renderer&, const Value& v, const Args&) { return v.is_string(); }
bool t_number(Renderer&, const Value& v, const Args&) { return v.is_number(); }
bool t_integer(Renderer&, const Value& v, const Args&) { return v.type == T::integer; }
bool t_float(Renderer&, const Value& v, const Args&) { return v.type == T::number; }
bool t_boolean(Renderer&, const Value& v, const Args&) { return v.type == T::boolean; }
bool t_mapping(Renderer&, const Value& v, const Args&) { return v.is_object(); }
bool t_iterable(Renderer&, const Value& v, const Args&) { return v.is_string() || v.is_array() || v.is_object(); }
bool t_true(Renderer&, const Value& v, const Args&) { return v.type == T::boolean && v.b; }
bool t_false(Renderer&, const Value& v, const Args&) { return v.type == T::boolean && !v.b; }
bool t_callable(Renderer&, const Value& v, const Args&) { return v.type == T::function; }
bool t_eq(Renderer&, const Value& v, const Args& a) { return Renderer::equal(v, a.get(0, "other")); }
bool t_ne(Renderer&, const Value& v, const Args& a) { return !Renderer::equal(v, a.get(0, "other")); }
bool t_odd(Renderer& r, const Value& v, const Args&) {
    if (v.type != T::integer) r.fail("'odd' needs an integer");
    return v.i % 2 != 0;
}
bool t_even(Renderer& r, const Value& v, const Args&) {
    if (v.type != T::integer) r.fail("'even' needs an integer");
    return v.i % 2 == 0;
}
bool t_divisibleby(Renderer& r, const Value& v, const Args& a) {
    const Value d = a.get(0, "num");
    if (v.type != T::integer || d.type != T::integer || d.i == 0) r.fail("'divisibleby' needs non-zero integers");
    return v.i % d.i == 0;
}
bool t_lower(Renderer&, const Value& v, const Args&) { return v.is_string() && ascii_lower(v.s) == v.s; }
bool t_upper(Renderer&, const Value& v, const Args&) { return v.is_string() && ascii_upper(v.s) == v.s; }
bool t_in(Renderer& r, const Value& v, const Args& a) { return r.contains(a.get(0, "seq"), v); }
bool t_gt(Renderer& r, const Value& v, const Args& a) { return r.compare(v, a.get(0, "other")) > 0; }
bool t_ge(Renderer& r, const Value& v, const Args& a) { return r.compare(v, a.get(0, "other")) >= 0; }
bool t_lt(Renderer& r, const Value& v, const Args& a) { return r.compare(v, a.get(0, "other")) < 0; }
bool t_le(Renderer& r, const Value& v, const Args& a) { return r.compare(v, a.get(0, "other")) <= 0; }

TestFn find_test(const std::string& name) {
    static const std::map<std::string, TestFn> table = {
        {"defined", t_defined},
        {"undefined", t_undefined},
        {"none", t_none},
        {"string", t_string},
        {"number", t_number},
        {"integer", t_integer},
        {"float", t_float},
        {"boolean", t_boolean},
        {"mapping", t_mapping},
        {"iterable", t_iterable},
        {"sequence", t_iterable},
        {"true", t_true},
        {"false", t_false},
        {"callable", t_callable},
        {"eq", t_eq},
        {"equalto", t_eq},
        {"==", t_eq},
        {"ne", t_ne},
        {"odd", t_odd},
        {"even", t_even},
        {"divisibleby", t_divisibleby},
        {"lower", t_lower},
        {"upper", t_upper},
        {"in", t_in},
        {"gt", t_gt},
        {"ge", t_ge},
        {"lt", t_lt},
        {"le", t_le},
    };
    auto it = table.find(name);
    return it == table.end() ? nullptr : it->second;
}

}  // namespace

// ---- template ------------------------------------------------------------------------------------------------------

Template::Template(const std::string& source) { root_ = TreeBuilder(split_template(source)).build(); }
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
    Renderer r(context);
    std::string out;
    r.exec(*root_, out);
    return out;
}

}  // namespace hy::jinja
