// Chat prompt formatting (ChatML, the format of Qwen2/Qwen3/Qwen3.5 instruct models).
//
// Rendering of one message:          <|im_start|>{role}\n{content}<|im_end|>\n
// Generation prompt (optional):      <|im_start|>assistant\n{think prefix}
// Think prefix (only when the tokenizer has <think> and </think>):
//   Thinking::disabled       "<think>\n\n</think>\n\n"   (Qwen3/Qwen3.5 with enable_thinking=false)
//   Thinking::enabled        "<think>\n"                 (Qwen3.5 with enable_thinking=true: the block is opened)
//   Thinking::model_decides  ""                          (Qwen3 with enable_thinking=true; plain ChatML)
// Contents are inserted verbatim: an assistant message in the history is rendered as given (no think-block
// stripping as in Qwen3's Jinja template), so that a conversation only ever grows by appending and a KV cache
// can be reused from turn to turn (see render_continuation).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace hy {

struct ChatMessage {
    std::string role;     // "system", "user" or "assistant"
    std::string content;  // UTF-8, inserted verbatim
};

enum class Thinking { disabled, enabled, model_decides };

struct ChatOptions {
    bool add_generation_prompt = true;  // end with the assistant header and the think prefix
    Thinking thinking = Thinking::disabled;
};

class ChatTemplate {
public:
    // Detects the chat format from the tokenizer's special tokens: ChatML when both <|im_start|> and <|im_end|>
    // exist. Throws hy::Error(Status::unsupported, "unsupported chat template: ...") otherwise.
    static ChatTemplate for_tokenizer(const Tokenizer& tokenizer);

    // "chatml".
    const char* name() const { return "chatml"; }

    // The whole prompt for `messages` (may be empty). Throws hy::Error(Status::invalid_argument) naming the
    // message index for a role other than system/user/assistant.
    std::string render(std::span<const ChatMessage> messages, const ChatOptions& opts = {}) const;

    // The text to prefill after a generated assistant answer so that the context continues as if the whole
    // conversation had been rendered at once. The context ends right after the answer's last generated token:
    //   context_has_end_of_turn = true   the context already holds the <|im_end|> that closed the answer
    //                                    (the engine fed the stop token);
    //   context_has_end_of_turn = false  it does not (stop token sampled but not fed, or the length limit hit):
    //                                    "<|im_end|>" is emitted first.
    // Result: ["<|im_end|>"] "\n" render(new_messages, opts). Invariant (with answer = the generated text and
    // prefix = generation_prompt(opts) minus its header):
    //   render(history + {assistant, prefix + answer} + new_messages, opts)
    //     == render(history, opts with add_generation_prompt) + answer + "<|im_end|>" +
    //        render_continuation(new_messages, true, opts)
    std::string render_continuation(std::span<const ChatMessage> new_messages, bool context_has_end_of_turn,
                                    const ChatOptions& opts = {}) const;

    // "<|im_start|>assistant\n" followed by the think prefix of opts.thinking.
    std::string generation_prompt(const ChatOptions& opts = {}) const;

    // The think prefix alone ("" when the tokenizer has no <think>/</think> tokens).
    std::string think_prefix(Thinking thinking) const;

    // The end-of-turn token text and id (<|im_end|>): generation stops on it (callers add it to the stop set).
    const std::string& end_of_turn() const { return end_; }
    int32_t end_of_turn_id() const { return end_id_; }

    // True when the tokenizer has both <think> and </think>.
    bool has_think_tokens() const { return think_; }

private:
    ChatTemplate() = default;
    std::string start_ = "<|im_start|>";
    std::string end_ = "<|im_end|>";
    int32_t end_id_ = -1;
    bool think_ = false;
};

}  // namespace hy
