// Byte-level BPE tokenizer (see tokenizer.h for the pipeline and the documented differences from Hugging Face).
#include "model/tokenizer.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "model/common.h"

namespace hy {

namespace {

using json = nlohmann::json;

// ---- UTF-8 ----------------------------------------------------------------------------------------------------

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

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

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

// ---- GPT-2 byte-level alphabet -------------------------------------------------------------------------------

// Printable bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) map to the same code point; the other 68 bytes map to
// U+0100 + k in byte order.
struct ByteAlphabet {
    std::array<uint32_t, 256> cp{};      // byte -> code point
    std::array<std::string, 256> utf8;   // byte -> its character as UTF-8
    std::array<int16_t, 0x144> byte_of;  // code point (< 0x144) -> byte, -1 when not in the alphabet

    ByteAlphabet() {
        byte_of.fill(-1);
        uint32_t extra = 0;
        for (int b = 0; b < 256; b++) {
            bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            cp[b] = printable ? uint32_t(b) : 0x100 + extra++;
            append_utf8(utf8[b], cp[b]);
            byte_of[cp[b]] = int16_t(b);
        }
    }
};

const ByteAlphabet& byte_alphabet() {
    static const ByteAlphabet a;
    return a;
}

// The bytes a token string stands for under the ByteLevel decoder: every character mapped back to its byte; a
// string with a character outside the alphabet (e.g. an added token with a space) stands for its own UTF-8 bytes.
// Appends the result to `out`.
void byte_level_decode_into(std::string_view tok, std::string& out) {
    const ByteAlphabet& a = byte_alphabet();
    size_t start = out.size();
    const auto* p = reinterpret_cast<const unsigned char*>(tok.data());
    size_t i = 0, n = tok.size();
    while (i < n) {
        if (p[i] < 0x80 && a.byte_of[p[i]] >= 0) {  // fast path: printable ASCII stands for itself
            out += char(p[i]);
            i++;
            continue;
        }
        Utf8Step st = utf8_step(p + i, n - i);
        if (!st.valid || st.cp >= a.byte_of.size() || a.byte_of[st.cp] < 0) {
            out.resize(start);
            out.append(tok);
            return;
        }
        out += char(a.byte_of[st.cp]);
        i += size_t(st.len);
    }
}

std::string byte_level_encode(std::string_view bytes) {
    const ByteAlphabet& a = byte_alphabet();
    std::string out;
    out.reserve(bytes.size() * 2);
    for (unsigned char b : bytes) out += a.utf8[b];
    return out;
}

// ---- hashing --------------------------------------------------------------------------------------------------

// 64-bit hash of a short byte string: 8-byte chunks, multiply and xor-shift mixing. Not for hostile keys (the
// keys are vocabulary strings and pre-tokenized words; a collision costs only a probe).
inline uint64_t hash_bytes(std::string_view s) {
    constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
    uint64_t h = 0x243F6A8885A308D3ull ^ (uint64_t(s.size()) * kMul);
    const char* p = s.data();
    size_t n = s.size();
    while (n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        h = (h ^ w) * kMul;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        std::memcpy(&w, p, n);
        h = (h ^ w) * kMul;
        h ^= h >> 29;
    }
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 32);
}

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return size_t(hash_bytes(s)); }
};
using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Open-addressing table (token id pair) -> (merge rank, merged token id).
class MergeTable {
public:
    struct Entry {
        uint64_t key = kEmpty;
        int32_t rank = 0;
        int32_t id = 0;
    };

    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2) cap <<= 1;
        slots_.assign(cap, Entry{});
        mask_ = cap - 1;
        shift_ = 64 - __builtin_ctzll(cap);
    }

    // Inserts or overwrites (a later duplicate merge wins, as in Hugging Face).
    void put(int32_t a, int32_t b, int32_t rank, int32_t id) {
        uint64_t key = pack(a, b);
        for (size_t i = slot(key);; i = (i + 1) & mask_) {
            if (slots_[i].key == kEmpty || slots_[i].key == key) {
                slots_[i] = Entry{key, rank, id};
                return;
            }
        }
    }

    void prefetch(int32_t a, int32_t b) const { __builtin_prefetch(&slots_[slot(pack(a, b))]); }

    const Entry* find(int32_t a, int32_t b) const {
        uint64_t key = pack(a, b);
        for (size_t i = slot(key);; i = (i + 1) & mask_) {
            const Entry& e = slots_[i];
            if (e.key == key) return &e;
            if (e.key == kEmpty) return nullptr;
        }
    }

private:
    static constexpr uint64_t kEmpty = ~uint64_t(0);
    static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
    size_t slot(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_; }

    std::vector<Entry> slots_;
    size_t mask_ = 0;
    int shift_ = 60;
};

// ---- regex (PCRE2) ----------------------------------------------------------------------------------------------

// PCRE2 (10.42, UCP) matches U+180E MONGOLIAN VOWEL SEPARATOR with \s; Oniguruma (Hugging Face) follows the
// Unicode White_Space property, which lost U+180E in Unicode 6.3. The pattern is rewritten to spell \s out as
// that property: \s and \S outside character classes and \s inside classes (\S inside a class is kept).
// \Q...\E quoting and POSIX [:name:] classes are respected.
constexpr const char* kWhiteSpaceSet =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string onig_compat_pattern(std::string_view p) {
    std::string out;
    out.reserve(p.size() + 32);
    bool in_class = false;
    size_t i = 0;
    while (i < p.size()) {
        char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            char d = p[i + 1];
            if (d == 'Q') {  // copy the quoted run verbatim
                size_t e = p.find("\\E", i + 2);
                size_t stop = e == std::string_view::npos ? p.size() : e + 2;
                out.append(p.substr(i, stop - i));
                i = stop;
                continue;
            }
            if (d == 's') {
                if (!in_class) out += '[';
                out += kWhiteSpaceSet;
                if (!in_class) out += ']';
            } else if (d == 'S' && !in_class) {
                out += "[^";
                out += kWhiteSpaceSet;
                out += ']';
            } else {
                out += c;
                out += d;
            }
            i += 2;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out += c;
            i++;
            if (i < p.size() && p[i] == '^') out += p[i++];
            if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ] is a literal
            continue;
        }
        if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:name:]
            size_t e = p.find(":]", i + 2);
            if (e != std::string_view::npos) {
                out.append(p.substr(i, e + 2 - i));
                i = e + 2;
                continue;
            }
        }
        if (in_class && c == ']') in_class = false;
        out += c;
        i++;
    }
    return out;
}

// Per-call matching state (match data, lazily a JIT stack); not shared between threads.
struct MatchScratch {
    pcre2_match_data* md = nullptr;
    pcre2_match_context* mctx = nullptr;
    pcre2_jit_stack* jit_stack = nullptr;

    MatchScratch() {
        md = pcre2_match_data_create(1, nullptr);
        if (!md) throw Error(Status::out_of_memory, "tokenizer: cannot allocate regex match data");
    }
    ~MatchScratch() {
        if (jit_stack) pcre2_jit_stack_free(jit_stack);
        if (mctx) pcre2_match_context_free(mctx);
        pcre2_match_data_free(md);
    }
    MatchScratch(const MatchScratch&) = delete;
    MatchScratch& operator=(const MatchScratch&) = delete;

    pcre2_match_context* context() {
        if (!mctx) {
            mctx = pcre2_match_context_create(nullptr);
            if (!mctx) throw Error(Status::out_of_memory, "tokenizer: cannot allocate a regex match context");
        }
        return mctx;
    }
};

