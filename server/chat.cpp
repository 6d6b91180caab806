// Chat templates and the output parser of hybrid-server (see chat.h).
#include "server/chat.h"

#include <algorithm>
#include <cctype>

#include "model/common.h"

namespace hy::server {

namespace {

// A special token of tokenizer_config.json as the template sees it: a string, or an object's "content".
ojson token_text(const ojson& v) {
    if (v.is_string()) return v;
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"];
    return nullptr;
}

std::shared_ptr<jinja::Template> parse_template(const std::string& source, const std::string& origin) {
    try {
        return std::make_shared<jinja::Template>(source);
    } catch (const Error& e) {
        throw Error(Status::format, origin + ": " + e.what());
    }
}

// The length of the longest suffix of `s` that is a proper prefix of `marker` (text to hold back).
size_t partial_suffix(const std::string& s, const std::string& marker) {
    for (size_t k = std::min(marker.size() - 1, s.size()); k > 0; k--)
        if (s.compare(s.size() - k, k, marker, 0, k) == 0) return k;
    return 0;
}

std::string trim_newlines(const std::string& s) {
    size_t a = 0, b = s.size();
    while (a < b && s[a] == '\n') a++;
    while (b > a && s[b - 1] == '\n') b--;
    return s.substr(a, b - a);
}

std::string trim_ws(const std::string& s) {
    const size_t a = s.find_first_not_of(" \t\r\n");
    if (a == std::string::npos) return "";
    const size_t b = s.find_last_not_of(" \t\r\n");
    return s.substr(a, b - a + 1);
}

// The JSON-schema type of parameter `param` of function `name` in the request's tools ("" when not given).
std::string param_type(const ojson& tools, const std::string& name, const std::string& param) {
    if (!tools.is_array()) return "";
    for (const ojson& t : tools) {
        const ojson& f = t.contains("function") ? t["function"] : t;
        if (!f.is_object() || f.value("name", "") != name) continue;
        if (!f.contains("parameters") || !f["parameters"].is_object()) return "";
        const ojson& props = f["parameters"].value("properties", ojson::object());
        if (!props.is_object() || !props.contains(param) || !props[param].is_object()) return "";
        const ojson& type = props[param].value("type", ojson());
        return type.is_string() ? type.get<std::string>() : "";
    }
    return "";
}

// One <tool_call> block's inside as a call; false when it is neither form.
bool parse_block(const std::string& inner, const ojson& tools, OutputParser::ToolCall& call) {
    const std::string body = trim_ws(inner);
    if (body.rfind("{", 0) == 0) {                                   // Qwen3: {"name": ..., "arguments": {...}}
        if (json_nests_deeper(body, kMaxJsonNesting)) return false;  // (left as text)
        const ojson j = ojson::parse(body, nullptr, false);
        if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
        call.name = j["name"].get<std::string>();
        const ojson args = j.contains("arguments") ? j["arguments"] : j.value("parameters", ojson::object());
        call.arguments = args.is_string() ? args.get<std::string>() : args.dump();
        return true;
    }
    if (body.rfind("<function=", 0) != 0) return false;  // Qwen3.5: <function=NAME><parameter=P>V</parameter>...
    size_t p = body.find('>');
    if (p == std::string::npos) return false;
    call.name = trim_ws(body.substr(10, p - 10));
    ojson args = ojson::object();
    while (true) {
        const size_t open = body.find("<parameter=", p);
        if (open == std::string::npos) break;
        const size_t gt = body.find('>', open);
        if (gt == std::string::npos) return false;
        const std::string pname = trim_ws(body.substr(open + 11, gt - open - 11));
        size_t close = body.find("</parameter>", gt);
        if (close == std::string::npos) {  // tolerate a missing close before </function> or the end
            close = body.find("</function>", gt);
            if (close == std::string::npos) close = body.size();
        }
        std::string value = body.substr(gt + 1, close - gt - 1);
        if (!value.empty() && value.front() == '\n') value.erase(0, 1);
        if (!value.empty() && value.back() == '\n') value.pop_back();
        const std::string type = param_type(tools, call.name, pname);
        ojson parsed;
        if (!type.empty() && type != "string" && !json_nests_deeper(value, kMaxJsonNesting))
            parsed = ojson::parse(value, nullptr, false);
        args[pname] = type.empty() || type == "string" || parsed.is_discarded() ? ojson(value) : parsed;
        p = std::min(close + 12, body.size());
    }
    call.arguments = args.dump();
    return true;
}

const std::string kThinkOpen = "<think>", kThinkClose = "</think>";
const std::string kToolOpen = "<tool_call>", kToolClose = "</tool_call>";

}  // namespace

ChatFormat ChatFormat::load(const std::string& dir, const Tokenizer& tokenizer, const std::string& template_file) {
    ChatFormat f;
    f.special_ = ojson::object();
    const std::string config_path = dir + "/tokenizer_config.json";
    ojson config = ojson::object();
    if (path_present(config_path)) {
        const std::string text = read_regular_file(config_path, kMaxJsonFileBytes);
        if (json_nests_deeper(text, 512))  // (see json_nests_deeper: ordered_json's parse recurses)
            throw Error(Status::format, config_path + ": invalid JSON (nested more than 512 levels)");
        config = ojson::parse(text, nullptr, false);
        if (config.is_discarded() || !config.is_object()) throw Error(Status::format, config_path + ": invalid JSON");
    }
    for (const char* k : {"bos_token", "eos_token", "pad_token", "unk_token"})
        if (config.contains(k)) f.special_[k] = token_text(config[k]);
    const std::string jinja_path = dir + "/chat_template.jinja";
    if (!template_file.empty()) {
        f.default_ = parse_template(read_regular_file(template_file, size_t(16) << 20), template_file);
        f.description_ = "jinja (" + template_file + ")";
    } else if (path_present(jinja_path)) {
        f.default_ = parse_template(read_regular_file(jinja_path, size_t(16) << 20), jinja_path);
        f.description_ = "jinja (chat_template.jinja)";
    } else if (config.contains("chat_template")) {
        const ojson& t = config["chat_template"];
        if (t.is_string()) {
            f.default_ = parse_template(t.get<std::string>(), config_path + " chat_template");
        } else if (t.is_array()) {
            for (const ojson& e : t) {
                if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["template"].is_string())
                    throw Error(Status::format, config_path + ": chat_template entries need a name and a template");
                const std::string name = e["name"].is_string() ? e["name"].get<std::string>() : "";
                auto tmpl = parse_template(e["template"].get<std::string>(), config_path + " chat_template " + name);
                if (name == "default") f.default_ = tmpl;
                if (name == "tool_use") f.tool_use_ = tmpl;
            }
            if (!f.default_) f.default_ = f.tool_use_;
        } else if (!t.is_null()) {
            throw Error(Status::format, config_path + ": chat_template must be a string or a list");
        }
        if (f.default_) f.description_ = "jinja (tokenizer_config.json)";
    }
    try {
        f.chatml_ = ChatTemplate::for_tokenizer(tokenizer);
        if (!f.default_) f.description_ = "chatml (built-in)";
    } catch (const Error&) {}
    f.think_ = tokenizer.token_id(kThinkOpen) >= 0 && tokenizer.token_id(kThinkClose) >= 0;
    for (const std::string* m : {&kThinkOpen, &kThinkClose, &kToolOpen, &kToolClose})
        if (const int32_t id = tokenizer.token_id(*m); id >= 0) f.marker_ids_.push_back(id);
    return f;
}

