// UTF-8 helpers of the tokenizer (see utf8.h) and the public UTF-8 functions of tokenizer.h.
#include "model/utf8.h"

#include <utf8proc.h>

#include <cstdlib>

#include "model/tokenizer.h"

namespace hy {

// ---- UTF-8 ------------------------------------------------------------------------------------------------------

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

// The code point that ends at s[end) (s valid UTF-8, end > 0).
uint32_t last_code_point(std::string_view s, size_t end) {
    size_t b = end - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) b--;
    return utf8_step(reinterpret_cast<const unsigned char*>(s.data()) + b, end - b).cp;
}

// Unicode White_Space (what Rust's regex \s matches; used for lstrip/rstrip of added tokens).
bool is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Approximates Rust regex's Unicode \w (Alphabetic, M, Nd, Pc, Join_Control), for single_word added tokens.
bool is_word_char(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
        (c >= 0x1F170 && c <= 0x1F189))
        return true;  // circled/squared letters: Other_Alphabetic symbols
    switch (utf8proc_category(utf8proc_int32_t(c))) {
        case UTF8PROC_CATEGORY_LU:
        case UTF8PROC_CATEGORY_LL:
        case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM:
        case UTF8PROC_CATEGORY_LO:
        case UTF8PROC_CATEGORY_MN:
        case UTF8PROC_CATEGORY_MC:
        case UTF8PROC_CATEGORY_ME:
        case UTF8PROC_CATEGORY_ND:
        case UTF8PROC_CATEGORY_NL:
        case UTF8PROC_CATEGORY_PC: return true;
        default: return false;
    }
}

// ---- normalization ----------------------------------------------------------------------------------------------

namespace {

int utf8proc_options(NormForm f) {
    switch (f) {
        case NormForm::nfc: return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
        case NormForm::nfd: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
        case NormForm::nfkc: return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        case NormForm::nfkd: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    }
    return 0;
}

}  // namespace

// Normalizes valid UTF-8 with utf8proc (appends to out).
void utf8proc_normalize(std::string_view s, NormForm f, std::string& out) {
    if (s.empty()) return;
    utf8proc_uint8_t* buf = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                                      &buf, utf8proc_option_t(utf8proc_options(f)));
    if (n < 0) {
        // Only reachable with invalid UTF-8, which callers sanitize away; keep the text as it is.
        out.append(s);
        return;
    }
    out.append(reinterpret_cast<const char*>(buf), size_t(n));
    std::free(buf);
}

// Normalizes valid UTF-8, touching only the non-ASCII runs (each with the ASCII character before it, which may
// compose with combining marks that follow): ASCII is invariant under every normalization form, an ASCII
// character has combining class 0 (it blocks reordering), and no canonical composition has an ASCII second
// character, so every non-ASCII run can be normalized on its own. Returns false (out untouched) when s is ASCII.
bool normalize_runs(std::string_view s, NormForm f, std::string& out) {
    size_t n = s.size();
    size_t j = 0;
    while (j < n && !(static_cast<unsigned char>(s[j]) & 0x80)) j++;
    if (j == n) return false;
    out.clear();
    out.reserve(n + n / 8);
    size_t i = 0;
    while (i < n) {
        while (j < n && !(static_cast<unsigned char>(s[j]) & 0x80)) j++;
        if (j == n) {
            out.append(s.substr(i));
            break;
        }
        size_t cs = j > i ? j - 1 : j;
        out.append(s.substr(i, cs - i));
        size_t k = j;
        while (k < n && (static_cast<unsigned char>(s[k]) & 0x80)) k++;
        utf8proc_normalize(s.substr(cs, k - cs), f, out);
        i = k;
        j = k;
    }
    return true;
}

// ---- UTF-8 helpers ------------------------------------------------------------------------------------------------

bool utf8_is_valid(std::string_view s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    size_t n = s.size(), i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        Utf8Step st = utf8_step(p + i, n - i);
        if (!st.valid) return false;
        i += size_t(st.len);
    }
    return true;
}

size_t utf8_length(std::string_view s) {
    size_t n = 0;
    for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0u) != 0x80u;
    return n;
}

std::string utf8_sanitize(std::string_view s) {
    std::string out;
    out.reserve(s.size() + 8);
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    size_t n = s.size(), i = 0;
    while (i < n) {
        Utf8Step st = utf8_step(p + i, n - i);
        if (st.valid)
            out.append(s.substr(i, size_t(st.len)));
        else
            out += kReplacement;
        i += size_t(st.len);
    }
    return out;
}

std::string utf8_nfc(std::string_view s) {
    std::string clean;
    if (!utf8_is_valid(s)) {
        clean = utf8_sanitize(s);
        s = clean;
    }
    std::string out;
    utf8proc_normalize(s, NormForm::nfc, out);
    return out;
}

}  // namespace hy
