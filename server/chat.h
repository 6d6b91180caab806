// The chat side of hybrid-server: the model folder's chat template (rendered with model/jinja.h, or the built-in
// ChatML of model/chat.h when the folder has none), the conversion of OpenAI messages for it, and the parser that
// splits generated text into reasoning_content (<think>...</think>), content and tool_calls (Qwen3's
// <tool_call>{"name": ..., "arguments": ...}</tool_call> and Qwen3.5's <tool_call><function=NAME><parameter=P>
// VALUE</parameter></function></tool_call>), incrementally for streaming.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/chat.h"
#include "model/jinja.h"
#include "model/tokenizer.h"

namespace hy::server {

using ojson = nlohmann::ordered_json;

// Whether JSON text nests lists and objects more than `limit` levels deep (brackets inside strings do not count; the
// text need not be valid JSON). Checked before every parse of text from a client or a model: nlohmann's
// ordered_json copies a parsed array into its parent recursively, so a body 90,000 levels deep (180 KB) overflowed
// the connection thread's stack and took the server down (a fresh-user pass).
inline bool json_nests_deeper(const std::string& text, int limit) {
    int depth = 0;
    bool in_string = false, escaped = false;
    for (const char c : text) {
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > limit) return true;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return false;
}
// The nesting the server takes in a request body, and in JSON inside it (tool call arguments) or in generated text.
constexpr int kMaxJsonNesting = 64;

class ChatFormat {
public:
    // The template of model folder `dir`: chat_template.jinja, else tokenizer_config.json's chat_template (a string,
    // or a list of {name, template}: "default", and "tool_use" for requests with tools), else the built-in ChatML
    // (when the tokenizer has ChatML tokens; else chat requests are refused); template_file, when not empty,
    // replaces the folder's template. Throws Error(format) naming the file for a template that does not parse,
    // Error(io) for a file that cannot be read.
    static ChatFormat load(const std::string& dir, const Tokenizer& tokenizer, const std::string& template_file = "");

    // "jinja (tokenizer_config.json)", "jinja (chat_template.jinja)", "jinja (FILE)", "chatml (built-in)", "none".
    const std::string& description() const { return description_; }

    // The prompt for an OpenAI chat request: messages (already checked: objects with a string role and string
    // content), tools (array or null), add_generation_prompt, and kwargs (chat_template_kwargs: enable_thinking,
    // ...). Throws Error(invalid_argument) with the template's message when rendering fails, Error(unsupported)
    // when there is no chat format.
    std::string render(const ojson& messages, const ojson& tools, bool add_generation_prompt,
                       const ojson& kwargs) const;

    // True when chats are rendered by the built-in ChatML (no Jinja template): its roles are system, user and
    // assistant.
    bool builtin_chatml() const { return !default_ && chatml_.has_value(); }

    // Whether the tokenizer has <think> and </think>, and <tool_call> and </tool_call>.
    bool has_think() const { return think_; }

    // The ids of the markers the output parser splits on (<think>, </think>, <tool_call>, </tool_call>) that the
    // tokenizer has as tokens. A tokenizer may mark them special: the generated text must then be decoded with
    // them kept (StreamDecoder's keep) while other specials (<|im_end|>) are skipped, else they vanish from it.
    const std::vector<int32_t>& marker_ids() const { return marker_ids_; }

private:
    std::string description_ = "none";
    std::shared_ptr<jinja::Template> default_, tool_use_;
    std::optional<ChatTemplate> chatml_;
    ojson special_;  // bos_token, eos_token, pad_token, unk_token as the template sees them
    bool think_ = false;
    std::vector<int32_t> marker_ids_;
};

// Splits generated text into reasoning, content and tool calls as it arrives. feed() takes the next piece of
// text and returns the part of reasoning and content that is final (text that may be the start of a marker is
// held back); finish() returns the rest and the tool calls. Concatenating every delta gives the finished result.
class OutputParser {
public:
    struct Delta {
        std::string reasoning, content;
    };
    struct ToolCall {
        std::string name, arguments;  // arguments: a JSON object as text
    };

    // in_reasoning: the prompt opened a <think> block (generation starts inside it); parse_think: split
    // <think>...</think> off at all; tools: the request's tools (parse <tool_call> blocks only when non-empty; the
    // parameter types of the XML form come from their schemas).
    OutputParser(bool in_reasoning, bool parse_think, const ojson& tools);

    Delta feed(const std::string& text);
    Delta finish();
    const std::vector<ToolCall>& tool_calls() const { return calls_; }

private:
    enum class State { reasoning, content, tool };
    void parse_tool_block(const std::string& block);

    State state_;
    bool parse_think_, parse_tools_, started_ = false, strip_lead_ = false;
    bool echo_possible_;  // the prompt opened the <think> block and the model's first <think>, its echo, may come
    ojson tools_;
    std::string buf_;         // text not yet given out
    std::string tools_text_;  // text from the first <tool_call> on
    std::vector<ToolCall> calls_;
};

// Parses the tool calls in `text` (the <tool_call> blocks); exposed for tests. Text that is not a tool call (an
// unclosed block, bad JSON) is left out of the calls and returned in *rest.
std::vector<OutputParser::ToolCall> parse_tool_calls(const std::string& text, const ojson& tools, std::string* rest);

}  // namespace hy::server