class Regex {
public:
    Regex(const std::string& pattern, bool literal, const std::string& where) : where_(where) {
        std::string pat = literal ? pattern : onig_compat_pattern(pattern);
        int err = 0;
        PCRE2_SIZE off = 0;
        uint32_t opts = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), opts, &err, &off, nullptr);
        if (!code_) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            throw Error(Status::format, where + ": regex does not compile at offset " + std::to_string(off) + ": " +
                                            reinterpret_cast<const char*>(msg));
        }
        jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
    }
    ~Regex() { pcre2_code_free(code_); }
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Finds the first match in s[0..n) starting at or after `start`; false when there is none. s is valid UTF-8.
    // Backtracking is bounded by a number of steps that grows with the piece (a long piece of a linear pattern takes
    // a few steps a byte; nested quantifiers such as "(a+)+b" take exponentially many on a short one): past it,
    // Error(format) names the regex instead of running for hours.
    bool find(const char* s, size_t n, size_t start, MatchScratch& m, size_t& ms, size_t& me) const {
        auto subj = reinterpret_cast<PCRE2_SPTR>(s);
        const uint64_t limit = std::min<uint64_t>(UINT32_MAX, std::max<uint64_t>(10'000'000, 64 * uint64_t(n - start)));
        pcre2_match_context* ctx = m.context();
        pcre2_set_match_limit(ctx, uint32_t(limit));
        int rc;
        if (jit_) {
            rc = pcre2_jit_match(code_, subj, n, start, 0, m.md, ctx);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // deep backtracking: retry with a large JIT stack
                if (!m.jit_stack) {
                    m.jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
                    if (m.jit_stack) pcre2_jit_stack_assign(ctx, nullptr, m.jit_stack);
                }
                if (m.jit_stack) rc = pcre2_jit_match(code_, subj, n, start, 0, m.md, ctx);
            }
            if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && rc != PCRE2_ERROR_MATCHLIMIT) {
                pcre2_set_heap_limit(ctx, 4u * 1024 * 1024);  // last resort: the interpreter, with a large heap (KiB)
                rc = pcre2_match(code_, subj, n, start, PCRE2_NO_JIT | PCRE2_NO_UTF_CHECK, m.md, ctx);
            }
        } else {
            rc = pcre2_match(code_, subj, n, start, PCRE2_NO_UTF_CHECK, m.md, ctx);
        }
        if (rc == PCRE2_ERROR_NOMATCH) return false;
        if (rc == PCRE2_ERROR_MATCHLIMIT)
            throw Error(Status::format, where_ + ": the regex takes more than " + std::to_string(limit) +
                                            " backtracking steps on a " + std::to_string(n - start) +
                                            "-byte piece (nested quantifiers such as (a+)+?)");
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            throw Error(Status::internal, "tokenizer: regex match failed on a " + std::to_string(n) +
                                              "-byte piece: " + reinterpret_cast<const char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
        ms = ov[0];
        me = ov[1];
        return true;
    }

private:
    std::string where_;  // the regex's place in tokenizer.json, for messages
    pcre2_code* code_ = nullptr;
    bool jit_ = false;
};

// The GPT-2 pattern that ByteLevel(use_regex=true) splits with.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// ---- added-token trie -------------------------------------------------------------------------------------------

class TokenTrie {
public:
    TokenTrie() { nodes_.emplace_back(); }

    void insert(std::string_view s, int32_t index) {
        if (s.empty()) return;
        first_[static_cast<unsigned char>(s[0])] = true;
        int32_t n = 0;
        for (unsigned char c : s) {
            int32_t next = child(n, c);
            if (next < 0) {
                next = int32_t(nodes_.size());
                nodes_[size_t(n)].edges.emplace_back(c, next);
                nodes_.emplace_back();
            }
            n = next;
        }
        nodes_[size_t(n)].value = index;
        empty_ = false;
    }

    bool empty() const { return empty_; }
    bool may_start(unsigned char c) const { return first_[c]; }

    // Longest entry that starts at s[pos]: returns its index and sets `end`; -1 when none.
    int32_t longest_at(std::string_view s, size_t pos, size_t& end) const {
        int32_t n = 0, best = -1;
        for (size_t i = pos; i < s.size(); i++) {
            n = child(n, static_cast<unsigned char>(s[i]));
            if (n < 0) break;
            if (nodes_[size_t(n)].value >= 0) {
                best = nodes_[size_t(n)].value;
                end = i + 1;
            }
        }
        return best;
    }

private:
    struct Node {
        std::vector<std::pair<unsigned char, int32_t>> edges;
        int32_t value = -1;
    };
    int32_t child(int32_t n, unsigned char c) const {
        for (const auto& e : nodes_[size_t(n)].edges)
            if (e.first == c) return e.second;
        return -1;
    }
    std::vector<Node> nodes_;
    std::array<bool, 256> first_{};
    bool empty_ = true;
};

// ---- word cache -------------------------------------------------------------------------------------------------

// Encoded short words. Sharded by hash, each shard a mutex-protected table of cache-line slots (key and ids
// inline, so a lookup touches one line); a word probes 4 slots and replaces the one it hashes to when all are
// taken. Words longer than kMaxKey bytes or of more than kMaxIds tokens are not cached.
class WordCache {
public:
    static constexpr size_t kMaxKey = 22, kMaxIds = 8;

    bool get(std::string_view w, uint64_t h, std::vector<int32_t>& out) const {
        Shard& sh = shard(h);
        std::lock_guard<std::mutex> lock(sh.m);
        if (!sh.slots) return false;
        for (size_t k = 0; k < kProbe; k++) {
            const Slot& s = sh.slots[(h + k) & kMask];
            if (s.hash == (h | 1) && s.key_len == w.size() && std::memcmp(s.key, w.data(), w.size()) == 0) {
                out.insert(out.end(), s.ids, s.ids + s.n_ids);
                return true;
            }
        }
        return false;
    }

    void put(std::string_view w, uint64_t h, const int32_t* ids, size_t n) const {
        if (w.size() > kMaxKey || n > kMaxIds || n == 0) return;
        Shard& sh = shard(h);
        std::lock_guard<std::mutex> lock(sh.m);
        if (!sh.slots) sh.slots = std::make_unique<Slot[]>(kSlots);
        Slot* dst = &sh.slots[h & kMask];
        for (size_t k = 0; k < kProbe; k++) {
            Slot& s = sh.slots[(h + k) & kMask];
            if (s.hash == 0) {
                dst = &s;
                break;
            }
        }
        dst->hash = h | 1;
        dst->key_len = uint8_t(w.size());
        dst->n_ids = uint8_t(n);
        std::memcpy(dst->key, w.data(), w.size());
        std::memcpy(dst->ids, ids, n * sizeof(int32_t));
    }

private:
    static constexpr size_t kShards = 16, kSlots = 4096, kMask = kSlots - 1, kProbe = 4;
    struct alignas(64) Slot {
        uint64_t hash = 0;  // 0: empty; else the word's hash with bit 0 set
        uint8_t key_len = 0, n_ids = 0;
        char key[kMaxKey];
        int32_t ids[kMaxIds];
    };
    static_assert(sizeof(Slot) == 64);
    struct Shard {
        std::mutex m;
        std::unique_ptr<Slot[]> slots;  // [kSlots], allocated on first use
    };
    Shard& shard(uint64_t h) const { return shards_[(h >> 59) & (kShards - 1)]; }
    mutable std::array<Shard, kShards> shards_;
};

