// Encoding: the pre-tokenizer (added tokens, normalizer, regex splits) and the byte-level BPE merges of each word
// (see tokenizer.h for the pipeline).
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <queue>

#include "model/tokenizer_impl.h"

namespace hy {

// ---- GPT-2 byte-level alphabet ----------------------------------------------------------------------------------

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

// ---- regex (PCRE2) ----------------------------------------------------------------------------------------------

namespace {

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

}  // namespace

Regex::Regex(const std::string& pattern, bool literal, const std::string& where) : where_(where) {
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

bool Regex::find(const char* s, size_t n, size_t start, MatchScratch& m, size_t& ms, size_t& me) const {
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

// ---- encode -----------------------------------------------------------------------------------------------------

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

}  // namespace hy
