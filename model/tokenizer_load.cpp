// Loading: tokenizer.json (vocab, merges, added tokens, normalizer, pre-tokenizer and decoder settings) and the
// special-token settings of tokenizer_config.json and generation_config.json.
#include <algorithm>
#include <array>
#include <climits>
#include <nlohmann/json.hpp>

#include "model/tokenizer_impl.h"

namespace hy {

// ---- loading ----------------------------------------------------------------------------------------------------

namespace {

using json = nlohmann::json;

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
        if (error.empty())
            error = "malformed JSON near byte " + std::to_string(pos) + ": " + json_error_text(ex.what());
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
        return stack_.size() == 2 && stack_[0].key == "model" && stack_[1].value.is_object() && stack_[1].key == name;
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
    if (!model || !model->is_object())
        throw Error(Status::format, origin + ": missing object 'model' (is it a Hugging Face tokenizer.json?)");
    if (const json* type = field(*model, "type")) {
        if (!type->is_string()) throw Error(Status::format, origin + ": model.type must be a string");
        if (type->get<std::string>() != "BPE")
            throw Error(Status::unsupported,
                        origin + ": model type '" + type->get<std::string>() + "' is not supported (supported: BPE)");
    }
    if (!r.have_vocab) throw Error(Status::format, origin + ": missing object model.vocab");
    if (r.vocab.empty())  // (it loaded, and then every prompt was "empty": no text has a token)
        throw Error(Status::format, origin + ": model.vocab is empty (no token to encode text with)");
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
            throw Error(Status::format, origin + ": model.vocab['" + r.vocab_arena.substr(e.key.off, e.key.len) +
                                            "']: id " + std::to_string(e.id) + " is out of range [0, 2^24)");
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
            if (!idv)  // (field() treats null as absent)
                throw Error(Status::format, where + (e.contains("id") ? ".id must be an integer token id, found null"
                                                                      : ".id is missing"));
            const int32_t file_id = get_id(*idv, where + ".id");  // the id actually used is assigned below
            AddedToken a;
            a.file_id = file_id;
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
            throw Error(Status::format,
                        origin + ": model.unk_token '" + unk->get<std::string>() + "' is not in model.vocab");
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
                                                std::string(ia < 0   ? a
                                                            : ib < 0 ? b
                                                                     : std::string_view(joined)) +
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
    std::string base = dir.empty() ? std::string(".") : folder_path(dir);
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

}  // namespace hy