// ---- tokenizer.json streaming reader ----------------------------------------------------------------------------

// SAX handler that builds a DOM for everything except model.vocab and model.merges (the bulk of the file), which
// it streams into flat arenas without one allocation per string: parsing an 11 MB tokenizer.json this way takes
// a third of the time of a full DOM.
class TokenizerJsonReader : public nlohmann::json_sax<json> {
public:
    struct Span {
        uint32_t off, len;
    };
    struct VocabEntry {
        Span key;
        int64_t id;
    };
    struct MergeEntry {
        Span a, b;
    };

    json root;
    bool have_vocab = false, have_merges = false;
    std::string vocab_arena;  // vocab keys back to back
    std::vector<VocabEntry> vocab;
    std::string merge_arena;  // merge halves back to back
    std::vector<MergeEntry> merges;
    std::string error;

    bool null() override { return value(json()); }
    bool boolean(bool v) override { return value(json(v)); }
    bool number_integer(number_integer_t v) override {
        if (mode_ == Mode::vocab) {
            vocab.push_back(VocabEntry{vocab_key_, int64_t(v)});
            return true;
        }
        return value(json(v));
    }
    bool number_unsigned(number_unsigned_t v) override {
        if (mode_ == Mode::vocab) {
            vocab.push_back(VocabEntry{vocab_key_, v > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(v)});
            return true;
        }
        return value(json(v));
    }
    bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
    bool binary(binary_t&) override { return fail("unexpected binary value"); }
    bool string(string_t& s) override {
        if (mode_ == Mode::merges) {
            size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                return fail("model.merges[" + std::to_string(merges.size()) + "]: '" + s +
                            "' is not two tokens separated by one space");
            Span a = store(merge_arena, std::string_view(s).substr(0, sp));
            Span b = store(merge_arena, std::string_view(s).substr(sp + 1));
            merges.push_back(MergeEntry{a, b});
            return !overflow_ || fail("model.merges is too large");
        }
        if (mode_ == Mode::merge_pair) {
            if (pair_n_ < 2) pair_[pair_n_] = store(merge_arena, s);
            pair_n_++;
            return !overflow_ || fail("model.merges is too large");
        }
        return value(json(std::move(s)));
    }
    bool start_object(std::size_t) override {
        if (mode_ == Mode::normal && at_model_field("vocab")) {
            mode_ = Mode::vocab;
            return true;
        }
        if (mode_ != Mode::normal) return fail(where() + " holds an unexpected object");
        stack_.push_back(Frame{json::object(), {}});
        return true;
    }
    bool key(string_t& k) override {
        if (mode_ == Mode::vocab) {
            vocab_key_ = store(vocab_arena, k);
            return !overflow_ || fail("model.vocab is too large");
        }
        stack_.back().key = std::move(k);
        return true;
    }
    bool end_object() override {
        if (mode_ == Mode::vocab) {
            mode_ = Mode::normal;
            have_vocab = true;
            return value(json::object());  // placeholder; the entries are in `vocab`
        }
        return pop();
    }
    bool start_array(std::size_t) override {
        if (mode_ == Mode::normal && at_model_field("merges")) {
            mode_ = Mode::merges;
            return true;
        }
        if (mode_ == Mode::merges) {
            mode_ = Mode::merge_pair;
            pair_n_ = 0;
            return true;
        }
        if (mode_ != Mode::normal) return fail(where() + " holds an unexpected array");
        stack_.push_back(Frame{json::array(), {}});
        return true;
    }
    bool end_array() override {
        if (mode_ == Mode::merge_pair) {
            if (pair_n_ != 2)
                return fail("model.merges[" + std::to_string(merges.size()) + "] is not a pair of two strings");
            merges.push_back(MergeEntry{pair_[0], pair_[1]});
            mode_ = Mode::merges;
            return true;
        }
        if (mode_ == Mode::merges) {
            mode_ = Mode::normal;
            have_merges = true;
            return value(json::array());  // placeholder; the entries are in `merges`
        }
        return pop();
    }
    bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& ex) override {
        if (error.empty()) error = "malformed JSON near byte " + std::to_string(pos) + ": " + json_error_text(ex.what());
        return false;
    }

private:
    enum class Mode { normal, vocab, merges, merge_pair };
    struct Frame {
        json value;
        std::string key;
    };

    Span store(std::string& arena, std::string_view s) {
        if (arena.size() + s.size() > UINT32_MAX) {
            overflow_ = true;
            return Span{0, 0};
        }
        Span sp{uint32_t(arena.size()), uint32_t(s.size())};
        arena.append(s);
        return sp;
    }
    bool at_model_field(const char* name) const {
        return stack_.size() == 2 && stack_[0].key == "model" && stack_[1].value.is_object() &&
               stack_[1].key == name;
    }
    std::string where() const {
        switch (mode_) {
            case Mode::vocab: return "model.vocab";
            case Mode::merges: return "model.merges";
            case Mode::merge_pair: return "model.merges[" + std::to_string(merges.size()) + "]";
            default: return "tokenizer.json";
        }
    }
    bool fail(const std::string& msg) {
        if (error.empty()) error = msg;
        return false;
    }
    bool value(json&& v) {
        if (mode_ != Mode::normal) return fail(where() + " holds a value of the wrong type");
        if (stack_.empty()) {
            root = std::move(v);
            return true;
        }
        Frame& top = stack_.back();
        if (top.value.is_object())
            top.value[top.key] = std::move(v);
        else
            top.value.push_back(std::move(v));
        return true;
    }
    bool pop() {
        json v = std::move(stack_.back().value);
        stack_.pop_back();
        return value(std::move(v));
    }

    Mode mode_ = Mode::normal;
    std::vector<Frame> stack_;
    Span vocab_key_{0, 0};
    Span pair_[2]{};
    size_t pair_n_ = 0;
    bool overflow_ = false;
};

std::string read_file(const std::string& path) { return read_regular_file(path, kMaxJsonFileBytes); }

// Typed field access with one-line errors naming the file and the field.
const json* field(const json& obj, const char* name) {
    if (!obj.is_object()) return nullptr;
    auto it = obj.find(name);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
}

bool get_bool(const json& obj, const char* name, bool def, const std::string& where) {
    const json* v = field(obj, name);
    if (!v) return def;
    if (!v->is_boolean()) throw Error(Status::format, where + "." + name + " must be a boolean");
    return v->get<bool>();
}

std::string get_string(const json& obj, const char* name, const std::string& where) {
    const json* v = field(obj, name);
    if (!v || !v->is_string()) throw Error(Status::format, where + "." + name + " must be a string");
    return v->get<std::string>();
}

std::string type_of(const json& obj, const std::string& where) {
    if (!obj.is_object()) throw Error(Status::format, where + " must be an object");
    return get_string(obj, "type", where);
}

enum class NormForm { nfc, nfd, nfkc, nfkd };

int utf8proc_options(NormForm f) {
    switch (f) {
        case NormForm::nfc: return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
        case NormForm::nfd: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
        case NormForm::nfkc: return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        case NormForm::nfkd: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    }
    return 0;
}

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

// One step of the pre-tokenizer: a regex split (Isolated) or ByteLevel's prefix space.
struct PreStep {
    enum class Kind { split, prefix_space } kind;
    std::unique_ptr<Regex> regex;  // split only
};

}  // namespace