std::string ChatFormat::render(const ojson& messages, const ojson& tools, bool add_generation_prompt,
                               const ojson& kwargs) const {
    const bool with_tools = tools.is_array() && !tools.empty();
    const std::shared_ptr<jinja::Template>& tmpl = with_tools && tool_use_ ? tool_use_ : default_;
    if (tmpl) {
        ojson ctx = special_;
        for (auto it = kwargs.begin(); it != kwargs.end(); ++it) ctx[it.key()] = it.value();
        ctx["messages"] = messages;
        if (with_tools) ctx["tools"] = tools;
        ctx["add_generation_prompt"] = add_generation_prompt;
        return tmpl->render(jinja::from_json(ctx));
    }
    if (!chatml_) throw Error(Status::unsupported, "the model has no chat template and no ChatML tokens");
    if (with_tools) throw Error(Status::invalid_argument, "tools need a chat template (the built-in ChatML has none)");
    ChatOptions opts;
    opts.add_generation_prompt = add_generation_prompt;
    // thinking unless the request says enable_thinking: false, as Qwen3.5's own template and the CLI's default
    opts.thinking = Thinking::enabled;
    if (kwargs.contains("enable_thinking") && kwargs["enable_thinking"].is_boolean())
        opts.thinking = kwargs["enable_thinking"].get<bool>() ? Thinking::enabled : Thinking::disabled;
    // A past answer is rendered as the model produced it: its reasoning in a think block, or the empty block of
    // the generation prompt, so that the next turn's prompt extends the previous sequence (and its cached state).
    std::vector<ChatMessage> msgs;
    for (const ojson& m : messages) {
        ChatMessage cm{m["role"].get<std::string>(), m["content"].get<std::string>()};
        if (cm.role == "assistant" && chatml_->has_think_tokens() && cm.content.find(kThinkOpen) == std::string::npos) {
            if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
                cm.content = kThinkOpen + "\n" + m["reasoning_content"].get<std::string>() + "\n" + kThinkClose +
                             "\n\n" + cm.content;
            else if (opts.thinking == Thinking::disabled)
                cm.content = chatml_->think_prefix(Thinking::disabled) + cm.content;
        }
        msgs.push_back(std::move(cm));
    }
    return chatml_->render(msgs, opts);
}

// ---- output parser -------------------------------------------------------------------------------------------------

