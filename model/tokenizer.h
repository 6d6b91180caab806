// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (Qwen2/Qwen3/Qwen3.5 family), plus the
// special-token settings of `tokenizer_config.json` and `generation_config.json`.
//
// The pipeline follows Hugging Face `tokenizers` (the reference for parity is `Tokenizer.encode(text,
// add_special_tokens=False)` and `Tokenizer.decode(ids, skip_special_tokens=...)`):
//   1. invalid UTF-8 in the input is replaced by U+FFFD (see utf8_sanitize);
//   2. `added_tokens` with normalized=false are matched in the raw text (leftmost, then longest match; options
//      lstrip, rstrip, single_word honoured); the pieces between them go on;
//   3. `normalizer` (NFC, NFD, NFKC, NFKD or a Sequence of them) is applied to each piece, then the
//      `added_tokens` with normalized=true are matched in the normalized piece;
//   4. `pre_tokenizer`: each Split (regex from the file, behaviour Isolated; or a literal String pattern) cuts the
//      pieces further, then ByteLevel (optional prefix space on every piece, optional GPT-2 regex) maps every
//      byte to the GPT-2 printable alphabet;
//   5. `model` BPE merges each word by merge rank (lowest rank first, leftmost first among equals; a word that is
//      a vocab token is taken whole when `ignore_merges` is set).
// Decoding maps each token back to bytes (ByteLevel decoder; a token with a character outside the byte alphabet
// stands for its own UTF-8) and replaces invalid UTF-8 in the result by U+FFFD, as Hugging Face does.
// Supported components: model BPE (no dropout, no byte_fallback, unk_token/fuse_unk honoured); normalizers
// NFC/NFD/NFKC/NFKD/Sequence/null; pre_tokenizers Split/ByteLevel/Sequence ending with ByteLevel; decoder
// ByteLevel. `post_processor`, `truncation` and `padding` are ignored (encode never adds special tokens).
// Ids of `added_tokens` are assigned as Hugging Face assigns them when it loads the file (the vocab id when the
// content is a vocab token, else the next id); for files that Hugging Face wrote they equal the "id" fields.
//
// Thread safety: a Tokenizer is immutable after loading except for an internal, mutex-protected cache of encoded
// words (at most 4 MiB); every const method may be called from several threads at once.
//
// Known differences from Hugging Face (none of them affects the golden cases in tests/data/tokenizers):
//   - Unicode tables: regex classes (\p{L}, \p{N}, \p{M}) come from the system PCRE2 (10.42: Unicode 14) while
//     Hugging Face uses Oniguruma (newer Unicode): characters assigned after Unicode 14 are classified as
//     unassigned here. \s is rewritten to the Unicode White_Space list as Oniguruma has it (PCRE2 alone also
//     matches U+180E); a sweep of every code point in six contexts found no other difference in the splits.
//   - NFC comes from utf8proc (Unicode 15); Hugging Face's tables predate some combining marks added in Unicode
//     13-14 (54 code points, e.g. U+1AC1..U+1ACE), which utf8proc reorders by combining class and HF does not.
//   - single_word added tokens use an approximation of Rust's Unicode \w (letters, marks, Nd, Nl, Pc, ZWJ/ZWNJ).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hy {

// One entry of tokenizer.json's `added_tokens`.
struct AddedToken {
    int32_t id = -1;
    int32_t file_id = -1;      // the "id" the file gives it (id differs where Hugging Face's assignment moves it)
    std::string content;       // exact text matched in the input
    bool special = false;      // skipped by decode(skip_special=true); not matched by encode(parse_special=false)
    bool normalized = false;   // matched after normalization (true) or in the raw text (false)
    bool lstrip = false;       // the match swallows the white space on its left
    bool rstrip = false;       // the match swallows the white space on its right
    bool single_word = false;  // matched only when not touching a word character on either side
};

class Tokenizer {
public:
    // Loads a tokenizer.json file. Throws hy::Error: Status::io (cannot read), Status::format (malformed JSON,
    // missing or ill-typed field, merge naming an unknown token, regex that does not compile), Status::unsupported
    // (a model/normalizer/pre_tokenizer/decoder type or option this implementation does not have; the message
    // names the component and the type).
    static Tokenizer from_file(const std::string& tokenizer_json);

    // Loads dir/tokenizer.json, then dir/tokenizer_config.json (eos_token, bos_token, pad_token, add_bos_token;
    // a token is a string or an object with "content") and dir/generation_config.json (eos_token_id: int or list)
    // when they exist. Same errors as from_file; a config naming a token that the tokenizer lacks is
    // Status::format.
    static Tokenizer from_folder(const std::string& dir);

    // Builds a tokenizer from the text of a tokenizer.json; `origin` names it in error messages.
    static Tokenizer from_json_string(std::string_view json_text, const std::string& origin = "tokenizer.json");

    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    ~Tokenizer();