// ---- the tokenizer ----------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
    std::string origin;  // file name for messages

    // model
    std::string vocab_arena;               // vocab strings back to back (byte-level alphabet, as in the file)
    std::vector<uint32_t> vocab_off;       // [n_vocab] offset of the vocab string of each id
    std::vector<uint32_t> vocab_len;       // [n_vocab] its length; kNone when the id has no vocab string
    struct VocabSlot {
        uint32_t tag = 0;  // high 32 bits of the key's hash
        int32_t id = -1;   // -1: empty
        uint32_t off = 0, len = 0;  // the key in vocab_arena
    };
    std::vector<VocabSlot> vocab_slots;    // open-addressing table vocab string -> id
    size_t vocab_mask = 0;
    MergeTable merges;                     // (left id, right id) -> (rank, merged id)
    std::array<int32_t, 256> byte_id{};    // byte -> id of its one-character token, -1 when absent
    int32_t unk_id = -1;
    bool fuse_unk = false;
    bool ignore_merges = false;

    // ids -> tokens
    static constexpr uint32_t kNone = UINT32_MAX;
    int32_t n_vocab = 0;
    std::string bytes_arena;               // token bytes after the ByteLevel decoder, back to back
    std::vector<uint32_t> bytes_off;       // [n_vocab + 1] token id's bytes are [bytes_off[id], bytes_off[id+1])
    std::vector<uint8_t> id_flags;         // [n_vocab] bit 0: assigned, bit 1: special, bit 2: added token
    std::unordered_map<int32_t, size_t> added_by_id;  // id -> index in `added`

    // added tokens
    std::vector<AddedToken> added;
    StringMap added_ids;  // content -> id
    TokenTrie raw_trie;   // normalized=false tokens (value: index in `added`)
    TokenTrie norm_trie;  // normalized=true tokens, matched on normalized text

    // normalizer, pre-tokenizer
    std::vector<NormForm> norms;
    std::vector<PreStep> steps;

    // special-token settings
    std::vector<int32_t> eos;
    int32_t bos = -1, pad = -1;
    bool add_bos = false;

    WordCache cache;

    void check_id(int32_t id) const {
        if (id < 0 || id >= n_vocab || !(id_flags[size_t(id)] & 1))
            throw Error(Status::invalid_argument,
                        "token id " + std::to_string(id) + " is not in the vocabulary (n_vocab " +
                            std::to_string(n_vocab) + ")");
    }

    std::string_view vocab_string(int32_t id) const {
        return std::string_view(vocab_arena).substr(vocab_off[size_t(id)], vocab_len[size_t(id)]);
    }

    std::string_view token_bytes(int32_t id) const {
        size_t b = bytes_off[size_t(id)], e = bytes_off[size_t(id) + 1];
        return std::string_view(bytes_arena).substr(b, e - b);
    }

    // The slot of vocab string s: the one holding it, or the empty slot where it would go.
    size_t vocab_slot(std::string_view s) const { return vocab_slot(s, hash_bytes(s)); }
    size_t vocab_slot(std::string_view s, uint64_t h) const {
        uint32_t tag = uint32_t(h >> 32);
        for (size_t i = size_t(h) & vocab_mask;; i = (i + 1) & vocab_mask) {
            const VocabSlot& v = vocab_slots[i];
            if (v.id < 0) return i;
            if (v.tag == tag && v.len == s.size() && std::memcmp(vocab_arena.data() + v.off, s.data(), s.size()) == 0)
                return i;
        }
    }

    // Vocab string -> id, or -1.
    int32_t vocab_find(std::string_view s) const { return vocab_slots[vocab_slot(s)].id; }
    int32_t vocab_find(std::string_view s, uint64_t h) const { return vocab_slots[vocab_slot(s, h)].id; }
    void vocab_prefetch(uint64_t h) const { __builtin_prefetch(&vocab_slots[size_t(h) & vocab_mask]); }

    // Vocab id of the token whose bytes are `bytes` (mapped to the byte-level alphabet), or -1.
    int32_t lookup_vocab_bytes(std::string_view bytes) const { return vocab_find(byte_level_encode(bytes)); }

    int32_t lookup(std::string_view tok) const {
        auto a = added_ids.find(tok);
        if (a != added_ids.end()) return a->second;
        return vocab_find(tok);
    }

    // -- encode --
    struct Ctx {
        MatchScratch scratch;
        std::vector<int32_t>* out;
        bool parse_special;
        std::vector<int32_t> tmp_ids;
    };

    template <class OnText>
    void split_added(std::string_view s, const TokenTrie& trie, Ctx& ctx, OnText&& on_text) const;
    void encode_segment(std::string_view seg, Ctx& ctx) const;
    void pre_tokenize(std::string_view piece, size_t step, Ctx& ctx) const;
    void bpe_word(std::string_view word, Ctx& ctx) const;
    void merge_symbols(int32_t* ids, size_t m, std::vector<int32_t>& out) const;
};

// Splits `s` on the added tokens of `trie` (leftmost match, longest at that position; a match that is rejected
// (special with parse_special=false, or single_word failing) is skipped over, as Hugging Face's Aho-Corasick
// iteration does). Text between accepted tokens goes to on_text; token ids go to ctx.out.
template <class OnText>
void Tokenizer::Impl::split_added(std::string_view s, const TokenTrie& trie, Ctx& ctx, OnText&& on_text) const {
    if (trie.empty()) {
        on_text(s);
        return;
    }
    size_t start_offset = 0, i = 0, n = s.size();
    while (i < n) {
        if (!trie.may_start(static_cast<unsigned char>(s[i]))) {
            i++;
            continue;
        }
        size_t end = 0;
        int32_t idx = trie.longest_at(s, i, end);
        if (idx < 0) {
            i++;
            continue;
        }
        const AddedToken& t = added[size_t(idx)];
        size_t start = i, stop = end;
        i = end;
        if (t.special && !ctx.parse_special) continue;
        const auto* bytes = reinterpret_cast<const unsigned char*>(s.data());
        if (t.single_word) {
            bool left_ok = start == 0 || !is_word_char(last_code_point(s, start));
            bool right_ok = stop == n || !is_word_char(utf8_step(bytes + stop, n - stop).cp);
            if (!left_ok || !right_ok) continue;
        }
        if (t.lstrip) {
            size_t b = start;
            while (b > start_offset) {
                size_t p = b - 1;
                while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) p--;
                if (!is_white_space(utf8_step(bytes + p, b - p).cp)) break;
                b = p;
            }
            start = std::max(b, start_offset);
        }
        if (t.rstrip) {
            while (stop < n) {
                Utf8Step st = utf8_step(bytes + stop, n - stop);
                if (!is_white_space(st.cp)) break;
                stop += size_t(st.len);
            }
            i = stop;
        }
        if (start > start_offset) on_text(s.substr(start_offset, start - start_offset));
        ctx.out->push_back(t.id);
        start_offset = stop;
    }
    if (start_offset < n) on_text(s.substr(start_offset));
}

// One piece of text between raw-matched added tokens: normalize, match the normalized added tokens, pre-tokenize.
void Tokenizer::Impl::encode_segment(std::string_view seg, Ctx& ctx) const {
    std::string_view text = seg;
    std::string cur, next;  // used only when a normalizer changes the text
    for (NormForm f : norms) {
        if (normalize_runs(text, f, next)) {
            cur.swap(next);
            text = cur;
        }
    }
    split_added(text, norm_trie, ctx, [&](std::string_view piece) { pre_tokenize(piece, 0, ctx); });
}

