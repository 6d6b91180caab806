// ChatML prompt formatting (see chat.h).
#include "model/chat.h"

#include "model/common.h"

namespace hy {

ChatTemplate ChatTemplate::for_tokenizer(const Tokenizer& tokenizer) {
    ChatTemplate t;
    int32_t start_id = tokenizer.token_id(t.start_);
    t.end_id_ = tokenizer.token_id(t.end_);
    if (start_id < 0 || t.end_id_ < 0)
        throw Error(Status::unsupported,
                    "unsupported chat template: the tokenizer has no <|im_start|>/<|im_end|> tokens (only ChatML is "
                    "supported)");
    // A marker that is only a vocabulary entry is not matched as one token in text: a rendered chat would be
    // encoded as plain text.
    auto added = [&](const std::string& content) {
        for (const AddedToken& a : tokenizer.added_tokens())
            if (a.content == content) return true;
        return false;
    };
    if (!added(t.start_) || !added(t.end_)) {
        const bool both = !added(t.start_) && !added(t.end_);
        const std::string missing = both ? t.start_ + " and " + t.end_ : !added(t.start_) ? t.start_ : t.end_;
        throw Error(Status::unsupported, "unsupported chat template: " + missing + (both ? " are" : " is") +
                                             " not in tokenizer.json's added_tokens, so a chat prompt would be "
                                             "encoded as plain text");
    }
    t.think_ = tokenizer.token_id("<think>") >= 0 && tokenizer.token_id("</think>") >= 0 && added("<think>") &&
               added("</think>");
    return t;
}

std::string ChatTemplate::think_prefix(Thinking thinking) const {
    if (!think_) return {};
    switch (thinking) {
        case Thinking::disabled: return "<think>\n\n</think>\n\n";
        case Thinking::enabled: return "<think>\n";
        case Thinking::model_decides: return {};
    }
    return {};
}

std::string ChatTemplate::generation_prompt(const ChatOptions& opts) const {
    return start_ + "assistant\n" + think_prefix(opts.thinking);
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, const ChatOptions& opts) const {
    std::string out;
    for (size_t i = 0; i < messages.size(); i++) {
        const ChatMessage& m = messages[i];
        if (m.role != "system" && m.role != "user" && m.role != "assistant")
            throw Error(Status::invalid_argument, "chat message " + std::to_string(i) + ": role '" + m.role +
                                                      "' is not one of system, user, assistant");
        out += start_;
        out += m.role;
        out += '\n';
        out += m.content;
        out += end_;
        out += '\n';
    }
    if (opts.add_generation_prompt) out += generation_prompt(opts);
    return out;
}

std::string ChatTemplate::render_continuation(std::span<const ChatMessage> new_messages, bool context_has_end_of_turn,
                                              const ChatOptions& opts) const {
    std::string out = context_has_end_of_turn ? std::string() : end_;
    out += '\n';
    out += render(new_messages, opts);
    return out;
}

}  // namespace hy
