// Tokenizer and chat-format tests: exact parity with Hugging Face `tokenizers` on golden encodings (Qwen3, the
// tiny model's tokenizer, the Qwen3.5 regex, variants of components/options), round trips on a random Unicode
// corpus, streaming decode, error cases, ChatML rendering.
#include <catch2/catch.hpp>

#include <chrono>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "model/chat.h"
#include "model/common.h"
#include "model/tokenizer.h"

namespace {

using json = nlohmann::json;
using hy::Status;
using hy::Tokenizer;

const std::string kRoot = HY_SOURCE_DIR;
const std::string kData = kRoot + "/tests/data/tokenizers";
const std::string kTinyDir = kRoot + "/models/tiny";

std::string read_text(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE(f.good());
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

json read_json(const std::string& path) { return json::parse(read_text(path)); }

// The tokenizers are loaded once and shared by the test cases (loading Qwen3's takes ~0.1-0.2 s).
const Tokenizer& qwen3() {
    static const Tokenizer t = Tokenizer::from_folder(kData + "/qwen3");
    return t;
}
const Tokenizer& tiny() {
    static const Tokenizer t = Tokenizer::from_folder(kTinyDir);
    return t;
}
const json& tiny_json() {
    static const json j = read_json(kTinyDir + "/tokenizer.json");
    return j;
}

Tokenizer from_json(const json& j) { return Tokenizer::from_json_string(j.dump(), "test tokenizer.json"); }

// Status of the hy::Error thrown by f (Status::ok when nothing is thrown); the message goes to `msg`.
template <class F>
Status error_of(F&& f, std::string* msg = nullptr) {
    try {
        f();
    } catch (const hy::Error& e) {
        if (msg) *msg = e.what();
        return e.status();
    }
    return Status::ok;
}

std::string ids_str(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) {
        if (!s.empty()) s += ',';
        s.append(std::to_string(id));
    }
    return s;
}

// Checks every case of a golden file: ids and decoded text.
void check_golden(const Tokenizer& tok, const json& golden, const std::string& name, bool parse_special = true) {
    const json& cases = golden.at("cases");
    REQUIRE(cases.size() > 0);
    size_t ok = 0;
    for (const json& c : cases) {
        std::string text = c.at("text").get<std::string>();
        std::vector<int32_t> want = c.at("ids").get<std::vector<int32_t>>();
        std::vector<int32_t> got = tok.encode(text, parse_special);
        std::string decoded = tok.decode(want);
        INFO(name << " text " << json(text).dump() << "\n want " << ids_str(want) << "\n got  " << ids_str(got));
        CHECK(got == want);
        CHECK(decoded == c.at("decoded").get<std::string>());
        if (c.contains("decoded_skip_special"))
            CHECK(tok.decode(want, true) == c.at("decoded_skip_special").get<std::string>());
        ok += got == want && decoded == c.at("decoded").get<std::string>();
    }
    CHECK(ok == cases.size());
}

// tokenizer.json of the Qwen3 vocabulary with the Qwen3.5 pre-tokenizer regex (tests/data/tokenizers/qwen35-regex).
const Tokenizer& qwen35_regex() {
    static const Tokenizer t = [] {
        json j = read_json(kData + "/qwen3/tokenizer.json");
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
            "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
        return from_json(j);
    }();
    return t;
}

// Applies a variant patch of tests/data/tokenizers/variants.json to the tiny tokenizer.json.
json apply_patch(json base, const json& patch) {
    if (patch.is_string()) {
        REQUIRE(patch.get<std::string>() == "merges_as_strings");
        json merges = json::array();
        for (const json& m : base["model"]["merges"])
            merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
        base["model"]["merges"] = merges;
        return base;
    }
    for (const json& op : patch) {
        std::string path = op.at("path").get<std::string>();
        if (path.size() >= 2 && path.substr(path.size() - 2) == "/-")
            base[json::json_pointer(path.substr(0, path.size() - 2))].push_back(op.at("value"));
        else
            base[json::json_pointer(path)] = op.at("value");
    }
    return base;
}

// Random text mixing ASCII, Latin with combining marks, CJK, emoji (with ZWJ/modifiers), Arabic, Hangul
// syllables and jamo, whitespace runs, newlines, digits, punctuation and some rare code points. Fixed seed.
std::string random_text(std::mt19937& rng, size_t n_chars) {
    auto pick = [&](uint32_t lo, uint32_t hi) { return lo + uint32_t(rng() % (hi - lo + 1)); };
    std::string s;
    auto put = [&](uint32_t cp) {
        if (cp < 0x80) {
            s += char(cp);
        } else if (cp < 0x800) {
            s += char(0xC0 | (cp >> 6));
            s += char(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            s += char(0xE0 | (cp >> 12));
            s += char(0x80 | ((cp >> 6) & 0x3F));
            s += char(0x80 | (cp & 0x3F));
        } else {
            s += char(0xF0 | (cp >> 18));
            s += char(0x80 | ((cp >> 12) & 0x3F));
            s += char(0x80 | ((cp >> 6) & 0x3F));
            s += char(0x80 | (cp & 0x3F));
        }
    };
    static const char* words[] = {"the", "Hello", "don't", "I'll", "return", "def", "naïve", "x", "_id", "café"};
    static const uint32_t spaces[] = {' ', ' ', ' ', '\t', '\n', '\r', 0xA0, 0x3000, 0x2009, 0x85, 0x180E, 0x0B};
    for (size_t i = 0; i < n_chars; i++) {
        switch (rng() % 12) {
            case 0: s += words[rng() % 10]; break;
            case 1: put(pick('a', 'z')); break;
            case 2: put(pick('!', '~')); break;
            case 3: put(pick('0', '9')); break;
            case 4: put(spaces[rng() % 12]); break;
            case 5:  // Latin letter followed by one or two combining marks
                put(pick(0xC0, 0x24F));
                put(pick(0x300, 0x36F));
                if (rng() % 2) put(pick(0x300, 0x36F));
                break;
            case 6: put(pick(0x4E00, 0x9FFF)); break;
            case 7:  // emoji, sometimes with a skin tone or a ZWJ sequence
                put(pick(0x1F300, 0x1F64F));
                if (rng() % 3 == 0) put(pick(0x1F3FB, 0x1F3FF));
                if (rng() % 3 == 0) {
                    put(0x200D);
                    put(pick(0x1F466, 0x1F469));
                }
                break;
            case 8: put(pick(0x600, 0x6FF)); break;
            case 9: put(rng() % 2 ? pick(0xAC00, 0xD7A3) : pick(0x1100, 0x11FF)); break;
            case 10: {  // a whitespace run
                size_t k = 1 + rng() % 6;
                for (size_t j = 0; j < k; j++) put(rng() % 4 ? ' ' : '\n');
                break;
            }
            default: {  // any assigned-or-not code point outside the surrogates
                uint32_t cp = pick(0x80, 0x10FFFF);
                if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
                put(cp);
            }
        }
    }
    return s;
}

}  // namespace

// ---- golden parity ------------------------------------------------------------------------------------------------

TEST_CASE("Qwen3 tokenizer matches Hugging Face on the golden cases", "[tokenizer]") {
    check_golden(qwen3(), read_json(kData + "/qwen3/golden.json"), "qwen3");
}

TEST_CASE("tiny model tokenizer matches Hugging Face on the golden cases", "[tokenizer]") {
    check_golden(tiny(), read_json(kData + "/tiny/golden.json"), "tiny");
}

TEST_CASE("Qwen3.5 pre-tokenizer regex matches Hugging Face on the golden cases", "[tokenizer]") {
    check_golden(qwen35_regex(), read_json(kData + "/qwen35-regex/golden.json"), "qwen35-regex");
}

TEST_CASE("component and option variants match Hugging Face", "[tokenizer]") {
    json variants = read_json(kData + "/variants.json");
    for (const json& v : variants.at("variants")) {
        std::string name = v.at("name").get<std::string>();
        DYNAMIC_SECTION(name) {
            Tokenizer tok = from_json(apply_patch(tiny_json(), v.at("patch")));
            check_golden(tok, v, name, !v.at("encode_special_tokens").get<bool>());
        }
    }
}

// ---- round trips, streaming, threads ------------------------------------------------------------------------------

TEST_CASE("decode(encode(s)) == NFC(s) on a random Unicode corpus", "[tokenizer]") {
    std::mt19937 rng(20240531u);
    for (int i = 0; i < 300; i++) {
        std::string s = random_text(rng, 1 + rng() % 80);
        std::string want = hy::utf8_nfc(s);
        INFO("text " << json(s).dump());
        CHECK(qwen3().decode(qwen3().encode(s)) == want);
        CHECK(tiny().decode(tiny().encode(s)) == want);
        CHECK(qwen35_regex().decode(qwen35_regex().encode(s)) == want);
    }
    std::string big = random_text(rng, 20000);  // one long text (long words, the BPE heap path)
    CHECK(qwen3().decode(qwen3().encode(big)) == hy::utf8_nfc(big));
    std::string word(5000, 'a');  // a 5000-byte word
    CHECK(qwen3().decode(qwen3().encode(word)) == word);
}

TEST_CASE("StreamDecoder emits complete UTF-8 and agrees with decode", "[tokenizer]") {
    const Tokenizer& tok = qwen3();
    // One emoji is 4 bytes; byte-level tokens may cut it.
    std::vector<int32_t> ids = tok.encode("\xF0\x9F\xA6\x80\xE2\x82\xAC x");  // crab, euro sign
    hy::StreamDecoder sd(tok);
    std::string out;
    for (int32_t id : ids) {
        std::string piece = sd.push(id);
        CHECK(hy::utf8_is_valid(piece));
        out += piece;
    }
    out += sd.flush();
    CHECK(out == "\xF0\x9F\xA6\x80\xE2\x82\xAC x");

    // The single-byte tokens of a 4-byte character: nothing until the last one.
    std::string crab = "\xF0\x9F\xA6\x80";
    std::vector<int32_t> byte_ids;
    for (unsigned char c : crab) {
        std::string one(1, char(c));
        std::vector<int32_t> found;  // the token whose bytes are exactly this one byte
        for (int32_t id = 0; id < tok.n_vocab(); id++)
            if (tok.is_valid(id) && tok.token_piece(id) == one) found.push_back(id);
        REQUIRE(found.size() == 1);
        byte_ids.push_back(found[0]);
    }
    hy::StreamDecoder sd2(tok);
    CHECK(sd2.push(byte_ids[0]).empty());
    CHECK(sd2.push(byte_ids[1]).empty());
    CHECK(sd2.push(byte_ids[2]).empty());
    CHECK(sd2.pending_bytes() == 3);
    CHECK(sd2.push(byte_ids[3]) == crab);
    // An incomplete sequence at the end becomes U+FFFD; an impossible continuation is replaced at once.
    CHECK(sd2.push(byte_ids[0]).empty());
    CHECK(sd2.flush() == "\xEF\xBF\xBD");
    CHECK(sd2.push(byte_ids[0]).empty());
    CHECK(sd2.push(tok.encode("a")[0]) ==
          "\xEF\xBF\xBD"
          "a");

    // Random id streams: the concatenation equals decode (with and without skipping special tokens).
    std::mt19937 rng(7);
    for (int round = 0; round < 200; round++) {
        std::vector<int32_t> seq;
        size_t n = 1 + rng() % 30;
        for (size_t i = 0; i < n; i++) {
            int32_t id = rng() % 4 == 0 ? int32_t(rng() % 300) : int32_t(rng() % uint32_t(tok.n_vocab()));
            if (tok.is_valid(id)) seq.push_back(id);
        }
        for (bool skip : {false, true}) {
            hy::StreamDecoder d(tok, skip);
            std::string s;
            for (int32_t id : seq) {
                std::string piece = d.push(id);
                REQUIRE(hy::utf8_is_valid(piece));
                s += piece;
            }
            s += d.flush();
            CHECK(s == tok.decode(seq, skip));
        }
    }
}

TEST_CASE("encode is thread-safe and deterministic", "[tokenizer]") {
    std::mt19937 rng(99);
    std::vector<std::string> texts;
    for (int i = 0; i < 64; i++) texts.push_back(random_text(rng, 200));
    std::vector<std::vector<int32_t>> want;
    for (const auto& t : texts) want.push_back(qwen3().encode(t));
    std::vector<int> mismatches(4, 0);
    std::vector<std::thread> threads;
    for (int w = 0; w < 4; w++)
        threads.emplace_back([&, w] {
            for (int rep = 0; rep < 5; rep++)
                for (size_t i = 0; i < texts.size(); i++) {
                    size_t k = (i + size_t(w) * 7) % texts.size();
                    if (qwen3().encode(texts[k]) != want[k]) mismatches[size_t(w)]++;
                }
        });
    for (auto& t : threads) t.join();
    for (int m : mismatches) CHECK(m == 0);
}

// ---- vocabulary queries, special tokens, configs --------------------------------------------------------------------

TEST_CASE("vocabulary queries and special-token settings", "[tokenizer]") {
    const Tokenizer& q = qwen3();
    CHECK(q.n_vocab() == 151669);
    CHECK(q.token_id("<|im_start|>") == 151644);
    CHECK(q.token_id("<|im_end|>") == 151645);
    CHECK(q.token_id("Ġhello") == 23811);
    CHECK(q.token_id("no such token") == -1);
    CHECK(q.is_special(151645));
    CHECK_FALSE(q.is_special(151657));  // <tool_call> is an added token but not special
    CHECK_FALSE(q.is_special(23811));
    CHECK_FALSE(q.is_special(-1));
    CHECK(q.token_string(23811) == "Ġhello");
    CHECK(q.token_piece(23811) == " hello");
    CHECK(q.eos_ids() == std::vector<int32_t>{151645});
    CHECK(q.pad_id() == 151643);
    CHECK(q.bos_id() == -1);
    CHECK_FALSE(q.add_bos());

    const Tokenizer& t = tiny();
    CHECK(t.n_vocab() == 4096);
    CHECK(t.eos_ids() == std::vector<int32_t>{1});
    CHECK(t.pad_id() == 0);

    // parse_special=false encodes special tokens as text (HF's encode_special_tokens); <tool_call> is not special.
    CHECK(q.encode("<|im_start|>hi<tool_call>", false) ==
          std::vector<int32_t>{27, 91, 318, 4906, 91, 29, 6023, 151657});
    CHECK(q.encode("<|im_start|>hi<tool_call>", true) == std::vector<int32_t>{151644, 6023, 151657});
    CHECK(q.decode(std::vector<int32_t>{151644, 6023, 151645}, true) == "hi");
}

TEST_CASE("from_folder merges generation_config.json eos ids", "[tokenizer]") {
    namespace fs = std::filesystem;
    fs::path dir = fs::temp_directory_path() / ("hy_tok_test_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir);
    fs::copy_file(kTinyDir + "/tokenizer.json", dir / "tokenizer.json", fs::copy_options::overwrite_existing);
    std::ofstream(dir / "tokenizer_config.json")
        << R"({"eos_token": {"content": "<|im_end|>", "special": true}, "pad_token": null, "bos_token": "<think>",
              "add_bos_token": true})";
    std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [1, 0], "pad_token_id": 0})";
    Tokenizer t = Tokenizer::from_folder(dir.string());
    CHECK(t.eos_ids() == std::vector<int32_t>{1, 0});
    CHECK(t.bos_id() == 3);
    CHECK(t.pad_id() == 0);
    CHECK(t.add_bos());

    std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 0})";
    std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<nope>"})";
    std::string msg;
    CHECK(error_of([&] { Tokenizer::from_folder(dir.string()); }, &msg) == Status::format);
    CHECK(msg.find("<nope>") != std::string::npos);
    std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": )";
    CHECK(error_of([&] { Tokenizer::from_folder(dir.string()); }) == Status::format);
    fs::remove(dir / "tokenizer_config.json");
    Tokenizer t2 = Tokenizer::from_folder(dir.string());
    CHECK(t2.eos_ids() == std::vector<int32_t>{0});
    fs::remove_all(dir);
}

