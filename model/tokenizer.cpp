// Byte-level BPE tokenizer (see tokenizer.h for the pipeline and the documented differences from Hugging Face).
// This file: the Tokenizer class's queries, decoding and StreamDecoder. Loading is in tokenizer_load.cpp, encoding
// (pre-tokenizer and BPE merges) in bpe.cpp, the UTF-8 helpers in utf8.cpp; tokenizer_impl.h holds what they share.
#include "model/tokenizer.h"

#include <algorithm>

#include "model/tokenizer_impl.h"

namespace hy {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

// ---- queries ----------------------------------------------------------------------------------------------------

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

void Tokenizer::require_fits(int32_t n_logits, const std::string& dir_in) const {
    const std::string dir = folder_path(dir_in);
    const std::string vocab_range =
        "outside the model's vocabulary [0, " + std::to_string(n_logits) + ") (config.json vocab_size)";
    for (int32_t id = n_logits; id < n_vocab(); id++) {
        if (!is_valid(id)) continue;
        // (an added token's id is assigned as Hugging Face does, in order after the vocabulary: say so where the
        // file gives another)
        std::string moved;
        for (const AddedToken& a : added_tokens())
            if (a.id == id && a.file_id != id)
                moved = " (the file gives it id " + std::to_string(a.file_id) +
                        "; added tokens take the next free id, as in Hugging Face)";
        throw Error(Status::format, dir + "/tokenizer.json: token '" + std::string(token_string(id)) + "' has id " +
                                        std::to_string(id) + moved + ", " + vocab_range);
    }
    for (int32_t id : eos_ids())
        if (id >= n_logits)
            throw Error(Status::format, dir + ": end-of-sequence id " + std::to_string(id) +
                                            " (tokenizer_config.json / generation_config.json) is " + vocab_range);
}

std::vector<int32_t> Tokenizer::eos_ids() const { return impl_->eos; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }

// ---- streaming ----------------------------------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special, std::vector<int32_t> keep)
    : tok_(&tokenizer), skip_special_(skip_special), keep_(std::move(keep)) {}

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
    if (skip_special_ && tok_->is_special(id) && std::find(keep_.begin(), keep_.end(), id) == keep_.end()) return {};
    if (pending_.empty() && all_ascii(piece.data(), piece.size())) return piece;
    pending_ += piece;
    return drain_utf8(pending_, false);
}

std::string StreamDecoder::flush() { return drain_utf8(pending_, true); }

}  // namespace hy
