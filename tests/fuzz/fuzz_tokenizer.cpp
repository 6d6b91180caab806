// libFuzzer target for the tokenizer: encode/decode of arbitrary bytes with the tiny model's tokenizer.json
// (override with the environment variable HY_FUZZ_TOKENIZER=path/to/tokenizer.json).
//
// Input: byte 0 selects options (bit 0: parse_special, bit 1: skip_special, bit 2: interpret the rest as token ids
// to decode); the rest is the text. Checked properties:
//   - encode never throws; every id names a token;
//   - decode(encode(t)) is valid UTF-8 and equals NFC(sanitize(t)) when t has no '<' (no added token can match);
//   - encode(decode(encode(t))) == encode(t);
//   - streaming decode (StreamDecoder) equals decode;
//   - decoding arbitrary ids either works or throws hy::Error(invalid_argument).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "model/common.h"
#include "model/tokenizer.h"

#ifndef HY_FUZZ_TOKENIZER_JSON
#define HY_FUZZ_TOKENIZER_JSON "models/tiny/tokenizer.json"
#endif

namespace {

const hy::Tokenizer* g_tok = nullptr;

[[noreturn]] void fail(const char* what) {
    __builtin_fprintf(stderr, "fuzz_tokenizer: property violated: %s\n", what);
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const char* path = std::getenv("HY_FUZZ_TOKENIZER");
    g_tok = new hy::Tokenizer(hy::Tokenizer::from_file(path ? path : HY_FUZZ_TOKENIZER_JSON));
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const hy::Tokenizer& tok = *g_tok;
    uint8_t mode = data[0];
    bool parse_special = mode & 1, skip_special = mode & 2;
    std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

    if (mode & 4) {  // arbitrary ids: decode works or reports invalid_argument
        std::vector<int32_t> ids;
        for (size_t i = 0; i + 2 <= text.size(); i += 2)
            ids.push_back(int32_t(uint16_t(uint8_t(text[i]) | uint8_t(text[i + 1]) << 8)) - 8);
        try {
            std::string s = tok.decode(ids, skip_special);
            if (!hy::utf8_is_valid(s)) fail("decode of ids is not valid UTF-8");
            hy::StreamDecoder sd(tok, skip_special);
            std::string streamed;
            for (int32_t id : ids) streamed += sd.push(id);
            streamed += sd.flush();
            if (streamed != s) fail("stream decode != decode (ids)");
        } catch (const hy::Error& e) {
            if (e.status() != hy::Status::invalid_argument) fail("decode threw something other than invalid_argument");
        }
        return 0;
    }

    std::vector<int32_t> ids = tok.encode(text, parse_special);
    for (int32_t id : ids)
        if (!tok.is_valid(id)) fail("encode produced an invalid id");
    std::string decoded = tok.decode(ids);
    if (!hy::utf8_is_valid(decoded)) fail("decode is not valid UTF-8");
    std::string clean = hy::utf8_sanitize(text);
    if (clean.find('<') == std::string::npos && decoded != hy::utf8_nfc(clean)) fail("decode(encode(t)) != NFC(t)");
    if (tok.encode(decoded, parse_special) != ids) fail("encode(decode(encode(t))) != encode(t)");

    hy::StreamDecoder sd(tok, skip_special);
    std::string streamed;
    for (int32_t id : ids) {
        std::string piece = sd.push(id);
        if (!hy::utf8_is_valid(piece)) fail("StreamDecoder::push emitted invalid UTF-8");
        streamed += piece;
    }
    streamed += sd.flush();
    if (streamed != tok.decode(ids, skip_special)) fail("stream decode != decode");
    return 0;
}