// ---- errors and hostile input -------------------------------------------------------------------------------------

TEST_CASE("loading errors are reported with a status and a clear message", "[tokenizer]") {
    std::string msg;
    CHECK(error_of([] { Tokenizer::from_file(kData + "/does-not-exist.json"); }, &msg) == Status::io);
    CHECK(msg.find("does-not-exist.json") != std::string::npos);
    CHECK(error_of([] { Tokenizer::from_folder(kData + "/nowhere"); }) == Status::io);
    CHECK(error_of([] { Tokenizer::from_file(kData); }) == Status::io);  // a directory
    CHECK(error_of([] { Tokenizer::from_json_string("{\"model\": {\"vocab\": {\"a\": 0}"); }, &msg) == Status::format);
    CHECK(msg.find("malformed JSON") != std::string::npos);
    CHECK(error_of([] { Tokenizer::from_json_string(""); }) == Status::format);
    CHECK(error_of([] { Tokenizer::from_json_string("[1, 2]"); }) == Status::format);
    // another JSON file given as the tokenizer (a config.json): says what was expected
    CHECK(error_of([] { Tokenizer::from_json_string("{\"model_type\": \"qwen3_5\"}"); }, &msg) == Status::format);
    CHECK(msg.find("missing object 'model' (is it a Hugging Face tokenizer.json?)") != std::string::npos);

    auto variant = [](const char* ptr, const json& value) {
        json j = tiny_json();
        j[json::json_pointer(ptr)] = value;
        return j;
    };
    auto status_of = [&](const json& j, std::string* m) { return error_of([&] { from_json(j); }, m); };

    CHECK(status_of(variant("/normalizer", {{"type", "Lowercase"}}), &msg) == Status::unsupported);
    CHECK(msg.find("normalizer") != std::string::npos);
    CHECK(msg.find("Lowercase") != std::string::npos);
    json seq = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Strip"}}}}};
    CHECK(status_of(variant("/normalizer", seq), &msg) == Status::unsupported);
    CHECK(msg.find("Strip") != std::string::npos);
    CHECK(status_of(variant("/pre_tokenizer", {{"type", "Whitespace"}}), &msg) == Status::unsupported);
    CHECK(msg.find("pre_tokenizer") != std::string::npos);
    CHECK(msg.find("Whitespace") != std::string::npos);
    CHECK(status_of(variant("/pre_tokenizer/pretokenizers/0/behavior", "Removed"), &msg) == Status::unsupported);
    CHECK(msg.find("Removed") != std::string::npos);
    CHECK(status_of(variant("/pre_tokenizer/pretokenizers/0/invert", true), &msg) == Status::unsupported);
    CHECK(status_of(variant("/pre_tokenizer", nullptr), &msg) == Status::unsupported);
    CHECK(status_of(variant("/pre_tokenizer/pretokenizers/0/pattern/Regex", "(unclosed"), &msg) == Status::format);
    {  // a regex with nested quantifiers backtracks a bounded number of steps, then is named (it ran for hours: the
       // interpreter had no step limit; 34 letters took over 20 s)
        const Tokenizer bad = from_json(variant("/pre_tokenizer/pretokenizers/0/pattern/Regex", "(a+)+b"));
        const auto t0 = std::chrono::steady_clock::now();
        CHECK(error_of([&] { bad.encode(std::string(40, 'a') + "c b"); }, &msg) == Status::format);
        INFO(msg);
        CHECK(msg.find("backtracking steps on a") != std::string::npos);
        CHECK(msg.find("pre_tokenizer") != std::string::npos);
        CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
        CHECK(bad.encode("aab b").size() > 0);  // (a match within the bound is fine)
    }
    CHECK(msg.find("regex") != std::string::npos);
    CHECK(status_of(variant("/decoder", {{"type", "WordPiece"}}), &msg) == Status::unsupported);
    CHECK(msg.find("decoder") != std::string::npos);
    CHECK(msg.find("WordPiece") != std::string::npos);
    CHECK(status_of(variant("/model/type", "Unigram"), &msg) == Status::unsupported);
    CHECK(msg.find("Unigram") != std::string::npos);
    CHECK(status_of(variant("/model/byte_fallback", true), &msg) == Status::unsupported);
    CHECK(status_of(variant("/model/dropout", 0.1), &msg) == Status::unsupported);
    CHECK(status_of(variant("/model/merges/0", json::array({"Ġ", "nope"})), &msg) == Status::format);
    CHECK(msg.find("nope") != std::string::npos);
    // merges of the wrong type, or none: refused (every word would be split into bytes without a word)
    for (const json& bad : {json(5), json("a b"), json::object(), json(true)}) {
        CHECK(status_of(variant("/model/merges", bad), &msg) == Status::format);
        CHECK(msg.find("model.merges must be a list of merges") != std::string::npos);
    }
    {
        json j = tiny_json();
        j["model"].erase("merges");
        CHECK(status_of(j, &msg) == Status::format);
        CHECK(msg.find("missing list model.merges") != std::string::npos);
    }
    // the JSON library's tag stays out of the message
    CHECK(error_of([] { Tokenizer::from_json_string("{\"model\": 1 x}"); }, &msg) == Status::format);
    CHECK(msg.find("json.exception") == std::string::npos);
    CHECK(status_of(variant("/model/merges/0", "a b c"), &msg) == Status::format);
    CHECK(status_of(variant("/model/vocab/!", -5), &msg) == Status::format);
    CHECK(status_of(variant("/model/vocab/!", "five"), &msg) == Status::format);
    CHECK(status_of(variant("/added_tokens/0/content", 7), &msg) == Status::format);
    // an added token's id given as null is named as such (it read "is missing"), and one without an id as missing
    CHECK(status_of(variant("/added_tokens/0/id", nullptr), &msg) == Status::format);
    CHECK(msg.find("added_tokens[0].id must be an integer token id, found null") != std::string::npos);
    {
        json j = tiny_json();
        j["added_tokens"][0].erase("id");
        CHECK(status_of(j, &msg) == Status::format);
        CHECK(msg.find("added_tokens[0].id is missing") != std::string::npos);
    }
    json no_model = tiny_json();
    no_model.erase("model");
    CHECK(status_of(no_model, &msg) == Status::format);
    // an empty vocabulary is refused at load (it loaded, and every prompt was then "empty")
    CHECK(status_of(variant("/model/vocab", json::object()), &msg) == Status::format);
    CHECK(msg.find("model.vocab is empty") != std::string::npos);
}