void Tokenizer::Impl::pre_tokenize(std::string_view piece, size_t k, Ctx& ctx) const {
    if (piece.empty()) return;
    if (k == steps.size()) {
        bpe_word(piece, ctx);
        return;
    }
    const PreStep& st = steps[k];
    if (st.kind == PreStep::Kind::prefix_space) {
        if (piece[0] == ' ') {
            pre_tokenize(piece, k + 1, ctx);
        } else {
            std::string p;
            p.reserve(piece.size() + 1);
            p += ' ';
            p.append(piece);
            pre_tokenize(p, k + 1, ctx);
        }
        return;
    }
    // Split, behaviour Isolated: every match is a piece and so is every stretch between matches.
    size_t n = piece.size(), pos = 0, last = 0, ms = 0, me = 0;
    while (pos <= n && st.regex->find(piece.data(), n, pos, ctx.scratch, ms, me)) {
        if (me == ms) {  // empty match: contributes nothing; step over one character
            if (ms >= n) break;
            pos = ms + size_t(utf8_step(reinterpret_cast<const unsigned char*>(piece.data()) + ms, n - ms).len);
            continue;
        }
        if (ms > last) pre_tokenize(piece.substr(last, ms - last), k + 1, ctx);
        pre_tokenize(piece.substr(ms, me - ms), k + 1, ctx);
        last = pos = me;
    }
    if (last < n) pre_tokenize(piece.substr(last), k + 1, ctx);
}

// BPE of one pre-tokenized word (raw bytes; the byte-level mapping is implicit in byte_id).
void Tokenizer::Impl::bpe_word(std::string_view w, Ctx& ctx) const {
    std::vector<int32_t>& out = *ctx.out;
    if (ignore_merges) {
        int32_t id = lookup_vocab_bytes(w);
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }
    if (w.size() == 1 && byte_id[static_cast<unsigned char>(w[0])] >= 0) {
        out.push_back(byte_id[static_cast<unsigned char>(w[0])]);
        return;
    }
    bool cacheable = w.size() <= WordCache::kMaxKey;
    uint64_t h = 0;
    if (cacheable) {
        h = hash_bytes(w);
        if (cache.get(w, h, out)) return;
    }
    // initial symbols: one per byte; bytes without a token become unk (fused when fuse_unk) or are dropped
    std::vector<int32_t>& sym = ctx.tmp_ids;
    sym.clear();
    bool prev_unk = false;
    for (unsigned char b : w) {
        int32_t id = byte_id[b];
        if (id >= 0) {
            sym.push_back(id);
            prev_unk = false;
        } else if (unk_id >= 0) {
            if (!(fuse_unk && prev_unk)) sym.push_back(unk_id);
            prev_unk = true;
        }
    }
    size_t first = out.size();
    merge_symbols(sym.data(), sym.size(), out);
    if (cacheable) cache.put(w, h, out.data() + first, out.size() - first);
}

// Applies the merges to ids[0..m) (lowest rank first; leftmost first among equal ranks) and appends the result.
void Tokenizer::Impl::merge_symbols(int32_t* ids, size_t m, std::vector<int32_t>& out) const {
    constexpr size_t kSmall = 128;
    if (m <= kSmall) {
        // Compact array; rank[i]/res[i] describe the pair (ids[i], ids[i+1]). O(m) per merge, no allocation.
        int32_t rank[kSmall], res[kSmall];
        auto look = [&](size_t i) {
            const MergeTable::Entry* e = merges.find(ids[i], ids[i + 1]);
            rank[i] = e ? e->rank : INT32_MAX;
            res[i] = e ? e->id : -1;
        };
        for (size_t i = 0; i + 1 < m; i++) look(i);
        while (m > 1) {
            size_t best = SIZE_MAX;
            int32_t br = INT32_MAX;
            for (size_t i = 0; i + 1 < m; i++)
                if (rank[i] < br) {
                    br = rank[i];
                    best = i;
                }
            if (best == SIZE_MAX) break;
            ids[best] = res[best];
            std::memmove(ids + best + 1, ids + best + 2, (m - best - 2) * sizeof(int32_t));
            if (m >= best + 3) {
                std::memmove(rank + best + 1, rank + best + 2, (m - best - 3) * sizeof(int32_t));
                std::memmove(res + best + 1, res + best + 2, (m - best - 3) * sizeof(int32_t));
            }
            m--;
            if (best > 0) look(best - 1);
            if (best + 1 < m) look(best);
        }
        out.insert(out.end(), ids, ids + m);
        return;
    }
    // Long words: linked symbols and a heap of candidate pairs (rank, position), stale entries skipped.
    struct Sym {
        int32_t id, prev, next;
        bool alive;
    };
    std::vector<Sym> s(m);
    for (size_t i = 0; i < m; i++) s[i] = Sym{ids[i], int32_t(i) - 1, i + 1 < m ? int32_t(i + 1) : -1, true};
    struct Cand {
        int32_t rank, pos, id;
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int32_t pos) {
        int32_t nx = s[size_t(pos)].next;
        if (nx < 0) return;
        if (const MergeTable::Entry* e = merges.find(s[size_t(pos)].id, s[size_t(nx)].id))
            heap.push(Cand{e->rank, pos, e->id});
    };
    for (size_t i = 0; i + 1 < m; i++) push(int32_t(i));
    while (!heap.empty()) {
        Cand c = heap.top();
        heap.pop();
        Sym& a = s[size_t(c.pos)];
        if (!a.alive || a.next < 0) continue;
        Sym& b = s[size_t(a.next)];
        const MergeTable::Entry* e = merges.find(a.id, b.id);
        if (!e || e->id != c.id || e->rank != c.rank) continue;  // stale
        a.id = c.id;
        b.alive = false;
        a.next = b.next;
        if (a.next >= 0) s[size_t(a.next)].prev = c.pos;
        if (a.prev >= 0) push(a.prev);
        push(c.pos);
    }
    for (size_t i = 0; i < m; i++)
        if (s[i].alive) out.push_back(s[i].id);
}

// ---- loading ----------------------------------------------------------------------------------------------------

