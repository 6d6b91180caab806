// Internal declarations shared by the tokenizer's source files (tokenizer.cpp, tokenizer_load.cpp, bpe.cpp): the
// GPT-2 byte-level alphabet, the hash tables, the regex, the added-token trie, the word cache and Tokenizer::Impl.
#pragma once

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/common.h"
#include "model/tokenizer.h"
#include "model/utf8.h"

namespace hy {

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

const ByteAlphabet& byte_alphabet();

// The bytes a token string stands for under the ByteLevel decoder: every character mapped back to its byte; a
// string with a character outside the alphabet (e.g. an added token with a space) stands for its own UTF-8 bytes.
// Appends the result to `out`.
void byte_level_decode_into(std::string_view tok, std::string& out);

std::string byte_level_encode(std::string_view bytes);

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
    Regex(const std::string& pattern, bool literal, const std::string& where);
    ~Regex() { pcre2_code_free(code_); }
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Finds the first match in s[0..n) starting at or after `start`; false when there is none. s is valid UTF-8.
    // Backtracking is bounded by a number of steps that grows with the piece (a long piece of a linear pattern takes
    // a few steps a byte; nested quantifiers such as "(a+)+b" take exponentially many on a short one): past it,
    // Error(format) names the regex instead of running for hours.
    bool find(const char* s, size_t n, size_t start, MatchScratch& m, size_t& ms, size_t& me) const;

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

// One step of the pre-tokenizer: a regex split (Isolated) or ByteLevel's prefix space.
struct PreStep {
    enum class Kind { split, prefix_space } kind;
    std::unique_ptr<Regex> regex;  // split only
};

// ---- the tokenizer ----------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
    std::string origin;  // file name for messages

    // model
    std::string vocab_arena;          // vocab strings back to back (byte-level alphabet, as in the file)
    std::vector<uint32_t> vocab_off;  // [n_vocab] offset of the vocab string of each id
    std::vector<uint32_t> vocab_len;  // [n_vocab] its length; kNone when the id has no vocab string
    struct VocabSlot {
        uint32_t tag = 0;           // high 32 bits of the key's hash
        int32_t id = -1;            // -1: empty
        uint32_t off = 0, len = 0;  // the key in vocab_arena
    };
    std::vector<VocabSlot> vocab_slots;  // open-addressing table vocab string -> id
    size_t vocab_mask = 0;
    MergeTable merges;                   // (left id, right id) -> (rank, merged id)
    std::array<int32_t, 256> byte_id{};  // byte -> id of its one-character token, -1 when absent
    int32_t unk_id = -1;
    bool fuse_unk = false;
    bool ignore_merges = false;

    // ids -> tokens
    static constexpr uint32_t kNone = UINT32_MAX;
    int32_t n_vocab = 0;
    std::string bytes_arena;          // token bytes after the ByteLevel decoder, back to back
    std::vector<uint32_t> bytes_off;  // [n_vocab + 1] token id's bytes are [bytes_off[id], bytes_off[id+1])
    std::vector<uint8_t> id_flags;    // [n_vocab] bit 0: assigned, bit 1: special, bit 2: added token
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
            throw Error(Status::invalid_argument, "token id " + std::to_string(id) +
                                                      " is not in the vocabulary (n_vocab " + std::to_string(n_vocab) +
                                                      ")");
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

}  // namespace hy