TEST_CASE("invalid UTF-8 input is replaced by U+FFFD, never a crash", "[tokenizer]") {
    // Maximal-subpart replacement, as Python's decode(errors="replace").
    CHECK(hy::utf8_sanitize("a\xFF"
                            "b") ==
          "a\xEF\xBF\xBD"
          "b");
    CHECK(hy::utf8_sanitize("\xE0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD");                  // E0 needs A0..BF next
    CHECK(hy::utf8_sanitize("\xF0\x9F\x98") == "\xEF\xBF\xBD");                          // truncated 4-byte
    CHECK(hy::utf8_sanitize("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
    CHECK(hy::utf8_sanitize("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong
    CHECK(hy::utf8_sanitize("\xF4\x90\x80\x80") ==
          "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // above U+10FFFF
    CHECK_FALSE(hy::utf8_is_valid("\xC3"));
    CHECK(hy::utf8_is_valid("\xC3\xA9"));

    for (const Tokenizer* tok : {&qwen3(), &tiny()}) {
        std::string bad = "x\xFF\xFEy \xC3 <|im_end|\xE0\x80> \xF0\x9F\x98";
        std::vector<int32_t> ids;
        REQUIRE_NOTHROW(ids = tok->encode(bad));
        CHECK(ids == tok->encode(hy::utf8_sanitize(bad)));
        CHECK(tok->decode(ids) == hy::utf8_sanitize(bad));
    }
    // Random bytes: encode never throws, decode(encode(b)) == NFC(sanitize(b)).
    std::mt19937 rng(3);
    for (int i = 0; i < 300; i++) {
        std::string b;
        size_t n = rng() % 64;
        for (size_t k = 0; k < n; k++) b += char(rng() % 4 == 0 ? '<' : rng() % 256);
        std::vector<int32_t> ids;
        REQUIRE_NOTHROW(ids = tiny().encode(b));
        CHECK(tiny().decode(ids) == hy::utf8_nfc(hy::utf8_sanitize(b)));
    }
}

TEST_CASE("decode and token queries reject ids outside the vocabulary", "[tokenizer]") {
    std::string msg;
    CHECK(error_of([] { qwen3().decode(std::vector<int32_t>{1, 200000}); }, &msg) == Status::invalid_argument);
    CHECK(msg.find("200000") != std::string::npos);
    CHECK(error_of([] { qwen3().decode(std::vector<int32_t>{-3}); }, &msg) == Status::invalid_argument);
    CHECK(msg.find("-3") != std::string::npos);
    CHECK(error_of([] { tiny().token_piece(4096); }) == Status::invalid_argument);
    CHECK(error_of([] { tiny().token_string(-1); }) == Status::invalid_argument);
    hy::StreamDecoder sd(tiny());
    CHECK(error_of([&] { sd.push(99999); }) == Status::invalid_argument);
    // A token holding part of a UTF-8 sequence decodes to U+FFFD, as HF does.
    std::vector<int32_t> ids = qwen3().encode("\xF0\x9D\x94\x98");  // U+1D518: several byte-level tokens
    REQUIRE(ids.size() > 1);
    CHECK(qwen3().decode(std::vector<int32_t>{ids[0]}) == "\xEF\xBF\xBD");
    CHECK(qwen3().token_piece(ids[0]).size() < 4);
}

// ---- chat format ----------------------------------------------------------------------------------------------------

TEST_CASE("ChatML rendering on the tiny and Qwen3 tokenizers", "[tokenizer]") {
    for (const Tokenizer* tok : {&tiny(), &qwen3()}) {
        hy::ChatTemplate chat = hy::ChatTemplate::for_tokenizer(*tok);
        CHECK(std::string(chat.name()) == "chatml");
        CHECK(chat.has_think_tokens());
        CHECK(chat.end_of_turn() == "<|im_end|>");
        CHECK(chat.end_of_turn_id() == tok->token_id("<|im_end|>"));

        std::vector<hy::ChatMessage> msgs = {{"system", "You are helpful."}, {"user", "Hi"}};
        CHECK(chat.render(msgs) ==
              "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n<think>\n\n</think>\n\n");
        CHECK(chat.render(msgs, {true, hy::Thinking::enabled}) ==
              "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n<think>\n");
        CHECK(chat.render(msgs, {true, hy::Thinking::model_decides}) ==
              "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
              "<|im_start|>assistant\n");
        CHECK(chat.render(msgs, {false, hy::Thinking::disabled}) ==
              "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
        CHECK(chat.render({}) == "<|im_start|>assistant\n<think>\n\n</think>\n\n");

        // Multi-turn: the REPL prefills the first prompt, generates, then prefills only the continuation.
        std::vector<hy::ChatMessage> turn2 = {{"user", "And 2+2?"}};
        std::string answer = "Hello! 4 is next.";
        std::string first = chat.render(msgs);
        std::string cont = chat.render_continuation(turn2, true);
        CHECK(cont == "\n<|im_start|>user\nAnd 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
        CHECK(chat.render_continuation(turn2, false) ==
              "<|im_end|>\n<|im_start|>user\nAnd 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
        std::vector<hy::ChatMessage> whole = msgs;
        whole.push_back({"assistant", chat.think_prefix(hy::Thinking::disabled) + answer});
        whole.insert(whole.end(), turn2.begin(), turn2.end());
        CHECK(chat.render(whole) == first + answer + "<|im_end|>" + cont);

        // The rendered text tokenizes with the special tokens as single ids.
        std::vector<int32_t> ids = tok->encode(first);
        CHECK(ids.front() == tok->token_id("<|im_start|>"));
        CHECK(std::count(ids.begin(), ids.end(), tok->token_id("<|im_end|>")) == 2);
        CHECK(tok->decode(ids) == first);

        std::string msg;
        CHECK(error_of(
                  [&] {
                      chat.render(std::vector<hy::ChatMessage>{{"user", "a"}, {"tool", "b"}});
                  },
                  &msg) == Status::invalid_argument);
        CHECK(msg.find("tool") != std::string::npos);
    }
}

TEST_CASE("a tokenizer without <|im_start|> has an unsupported chat template", "[tokenizer]") {
    json j = tiny_json();
    // Rename <|im_start|> (id 2) in the vocab and in the added tokens.
    j["model"]["vocab"].erase("<|im_start|>");
    j["model"]["vocab"]["<|start|>"] = 2;
    for (json& a : j["added_tokens"])
        if (a["content"] == "<|im_start|>") a["content"] = "<|start|>";
    Tokenizer tok = from_json(j);
    CHECK(tok.token_id("<|im_start|>") == -1);
    std::string msg;
    CHECK(error_of([&] { hy::ChatTemplate::for_tokenizer(tok); }, &msg) == Status::unsupported);
    CHECK(msg.find("unsupported chat template") != std::string::npos);

    // <|im_end|> still in the vocab but gone from added_tokens: it would not be matched as one token in a prompt.
    json m = tiny_json();
    json kept = json::array();
    for (const json& a : m["added_tokens"])
        if (a["content"] != "<|im_end|>") kept.push_back(a);
    m["added_tokens"] = kept;
    Tokenizer no_added = from_json(m);
    CHECK(no_added.token_id("<|im_end|>") >= 0);
    CHECK(error_of([&] { hy::ChatTemplate::for_tokenizer(no_added); }, &msg) == Status::unsupported);
    CHECK(msg.find("not in tokenizer.json's added_tokens") != std::string::npos);

    // Without <think>/</think>: plain ChatML, no think prefix.
    json k = tiny_json();
    for (const char* t : {"<think>", "</think>"}) k["model"]["vocab"].erase(t);
    json added = json::array();
    for (const json& a : k["added_tokens"])
        if (a["content"] != "<think>" && a["content"] != "</think>") added.push_back(a);
    k["added_tokens"] = added;
    hy::ChatTemplate plain = hy::ChatTemplate::for_tokenizer(from_json(k));
    CHECK_FALSE(plain.has_think_tokens());
    CHECK(plain.render(std::vector<hy::ChatMessage>{{"user", "Hi"}}) ==
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}