namespace {

constexpr int64_t kMaxTokenId = int64_t(1) << 24;  // ids must be below this (16.7M); guards huge allocations

int32_t get_id(const json& v, const std::string& where) {
    if (!v.is_number_integer()) throw Error(Status::format, where + " must be an integer token id");
    int64_t id = v.get<int64_t>();
    if (id < 0 || id >= kMaxTokenId)
        throw Error(Status::format, where + ": token id " + std::to_string(id) + " is out of range [0, 2^24)");
    return int32_t(id);
}

constexpr int kMaxNesting = 32;  // Sequence inside Sequence ...

void parse_normalizer(const json& n, const std::string& where, std::vector<NormForm>& out, int depth = 0) {
    if (n.is_null()) return;
    if (depth > kMaxNesting) throw Error(Status::format, where + ": Sequence nested too deeply");
    std::string type = type_of(n, where);
    if (type == "NFC") {
        out.push_back(NormForm::nfc);
    } else if (type == "NFD") {
        out.push_back(NormForm::nfd);
    } else if (type == "NFKC") {
        out.push_back(NormForm::nfkc);
    } else if (type == "NFKD") {
        out.push_back(NormForm::nfkd);
    } else if (type == "Sequence") {
        const json* list = field(n, "normalizers");
        if (!list || !list->is_array()) throw Error(Status::format, where + ".normalizers must be an array");
        for (size_t i = 0; i < list->size(); i++)
            parse_normalizer((*list)[i], where + ".normalizers[" + std::to_string(i) + "]", out, depth + 1);
    } else {
        throw Error(Status::unsupported, where + ": normalizer type '" + type +
                                             "' is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence)");
    }
}

void flatten_pre_tokenizer(const json& p, const std::string& where,
                           std::vector<std::pair<const json*, std::string>>& out, int depth = 0) {
    if (depth > kMaxNesting) throw Error(Status::format, where + ": Sequence nested too deeply");
    std::string type = type_of(p, where);
    if (type == "Sequence") {
        const json* list = field(p, "pretokenizers");
        if (!list || !list->is_array()) throw Error(Status::format, where + ".pretokenizers must be an array");
        for (size_t i = 0; i < list->size(); i++)
            flatten_pre_tokenizer((*list)[i], where + ".pretokenizers[" + std::to_string(i) + "]", out, depth + 1);
    } else if (type == "Split" || type == "ByteLevel") {
        out.emplace_back(&p, where);
    } else {
        throw Error(Status::unsupported, where + ": pre_tokenizer type '" + type +
                                             "' is not supported (supported: Split, ByteLevel, Sequence)");
    }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& tokenizer_json) {
    return from_json_string(read_file(tokenizer_json), tokenizer_json);
}

Tokenizer Tokenizer::from_json_string(std::string_view text, const std::string& origin) {
    TokenizerJsonReader r;
    bool ok = false;
    try {
        ok = json::sax_parse(text.begin(), text.end(), &r);
    } catch (const json::exception& e) {
        throw Error(Status::format, origin + ": malformed JSON: " + json_error_text(e.what()));
    }
    if (!ok) throw Error(Status::format, origin + ": " + (r.error.empty() ? "malformed JSON" : r.error));
    const json& root = r.root;
    if (!root.is_object()) throw Error(Status::format, origin + ": the top level must be a JSON object");

    auto impl = std::make_unique<Impl>();
    Impl& t = *impl;
    t.origin = origin;

    // -- model --
    const json* model = field(root, "model");
    if (!model || !model->is_object()) throw Error(Status::format, origin + ": missing object 'model'");
    if (const json* type = field(*model, "type")) {
        if (!type->is_string()) throw Error(Status::format, origin + ": model.type must be a string");
        if (type->get<std::string>() != "BPE")
            throw Error(Status::unsupported,
                        origin + ": model type '" + type->get<std::string>() + "' is not supported (supported: BPE)");
    }
    if (!r.have_vocab) throw Error(Status::format, origin + ": missing object model.vocab");
    if (!r.have_merges)  // (a BPE model without its merges would split every word into bytes)
        throw Error(Status::format, origin + (field(*model, "merges") ? ": model.merges must be a list of merges"
                                                                       : ": missing list model.merges"));
    if (const json* d = field(*model, "dropout")) {
        if (!d->is_number() || d->get<double>() != 0.0)
            throw Error(Status::unsupported, origin + ": model.dropout (BPE dropout) is not supported");
    }
    if (get_bool(*model, "byte_fallback", false, origin + ": model"))
        throw Error(Status::unsupported, origin + ": model.byte_fallback=true is not supported");
    for (const char* name : {"continuing_subword_prefix", "end_of_word_suffix"}) {
        if (const json* v = field(*model, name)) {
            if (!v->is_string()) throw Error(Status::format, origin + ": model." + name + " must be a string");
            if (!v->get<std::string>().empty())
                throw Error(Status::unsupported, origin + ": model." + name + " (non-empty) is not supported");
        }
    }
    t.fuse_unk = get_bool(*model, "fuse_unk", false, origin + ": model");
    t.ignore_merges = get_bool(*model, "ignore_merges", false, origin + ": model");

    // -- vocab: ids, then the table string -> id (a repeated key keeps its last id, as a JSON map read does) --
    int64_t max_id = -1;
    for (const auto& e : r.vocab) {
        if (e.id < 0 || e.id >= kMaxTokenId)
            throw Error(Status::format, origin + ": model.vocab['" +
                                            r.vocab_arena.substr(e.key.off, e.key.len) + "']: id " +
                                            std::to_string(e.id) + " is out of range [0, 2^24)");
        max_id = std::max(max_id, e.id);
    }
    size_t nv = size_t(max_id + 1);
    t.vocab_arena = std::move(r.vocab_arena);
    t.vocab_off.assign(nv, 0);
    t.vocab_len.assign(nv, Impl::kNone);
    {
        size_t cap = 16;
        while (cap < r.vocab.size() * 2) cap <<= 1;
        t.vocab_slots.assign(cap, Impl::VocabSlot{});
        t.vocab_mask = cap - 1;
    }
    constexpr size_t kAhead = 8;  // prefetch distance of the table loops below (random access in megabytes)
    size_t vocab_count = 0;       // distinct vocab strings (Hugging Face's vocab size)
    std::vector<uint64_t> vocab_hash(r.vocab.size());
    for (size_t k = 0; k < r.vocab.size(); k++)
        vocab_hash[k] = hash_bytes(std::string_view(t.vocab_arena).substr(r.vocab[k].key.off, r.vocab[k].key.len));
    for (size_t k = 0; k < r.vocab.size(); k++) {
        if (k + kAhead < r.vocab.size()) t.vocab_prefetch(vocab_hash[k + kAhead]);
        const auto& e = r.vocab[k];
        std::string_view key = std::string_view(t.vocab_arena).substr(e.key.off, e.key.len);
        int32_t id = int32_t(e.id);
        Impl::VocabSlot& slot = t.vocab_slots[t.vocab_slot(key, vocab_hash[k])];
        if (slot.id < 0) {
            vocab_count++;
            slot = Impl::VocabSlot{uint32_t(vocab_hash[k] >> 32), id, e.key.off, e.key.len};
        } else {
            slot.id = id;  // a repeated key: the last id wins
        }
        if (t.vocab_len[size_t(id)] == Impl::kNone) {  // id -> string: the first string of the id
            t.vocab_off[size_t(id)] = e.key.off;
            t.vocab_len[size_t(id)] = e.key.len;
        }
    }
    r.vocab = {};

    // -- added tokens. Ids are assigned as Hugging Face does when it loads the file: the id of the same content
    // (added or vocab token) when there is one, else the next id after the vocab / the last added token. For files
    // that Hugging Face wrote this is the "id" field. --
    if (const json* list = field(root, "added_tokens")) {
        if (!list->is_array()) throw Error(Status::format, origin + ": added_tokens must be an array");
        int64_t max_added = -1;
        for (size_t i = 0; i < list->size(); i++) {
            const json& e = (*list)[i];
            std::string where = origin + ": added_tokens[" + std::to_string(i) + "]";
            if (!e.is_object()) throw Error(Status::format, where + " must be an object");
            const json* idv = field(e, "id");
            if (!idv) throw Error(Status::format, where + ".id is missing");
            get_id(*idv, where + ".id");  // validated; the id actually used is assigned below
            AddedToken a;
            a.content = get_string(e, "content", where);
            a.special = get_bool(e, "special", false, where);
            a.normalized = get_bool(e, "normalized", !a.special, where);
            a.lstrip = get_bool(e, "lstrip", false, where);
            a.rstrip = get_bool(e, "rstrip", false, where);
            a.single_word = get_bool(e, "single_word", false, where);
            if (!utf8_is_valid(a.content)) throw Error(Status::format, where + ".content is not valid UTF-8");
            if (a.content.empty()) continue;  // ignored, as in Hugging Face
            auto seen = t.added_ids.find(a.content);
            if (seen != t.added_ids.end()) {  // same content again: new options, same id; special stays
                AddedToken& old = t.added[t.added_by_id[seen->second]];
                a.id = old.id;
                a.special = a.special || old.special;
                old = std::move(a);
                continue;
            }
            a.id = t.vocab_find(a.content);
            if (a.id < 0) {
                if (max_added < 0)
                    a.id = int32_t(vocab_count);
                else if (max_added >= int64_t(vocab_count) || vocab_count == 0)
                    a.id = int32_t(max_added + 1);
                else
                    a.id = int32_t(vocab_count);
            }
            if (a.id >= kMaxTokenId) throw Error(Status::format, where + ": too many tokens");
            max_added = std::max<int64_t>(max_added, a.id);
            max_id = std::max<int64_t>(max_id, a.id);
            t.added_ids.emplace(a.content, a.id);
            t.added_by_id[a.id] = t.added.size();
            t.added.push_back(std::move(a));
        }
    }
    if (max_id < 0) throw Error(Status::format, origin + ": the vocabulary is empty");
    t.n_vocab = int32_t(max_id + 1);
    nv = size_t(t.n_vocab);
    t.vocab_off.resize(nv, 0);
    t.vocab_len.resize(nv, Impl::kNone);
    t.id_flags.assign(nv, 0);
    for (size_t id = 0; id < nv; id++) t.id_flags[id] = t.vocab_len[id] != Impl::kNone;
    if (const json* unk = field(*model, "unk_token")) {
        if (!unk->is_string()) throw Error(Status::format, origin + ": model.unk_token must be a string");
        t.unk_id = t.vocab_find(unk->get<std::string>());
        if (t.unk_id < 0)
            throw Error(Status::format, origin + ": model.unk_token '" + unk->get<std::string>() +
                                            "' is not in model.vocab");
    }

    // -- merges --
    // Three vocab lookups per merge, random in a table of megabytes: the hashes are computed first so that the
    // slots can be prefetched a few merges ahead (this loop dominates the load time otherwise).
    t.merges.reserve(r.merges.size());
    {
        std::string_view arena = r.merge_arena;
        const size_t nm = r.merges.size();
        std::string joined;
        std::vector<uint64_t> hashes(nm * 3);
        for (size_t k = 0; k < nm; k++) {
            std::string_view a = arena.substr(r.merges[k].a.off, r.merges[k].a.len);
            std::string_view b = arena.substr(r.merges[k].b.off, r.merges[k].b.len);
            joined.assign(a).append(b);
            hashes[3 * k] = hash_bytes(a);
            hashes[3 * k + 1] = hash_bytes(b);
            hashes[3 * k + 2] = hash_bytes(joined);
        }
        std::vector<std::array<int32_t, 3>> resolved(nm);  // (left id, right id, merged id) by rank
        for (size_t k = 0; k < std::min(kAhead, nm) * 3; k++) t.vocab_prefetch(hashes[k]);
        for (size_t rank = 0; rank < nm; rank++) {
            if (rank + kAhead < nm)
                for (size_t j = 0; j < 3; j++) t.vocab_prefetch(hashes[3 * (rank + kAhead) + j]);
            std::string_view a = arena.substr(r.merges[rank].a.off, r.merges[rank].a.len);
            std::string_view b = arena.substr(r.merges[rank].b.off, r.merges[rank].b.len);
            joined.assign(a).append(b);
            int32_t ia = t.vocab_find(a, hashes[3 * rank]), ib = t.vocab_find(b, hashes[3 * rank + 1]);
            int32_t im = t.vocab_find(joined, hashes[3 * rank + 2]);
            if (ia < 0 || ib < 0 || im < 0)
                throw Error(Status::format, origin + ": model.merges[" + std::to_string(rank) + "] ('" +
                                                std::string(a) + "', '" + std::string(b) + "'): token '" +
                                                std::string(ia < 0 ? a : ib < 0 ? b : std::string_view(joined)) +
                                                "' is not in model.vocab");
            resolved[rank] = {ia, ib, im};
        }
        for (size_t rank = 0; rank < nm; rank++) {
            if (rank + kAhead < nm) t.merges.prefetch(resolved[rank + kAhead][0], resolved[rank + kAhead][1]);
            t.merges.put(resolved[rank][0], resolved[rank][1], int32_t(rank), resolved[rank][2]);
        }
        r.merges = {};
        r.merge_arena = {};
    }
    const ByteAlphabet& alpha = byte_alphabet();
    for (size_t b = 0; b < 256; b++) t.byte_id[b] = t.vocab_find(alpha.utf8[b]);

    // -- decoded bytes of every token --
    for (const AddedToken& a : t.added) t.id_flags[size_t(a.id)] = uint8_t(1 | 4 | (a.special ? 2 : 0));
    t.bytes_off.assign(nv + 1, 0);
    t.bytes_arena.reserve(t.vocab_arena.size());
    for (size_t id = 0; id < nv; id++) {
        t.bytes_off[id] = uint32_t(t.bytes_arena.size());
        if (t.id_flags[id] & 4)
            byte_level_decode_into(t.added[t.added_by_id[int32_t(id)]].content, t.bytes_arena);
        else if (t.vocab_len[id] != Impl::kNone)
            byte_level_decode_into(t.vocab_string(int32_t(id)), t.bytes_arena);
        if (t.bytes_arena.size() > UINT32_MAX) throw Error(Status::format, origin + ": the vocabulary is too large");
    }
    t.bytes_off[nv] = uint32_t(t.bytes_arena.size());

    // -- normalizer (needed to build the normalized added-token trie) --
    if (const json* n = field(root, "normalizer")) parse_normalizer(*n, origin + ": normalizer", t.norms);
    for (size_t i = 0; i < t.added.size(); i++) {
        const AddedToken& a = t.added[i];
        if (!a.normalized) {
            t.raw_trie.insert(a.content, int32_t(i));
            continue;
        }
        std::string cur = a.content, next;
        for (NormForm f : t.norms) {
            next.clear();
            utf8proc_normalize(cur, f, next);
            cur.swap(next);
        }
        t.norm_trie.insert(cur, int32_t(i));
    }

    // -- pre-tokenizer: Split* then ByteLevel --
    const json* pre = field(root, "pre_tokenizer");
    if (!pre)
        throw Error(Status::unsupported,
                    origin + ": pre_tokenizer null is not supported (byte-level BPE needs a ByteLevel pre_tokenizer)");
    std::vector<std::pair<const json*, std::string>> parts;
    flatten_pre_tokenizer(*pre, origin + ": pre_tokenizer", parts);
    for (size_t i = 0; i < parts.size(); i++) {
        const json& p = *parts[i].first;
        const std::string& where = parts[i].second;
        std::string type = type_of(p, where);
        bool last = i + 1 == parts.size();
        if (type == "ByteLevel") {
            if (!last)
                throw Error(Status::unsupported,
                            where + ": ByteLevel must be the last pre_tokenizer (a Split after it is not supported)");
            if (get_bool(p, "add_prefix_space", true, where))
                t.steps.push_back(PreStep{PreStep::Kind::prefix_space, nullptr});
            if (get_bool(p, "use_regex", true, where))
                t.steps.push_back(PreStep{PreStep::Kind::split,
                                          std::make_unique<Regex>(kGpt2Pattern, false, where + " (GPT-2 regex)")});
            continue;
        }
        // Split
        if (last)
            throw Error(Status::unsupported, where + ": the pre_tokenizer must end with ByteLevel (byte-level BPE)");
        std::string behavior = get_string(p, "behavior", where);
        if (behavior != "Isolated")
            throw Error(Status::unsupported,
                        where + ": Split behavior '" + behavior + "' is not supported (supported: Isolated)");
        if (get_bool(p, "invert", false, where))
            throw Error(Status::unsupported, where + ": Split invert=true is not supported");
        const json* pat = field(p, "pattern");
        if (!pat || !pat->is_object()) throw Error(Status::format, where + ".pattern must be an object");
        if (const json* re = field(*pat, "Regex")) {
            if (!re->is_string()) throw Error(Status::format, where + ".pattern.Regex must be a string");
            t.steps.push_back(
                PreStep{PreStep::Kind::split, std::make_unique<Regex>(re->get<std::string>(), false, where)});
        } else if (const json* lit = field(*pat, "String")) {
            if (!lit->is_string()) throw Error(Status::format, where + ".pattern.String must be a string");
            t.steps.push_back(
                PreStep{PreStep::Kind::split, std::make_unique<Regex>(lit->get<std::string>(), true, where)});
        } else {
            throw Error(Status::format, where + ".pattern must have a 'Regex' or 'String' field");
        }
    }

    // -- decoder --
    const json* dec = field(root, "decoder");
    if (!dec) throw Error(Status::unsupported, origin + ": decoder null is not supported (supported: ByteLevel)");
    std::string dec_type = type_of(*dec, origin + ": decoder");
    if (dec_type != "ByteLevel")
        throw Error(Status::unsupported,
                    origin + ": decoder type '" + dec_type + "' is not supported (supported: ByteLevel)");

    return Tokenizer(std::move(impl));
}

namespace {

// A special token in tokenizer_config.json: a string, an object with "content", or null.
std::string config_token(const json& cfg, const char* name, const std::string& where) {
    const json* v = field(cfg, name);
    if (!v) return {};
    if (v->is_string()) return v->get<std::string>();
    if (v->is_object()) {
        const json* c = field(*v, "content");
        if (c && c->is_string()) return c->get<std::string>();
    }
    throw Error(Status::format, where + ": " + name + " must be a string or an object with a string 'content'");
}

json read_json_file(const std::string& path) {
    std::string text = read_file(path);
    json j = parse_json(text, path);
    if (!j.is_object()) throw Error(Status::format, path + ": the top level must be a JSON object");
    return j;
}

}  // namespace

Tokenizer Tokenizer::from_folder(const std::string& dir) {
    std::string base = dir.empty() ? std::string(".") : dir;
    if (base.back() != '/') base += '/';
    Tokenizer tok = from_file(base + "tokenizer.json");
    Impl& t = *tok.impl_;

    std::string cfg_path = base + "tokenizer_config.json";
    if (path_present(cfg_path)) {
        json cfg = read_json_file(cfg_path);
        auto resolve = [&](const char* name) -> int32_t {
            std::string s = config_token(cfg, name, cfg_path);
            if (s.empty()) return -1;
            int32_t id = t.lookup(s);
            if (id < 0)
                throw Error(Status::format, cfg_path + ": " + name + " '" + s + "' is not a token of tokenizer.json");
            return id;
        };
        int32_t eos = resolve("eos_token");
        if (eos >= 0) t.eos.push_back(eos);
        t.bos = resolve("bos_token");
        t.pad = resolve("pad_token");
        t.add_bos = get_bool(cfg, "add_bos_token", false, cfg_path);
    }

    std::string gen_path = base + "generation_config.json";
    if (path_present(gen_path)) {
        json gen = read_json_file(gen_path);
        if (const json* e = field(gen, "eos_token_id")) {
            std::vector<int32_t> ids;
            if (e->is_array()) {
                for (size_t i = 0; i < e->size(); i++)
                    ids.push_back(get_id((*e)[i], gen_path + ": eos_token_id[" + std::to_string(i) + "]"));
            } else {
                ids.push_back(get_id(*e, gen_path + ": eos_token_id"));
            }
            for (int32_t id : ids)
                if (std::find(t.eos.begin(), t.eos.end(), id) == t.eos.end()) t.eos.push_back(id);
        }
        if (const json* b = field(gen, "bos_token_id"); b && t.bos < 0) t.bos = get_id(*b, gen_path + ": bos_token_id");
        if (const json* p = field(gen, "pad_token_id"); p && t.pad < 0) t.pad = get_id(*p, gen_path + ": pad_token_id");
    }
    return tok;
}

// ---- queries ----------------------------------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
    std::string clean;
    std::string_view s = text;
    if (!all_ascii(text.data(), text.size()) && !utf8_is_valid(text)) {
        clean = utf8_sanitize(text);
        s = clean;
    }
    std::vector<int32_t> out;
    out.reserve(s.size() / 3 + 4);
    Impl::Ctx ctx;
    ctx.out = &out;
    ctx.parse_special = parse_special;
    const Impl& t = *impl_;
    t.split_added(s, t.raw_trie, ctx, [&](std::string_view seg) { t.encode_segment(seg, ctx); });
    return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
    const Impl& t = *impl_;
    std::string out;
    for (int32_t id : ids) {
        t.check_id(id);
        if (skip_special && (t.id_flags[size_t(id)] & 2)) continue;
        out += t.token_bytes(id);
    }
    if (all_ascii(out.data(), out.size()) || utf8_is_valid(out)) return out;
    return utf8_sanitize(out);
}