OutputParser::OutputParser(bool in_reasoning, bool parse_think, const ojson& tools)
    : state_(in_reasoning && parse_think ? State::reasoning : State::content),
      parse_think_(parse_think),
      parse_tools_(tools.is_array() && !tools.empty()),
      echo_possible_(in_reasoning && parse_think),
      tools_(tools) {}

OutputParser::Delta OutputParser::feed(const std::string& text) {
    Delta d;
    buf_ += text;
    while (true) {
        if (state_ == State::tool) {
            tools_text_ += buf_;
            buf_.clear();
            return d;
        }
        if (!started_) {  // leading newlines of a reasoning block; a <think> that opens the output
            if (state_ == State::reasoning) {
                const size_t a = buf_.find_first_not_of('\n');
                buf_.erase(0, a == std::string::npos ? buf_.size() : a);
                if (buf_.empty()) return d;
                // the model repeated the prompt's opening tag: that one echo is dropped; any other <think> is
                // reasoning text, shown (an answer of <think> tokens alone came back empty)
                if (echo_possible_ && buf_.rfind(kThinkOpen, 0) == 0) {
                    buf_.erase(0, kThinkOpen.size());
                    echo_possible_ = false;
                    continue;
                }
                if (echo_possible_ && kThinkOpen.compare(0, buf_.size(), buf_) == 0) return d;
            } else if (parse_think_) {
                if (buf_.empty() || (buf_.size() < kThinkOpen.size() && kThinkOpen.compare(0, buf_.size(), buf_) == 0))
                    return d;
                if (buf_.rfind(kThinkOpen, 0) == 0) {
                    buf_.erase(0, kThinkOpen.size());
                    state_ = State::reasoning;
                    continue;
                }
            }
            started_ = true;
        }
        if (state_ == State::reasoning) {
            const size_t close = buf_.find(kThinkClose);
            if (close != std::string::npos) {
                size_t end = close;
                while (end > 0 && buf_[end - 1] == '\n') end--;
                d.reasoning += buf_.substr(0, end);
                buf_.erase(0, close + kThinkClose.size());
                state_ = State::content;
                strip_lead_ = true;
                continue;
            }
            size_t keep = partial_suffix(buf_, kThinkClose);
            while (keep < buf_.size() && buf_[buf_.size() - keep - 1] == '\n') keep++;  // trailing newlines
            d.reasoning += buf_.substr(0, buf_.size() - keep);
            buf_.erase(0, buf_.size() - keep);
            return d;
        }
        // content
        if (strip_lead_) {
            const size_t a = buf_.find_first_not_of('\n');
            buf_.erase(0, a == std::string::npos ? buf_.size() : a);
            if (buf_.empty()) return d;
            strip_lead_ = false;
        }
        if (!parse_tools_) {
            d.content += buf_;
            buf_.clear();
            return d;
        }
        const size_t open = buf_.find(kToolOpen);
        if (open != std::string::npos) {
            size_t end = open;
            while (end > 0 && std::isspace(static_cast<unsigned char>(buf_[end - 1]))) end--;
            d.content += buf_.substr(0, end);
            tools_text_ = buf_.substr(end);  // (the space before it comes back if no call parses)
            buf_.clear();
            state_ = State::tool;
            return d;
        }
        size_t keep = partial_suffix(buf_, kToolOpen);
        while (keep < buf_.size() && std::isspace(static_cast<unsigned char>(buf_[buf_.size() - keep - 1]))) keep++;
        d.content += buf_.substr(0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return d;
    }
}

OutputParser::Delta OutputParser::finish() {
    Delta d;
    if (state_ == State::reasoning) {
        d.reasoning = trim_newlines(buf_);
    } else if (state_ == State::content) {
        d.content = strip_lead_ ? trim_newlines(buf_) : buf_;
    } else {
        std::string rest;
        calls_ = parse_tool_calls(tools_text_, tools_, &rest);
        d.content = calls_.empty() ? tools_text_ : trim_ws(rest);
    }
    buf_.clear();
    return d;
}

std::vector<OutputParser::ToolCall> parse_tool_calls(const std::string& text, const ojson& tools, std::string* rest) {
    std::vector<OutputParser::ToolCall> calls;
    size_t p = 0;
    while (p < text.size()) {
        const size_t open = text.find(kToolOpen, p);
        if (open == std::string::npos) {
            if (rest) *rest += text.substr(p);
            break;
        }
        if (rest) *rest += text.substr(p, open - p);
        const size_t close = text.find(kToolClose, open);
        const size_t inner = open + kToolOpen.size();
        OutputParser::ToolCall call;
        if (close == std::string::npos || !parse_block(text.substr(inner, close - inner), tools, call)) {
            if (rest)
                *rest += text.substr(open,
                                     close == std::string::npos ? std::string::npos : close + kToolClose.size() - open);
            if (close == std::string::npos) break;
        } else {
            calls.push_back(std::move(call));
        }
        p = close + kToolClose.size();
    }
    return calls;
}

}  // namespace hy::server
