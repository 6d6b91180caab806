// libFuzzer target for the chat-template Jinja subset (model/jinja.h): the input is a template, rendered with a small
// chat context. Checked: parsing either succeeds or throws hy::Error(format); rendering either succeeds or throws
// hy::Error(invalid_argument); nothing else escapes, nothing crashes, leaks or hangs (the renderer's step and size
// limits).
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "base/common.h"
#include "model/jinja.h"

namespace {

[[noreturn]] void fail(const char* what) {
    __builtin_fprintf(stderr, "fuzz_jinja: property violated: %s\n", what);
    std::abort();
}

const hy::jinja::Value& context() {
    static const hy::jinja::Value ctx = hy::jinja::from_json(nlohmann::ordered_json::parse(R"({
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo <think>"},
                     {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHi", "tool_calls": [
                         {"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null], "b": true}}}]},
                     {"role": "tool", "content": "{\"ok\": 1}"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "add_generation_prompt": true, "enable_thinking": false, "eos_token": "<|im_end|>"})"));
    return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string source(reinterpret_cast<const char*>(data), size);
    try {
        const hy::jinja::Template t(source);
        try {
            (void)t.render(context());
        } catch (const hy::Error& e) {
            if (e.status() != hy::Status::invalid_argument) fail("a render error that is not invalid_argument");
        }
    } catch (const hy::Error& e) {
        if (e.status() != hy::Status::format && e.status() != hy::Status::invalid_argument)
            fail("a parse error that is not format");
    } catch (const std::exception& e) {
        __builtin_fprintf(stderr, "fuzz_jinja: %s\n", e.what());
        fail("an exception that is not hy::Error");
    }
    return 0;
}