    // Text (UTF-8, any bytes) -> token ids in [0, n_vocab()). Never adds BOS/EOS (see add_bos()).
    // parse_special=false: special added tokens in the text are encoded as plain text (HF's
    // encode_special_tokens=True); non-special added tokens are still matched.
    // Invalid UTF-8 is not an error: each maximal invalid subsequence is replaced by U+FFFD first (what Python's
    // bytes.decode("utf-8", "replace") gives), so the result equals HF's encoding of that replaced string.
    // decode(encode(t)) is the normalized text (NFC for Qwen): each stretch between added tokens is normalized on
    // its own. Cost: linear in the text for the regex; BPE is O(w^2) for a word of w <= 128 bytes and
    // O(w log w) above (a 2 MB word of one repeated letter takes 1-2 s); words up to 22 bytes are cached.
    // Throws hy::Error(Status::internal) only if the regex engine fails (resource limits), which the fuzzer has
    // not found for the shipped patterns.
    std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

    // Token ids -> text. The bytes of the tokens are joined and invalid UTF-8 in the result (e.g. a multi-byte
    // character cut by the end of `ids`) is replaced by U+FFFD, as HF does. skip_special drops special added
    // tokens. Throws hy::Error(Status::invalid_argument) naming the id when an id is negative, >= n_vocab() or
    // not assigned to any token.
    std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

    // The raw bytes of one token after the ByteLevel decoder; may be an incomplete UTF-8 sequence.
    // Throws like decode for a bad id.
    std::string token_piece(int32_t id) const;

    // The token string as written in tokenizer.json (byte-level alphabet for vocab tokens, e.g. "Ġhello").
    // Throws like decode for a bad id.
    std::string_view token_string(int32_t id) const;

    // max id + 1 over the vocab and the added tokens (ids below it may be unassigned; see is_valid).
    int32_t n_vocab() const;

    // True when id names a token (vocab or added).
    bool is_valid(int32_t id) const;

    // Exact token string (added token content, else the vocab entry in the byte-level alphabet) -> id, or -1.
    int32_t token_id(std::string_view token) const;

    // True for added tokens marked special; false for other ids (including invalid ones).
    bool is_special(int32_t id) const;

    // The added tokens, in file order (a repeated content keeps its first place and its last options).
    const std::vector<AddedToken>& added_tokens() const;

    // Throws Status::format naming the first token (its id, and the file's id where Hugging Face's assignment moved
    // an added token) or end-of-sequence id that a model of n_logits rows (config.json vocab_size) cannot embed; dir:
    // the model folder, for the message. Every program that pairs a tokenizer with a model calls it at load, so such
    // a token fails there and not at the first prompt or answer that uses it.
    void require_fits(int32_t n_logits, const std::string& dir) const;

    // End-of-sequence ids: tokenizer_config's eos_token first, then generation_config's eos_token_id entries, no
    // duplicates. config.json's eos_token_id is merged by the model loader. Empty when none is known.
    std::vector<int32_t> eos_ids() const;
    int32_t bos_id() const;  // tokenizer_config bos_token (or generation_config bos_token_id), -1 when none
    int32_t pad_id() const;  // tokenizer_config pad_token (or generation_config pad_token_id), -1 when none
    bool add_bos() const;    // tokenizer_config add_bos_token (false when absent): callers prepend bos_id()

private:
    struct Impl;
    explicit Tokenizer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming generated tokens: push() returns only complete UTF-8 and holds back a
// trailing incomplete sequence until a later token completes it. Bytes that can never become valid UTF-8 are
// emitted as U+FFFD, so the concatenation of every push() plus flush() equals
// tokenizer.decode(all ids, skip_special) (with the `keep` ids left in). The tokenizer must outlive the decoder.
class StreamDecoder {
public:
    // keep: special ids decoded even with skip_special (e.g. the <think> and <tool_call> markers that the chat
    // output parser needs when a tokenizer marks them special).
    explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false, std::vector<int32_t> keep = {});

    // Adds one token; returns the text that became complete (possibly empty). Throws like Tokenizer::decode for a
    // bad id (the state is left unchanged).
    std::string push(int32_t id);

    // Returns the held-back bytes (an incomplete sequence becomes U+FFFD) and resets the state.
    std::string flush();

    // Drops the held-back bytes.
    void reset() { pending_.clear(); }

    // Number of bytes held back (0..3).
    size_t pending_bytes() const { return pending_.size(); }

private:
    const Tokenizer* tok_;
    bool skip_special_;
    std::vector<int32_t> keep_;
    std::string pending_;
};

// Replaces each maximal invalid subsequence of `s` by U+FFFD (Unicode's "maximal subpart" practice, as Python's
// decode(errors="replace") and Rust's String::from_utf8_lossy). Valid input is returned unchanged.
std::string utf8_sanitize(std::string_view s);

// True when `s` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool utf8_is_valid(std::string_view s);

// The number of code points of well-formed UTF-8 `s` (the bytes that do not continue a sequence): what Python's
// len() gives for the decoded text, so the unit of OpenAI's text offsets. Sanitize other text first.
size_t utf8_length(std::string_view s);

// Unicode NFC of a valid UTF-8 string (utf8proc). Invalid input is sanitized first.
std::string utf8_nfc(std::string_view s);

}  // namespace hy