std::string Tokenizer::token_piece(int32_t id) const {
    impl_->check_id(id);
    return std::string(impl_->token_bytes(id));
}

std::string_view Tokenizer::token_string(int32_t id) const {
    impl_->check_id(id);
    const Impl& t = *impl_;
    if (t.id_flags[size_t(id)] & 4) return t.added[t.added_by_id.at(id)].content;
    return t.vocab_string(id);
}

int32_t Tokenizer::n_vocab() const { return impl_->n_vocab; }

bool Tokenizer::is_valid(int32_t id) const {
    return id >= 0 && id < impl_->n_vocab && (impl_->id_flags[size_t(id)] & 1);
}

int32_t Tokenizer::token_id(std::string_view token) const { return impl_->lookup(token); }

bool Tokenizer::is_special(int32_t id) const { return is_valid(id) && (impl_->id_flags[size_t(id)] & 2); }

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

std::vector<int32_t> Tokenizer::eos_ids() const { return impl_->eos; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }

// ---- streaming ----------------------------------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tok_(&tokenizer), skip_special_(skip_special) {}

namespace {

// Moves the complete part of `pending` to the result: valid sequences as they are, invalid ones as U+FFFD; a
// trailing well-formed but incomplete sequence stays in `pending` unless `final`.
std::string drain_utf8(std::string& pending, bool final) {
    std::string out;
    const auto* p = reinterpret_cast<const unsigned char*>(pending.data());
    size_t n = pending.size(), i = 0;
    while (i < n) {
        Utf8Step st = utf8_step(p + i, n - i);
        if (st.valid) {
            out.append(pending, i, size_t(st.len));
        } else if (st.truncated && !final) {
            break;
        } else {
            out += kReplacement;
        }
        i += size_t(st.len);
    }
    pending.erase(0, i);
    return out;
}

}  // namespace

std::string StreamDecoder::push(int32_t id) {
    std::string piece = tok_->token_piece(id);  // validates id
    if (skip_special_ && tok_->is_special(id)) return {};
    if (pending_.empty() && all_ascii(piece.data(), piece.size())) return piece;
    pending_ += piece;
    return drain_utf8(pending_, false);
}

std::string StreamDecoder::flush() { return drain_utf8(pending_, true); }

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
