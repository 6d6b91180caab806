// UTF-8 helpers of the tokenizer: decoding steps, encoding, the character classes that added tokens need, and
// Unicode normalization (utf8proc). The public ones (utf8_sanitize, utf8_is_valid, utf8_nfc) are in tokenizer.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace hy {

// One step of a UTF-8 decoder over p[0..n). valid: a well-formed sequence of `len` bytes (cp set). Otherwise `len`
// is the length of the maximal subpart (>= 1) that must be replaced by one U+FFFD, and `truncated` tells that it
// is a well-formed prefix cut by the end of the buffer (so more bytes could complete it).
struct Utf8Step {
    int len;
    bool valid;
    bool truncated;
    uint32_t cp;
};

inline Utf8Step utf8_step(const unsigned char* p, size_t n) {
    unsigned c = p[0];
    if (c < 0x80) return {1, true, false, c};
    int need;
    uint32_t cp;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        cp = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        cp = c & 0x07;
        if (c == 0xF0) lo = 0x90;  // no overlongs
        if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
        return {1, false, false, 0};
    }
    for (int i = 1; i <= need; i++) {
        if (size_t(i) >= n) return {i, false, true, 0};
        unsigned b = p[i];
        if (b < lo || b > hi) return {i, false, false, 0};
        lo = 0x80;
        hi = 0xBF;
        cp = (cp << 6) | (b & 0x3F);
    }
    return {need + 1, true, false, cp};
}

inline constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

inline bool all_ascii(const char* s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ull) return false;
    }
    for (; i < n; i++)
        if (static_cast<unsigned char>(s[i]) & 0x80) return false;
    return true;
}

void append_utf8(std::string& out, uint32_t cp);

// The code point that ends at s[end) (s valid UTF-8, end > 0).
uint32_t last_code_point(std::string_view s, size_t end);

// Unicode White_Space (what Rust's regex \s matches; used for lstrip/rstrip of added tokens).
bool is_white_space(uint32_t c);

// Approximates Rust regex's Unicode \w (Alphabetic, M, Nd, Pc, Join_Control), for single_word added tokens.
bool is_word_char(uint32_t c);

// ---- normalization ----------------------------------------------------------------------------------------------

enum class NormForm { nfc, nfd, nfkc, nfkd };

// Normalizes valid UTF-8 with utf8proc (appends to out).
void utf8proc_normalize(std::string_view s, NormForm f, std::string& out);

// Normalizes valid UTF-8, touching only the non-ASCII runs (each with the ASCII character before it, which may
// compose with combining marks that follow): ASCII is invariant under every normalization form, an ASCII
// character has combining class 0 (it blocks reordering), and no canonical composition has an ASCII second
// character, so every non-ASCII run can be normalized on its own. Returns false (out untouched) when s is ASCII.
bool normalize_runs(std::string_view s, NormForm f, std::string& out);

}  // namespace hy
