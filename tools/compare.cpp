// hybrid-compare: checks hybrid against Hugging Face golden outputs (golden.json + golden_logits.safetensors, as
// made by make_fixture.py). For each case: greedy tokens matched out of max_new_tokens, the first divergence (with
// the top-2 logit margin there), the max absolute logit error at the last prompt position and over all prompt
// positions. Then the `batch` entry: each prompt alone must reproduce its row of the left-padded batch.
// Last line: SUMMARY: <k>/<n> cases exact[ (<j> more accepted at a near-tie)], max logit err <x>. Exit 0 only if
// every case is exact or accepted at a near-tie (--near-tie).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cxxopts.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/model.h"
#include "model/safetensors.h"
#include "tools/tool_common.h"

using namespace hy;
using json = nlohmann::json;

namespace {

// A JSON list of token ids: integers in [0, 2^31) (a larger value would wrap when read as int32).
bool token_list(const json& v) {
    if (!v.is_array()) return false;
    for (const json& x : v)
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX) return false;
    return true;
}

struct Greedy {
    std::vector<int32_t> tokens;
    std::vector<float> margins;  // top-1 minus top-2 logit at each step
};

int32_t argmax(std::span<const float> v, float* margin) {
    int32_t best = 0;
    for (size_t i = 1; i < v.size(); i++)
        if (v[i] > v[size_t(best)]) best = int32_t(i);
    float second = -INFINITY;
    for (size_t i = 0; i < v.size(); i++)
        if (int32_t(i) != best) second = std::max(second, v[i]);
    if (margin) *margin = v[size_t(best)] - second;
    return best;
}

Greedy greedy(Model& m, std::span<const float> last_logits, int n) {
    Greedy g;
    std::vector<float> cur(last_logits.begin(), last_logits.end());
    for (int i = 0; i < n; i++) {
        float margin;
        int32_t t = argmax(cur, &margin);
        g.tokens.push_back(t);
        g.margins.push_back(margin);
        if (i + 1 == n) break;
        auto l = m.prefill(0, std::span<const int32_t>(&t, 1));
        cur.assign(l.begin(), l.end());
    }
    return g;
}

std::string read_file(const std::string& path) { return read_regular_file(path, size_t(1) << 30); }

}  // namespace

int main(int argc, char** argv) {
    // each finished line reaches a redirected stdout at once (a Ctrl-C lost every finished row and case)
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    cxxopts::Options opts("hybrid-compare", "Compare hybrid's logits and greedy tokens with Hugging Face goldens");
    // clang-format off
    // (-m, --device, -t and -h are declared in cli/option_table.h, shared with hybrid and the other tools)
    add_shared_option(opts, "", "model");
    opts.add_options()
        ("golden", "golden file (default MODEL/golden.json)", cxxopts::value<std::string>())
        ("logits", "golden logits (default MODEL/golden_logits.safetensors when present)",
         cxxopts::value<std::string>())
        ("no-logits", "compare the greedy tokens only, without the default golden logits");
    add_shared_option(opts, "", "device", "cpu");
    add_shared_option(opts, "", "quant");
    add_shared_option(opts, "", "quant-lm-head");
    add_shared_option(opts, "", "fp8-gemm");
    opts.add_options()
        ("key", "golden token list to compare with (default greedy_fp32_cpu on the CPU, greedy_bf16_cuda on CUDA)",
         cxxopts::value<std::string>())
        ("tol", "max absolute logit error allowed (default 1e-3 on the CPU, 5e-2 on CUDA)",
         cxxopts::value<std::string>())
        ("near-tie", "accept a divergence where our top-2 logit margin is below this (a near-tie)",
         cxxopts::value<std::string>()->default_value("0"));
    add_shared_option(opts, "", "threads");
    add_shared_option(opts, "", "no-cuda-graphs");
    add_shared_option(opts, "", "no-pdl");
    add_shared_option(opts, "", "moe-grouped-rows");
    opts.add_options()
        ("case", "run only this case (batch: the batch entry and the cases it compares with)",
         cxxopts::value<std::string>());
    add_shared_option(opts, "", "version");
    add_shared_option(opts, "", "help");
    // clang-format on
    cxxopts::ParseResult args;
    int exit_code = 0;
    if (!tools::parse_args(opts, argc, argv, "hybrid-compare", args, &exit_code)) return exit_code;
    if (!args.unmatched().empty()) {
        std::fprintf(stderr, "hybrid-compare: unexpected argument '%s' (see --help)\n", args.unmatched()[0].c_str());
        return tools::exit_usage;
    }
    try {
        tools::check_int_args(args, {"threads", "moe-grouped-rows"});
        tools::check_given_once(args);
        const std::string dir = folder_path(args["model"].as<std::string>());  // ("m/golden.json", not "m//...")
        const std::string dev = args["device"].as<std::string>();
        ModelParams mp;
        mp.device = tools::parse_device(dev);
        tools::parse_quant(args["quant"].as<std::string>(), mp);
        tools::parse_quant_lm_head(args["quant-lm-head"].as<bool>(), mp);
        mp.cuda.fp8_block_scaled_gemm = tools::parse_fp8_gemm(args["fp8-gemm"].as<std::string>());
        mp.n_threads = tools::parse_threads(args["threads"].as<int>());
        mp.cuda.graphs = !args["no-cuda-graphs"].as<bool>();
        mp.cuda.pdl = !args["no-pdl"].as<bool>();
        mp.cuda.moe_grouped_min_rows = tools::parse_moe_grouped_rows(args["moe-grouped-rows"].as<int>());
        auto nonnegative = [&](const char* name) {  // a real option >= 0, parsed strictly (arg_error.h)
            const std::string text = args[name].as<std::string>();
            double v = 0.0;
            if (!parse_real(text, &v)) throw tools::UsageError(invalid_real_message(text, name));
            if (v < 0.0) throw tools::UsageError(std::string("--") + name + " must be a number >= 0");
            return v;
        };
        const double tol_arg = args.count("tol") ? nonnegative("tol") : -1.0;  // -1: the device's default
        const double near_tie = nonnegative("near-tie");
        tools::loading([&] { require_model_folder(dir); });  // (as the other programs word a bad -m: exit 2)
        const std::string golden_path = args.count("golden") ? args["golden"].as<std::string>() : dir + "/golden.json";
        if (golden_path.empty()) throw tools::UsageError("--golden needs a file name");
        if (args.count("logits") && args.count("no-logits"))
            throw tools::UsageError("--logits and --no-logits exclude each other");
        const json golden = parse_json(read_file(golden_path), golden_path);
        if (!golden.is_object() || !golden.contains("cases"))
            throw Error(Status::format, golden_path + ": field 'cases' is missing");
        if (!golden["cases"].is_array()) throw Error(Status::format, golden_path + ": field 'cases' must be a list");
        if (golden["cases"].empty())  // (a run of no cases would report 0/0 and pass)
            throw Error(Status::format, golden_path + ": field 'cases' is empty");
        // every case's fields, once, so that the code below can read them as they are
        size_t case_no = 0;
        for (const json& c : golden["cases"]) {
            const std::string where = golden_path + ": case " + std::to_string(case_no++);
            if (!c.is_object() || !c.contains("name") || !c["name"].is_string())
                throw Error(Status::format, where + ": field 'name' (a string) is missing");
            if (c["name"] == "batch")  // (--case batch names the batch entry)
                throw Error(Status::format, where + ": the name 'batch' is the batch entry's; give the case another");
            if (!c.contains("input_ids") || !token_list(c["input_ids"]) || c["input_ids"].empty())
                throw Error(Status::format, where + " ('" + c["name"].get<std::string>() +
                                                "'): field 'input_ids' must be a non-empty list of token ids");
            if (!c.contains("max_new_tokens") || !c["max_new_tokens"].is_number_integer() ||
                c["max_new_tokens"].get<int64_t>() < 0 || c["max_new_tokens"].get<int64_t>() > (1 << 20))
                throw Error(Status::format, where + " ('" + c["name"].get<std::string>() +
                                                "'): field 'max_new_tokens' must be an integer in [0, 1048576]");
            for (const auto& [field, v] : c.items()) {
                if (field.rfind("greedy_", 0) != 0 || !v.is_array()) continue;  // (token lists; *_text are text)
                if (!token_list(v))
                    throw Error(Status::format, where + " ('" + c["name"].get<std::string>() + "'): field '" + field +
                                                    "' must be a list of token ids");
                // the goldens are generated without an end-of-sequence stop: max_new_tokens tokens each
                if (v.size() != c["max_new_tokens"].get<size_t>())
                    throw Error(Status::format, where + " ('" + c["name"].get<std::string>() + "'): '" + field +
                                                    "' has " + std::to_string(v.size()) +
                                                    " tokens, max_new_tokens is " +
                                                    std::to_string(c["max_new_tokens"].get<int64_t>()));
            }
            for (size_t k = 0; k + 1 < case_no; k++)  // (the logits file holds one tensor per case name)
                if (golden["cases"][k]["name"] == c["name"])
                    throw Error(Status::format, where + ": the name '" + c["name"].get<std::string>() +
                                                    "' is used by an earlier case too");
        }
        if (golden.contains("batch")) {  // {"names": [case names], "greedy_fp32_left_padded": [token lists]}
            const json& b = golden["batch"];
            bool ok = b.is_object() && b.contains("names") && b["names"].is_array() &&
                      b.contains("greedy_fp32_left_padded") && b["greedy_fp32_left_padded"].is_array();
            for (size_t i = 0; ok && i < b["names"].size(); i++) ok = b["names"][i].is_string();
            for (size_t i = 0; ok && i < b["greedy_fp32_left_padded"].size(); i++) {
                const json& row = b["greedy_fp32_left_padded"][i];
                ok = token_list(row) && !row.empty();
            }
            if (!ok || b["names"].empty() || b["names"].size() != b["greedy_fp32_left_padded"].size())
                throw Error(Status::format, golden_path +
                                                ": field 'batch' must hold 'names' (a list of case names) and "
                                                "'greedy_fp32_left_padded' (as many non-empty token lists)");
            for (size_t i = 0; i < b["names"].size(); i++) {
                const json& nm = b["names"][i];
                const json* cs = nullptr;
                for (const json& c : golden["cases"])
                    if (c["name"] == nm) cs = &c;
                if (!cs)
                    throw Error(Status::format, golden_path + ": field 'batch' names '" + nm.get<std::string>() +
                                                    "', which is not a case of the file");
                for (size_t k = 0; k < i; k++)
                    if (b["names"][k] == nm)
                        throw Error(Status::format,
                                    golden_path + ": field 'batch' names '" + nm.get<std::string>() + "' twice");
                if (b["greedy_fp32_left_padded"][i].size() != (*cs)["max_new_tokens"].get<size_t>())
                    throw Error(Status::format, golden_path + ": batch row " + std::to_string(i) + " ('" +
                                                    nm.get<std::string>() + "') has " +
                                                    std::to_string(b["greedy_fp32_left_padded"][i].size()) +
                                                    " tokens, the case's max_new_tokens is " +
                                                    std::to_string((*cs)["max_new_tokens"].get<int64_t>()));
            }
        }
        const std::string only_case = args.count("case") ? args["case"].as<std::string>() : "";
        if (args.count("case")) {
            bool found = false;
            for (const json& c : golden["cases"]) found = found || (c.contains("name") && c["name"] == only_case);
            found = found || (only_case == "batch" && golden.contains("batch"));  // the batch entry, as reported
            if (!found) throw tools::UsageError(golden_path + ": no case named '" + only_case + "'");
        }
        int max_len = 1;
        for (const json& c : golden["cases"])
            max_len = std::max(max_len, int(c["input_ids"].size()) + c["max_new_tokens"].get<int>());
        mp.n_ctx = max_len + 8;
        mp.max_batch_tokens = 128;
        mp.max_logits = 128;
        // Golden logits, when present (opened before the model is loaded: a bad --logits fails at once).
        std::string logits_path =
            args.count("logits") ? args["logits"].as<std::string>() : dir + "/golden_logits.safetensors";
        if (logits_path.empty()) throw tools::UsageError("--logits needs a file name");
        auto lf = std::make_unique<hyst_file>();
        bool have_logits = false;
        {
            std::error_code ec;
            if (args.count("logits") ||
                (!args.count("no-logits") && std::filesystem::exists(logits_path, ec))) {  // (regular files only)
                if (hyst_open(lf.get(), logits_path.c_str()) != HYST_OK) throw Error(Status::format, lf->error);
                have_logits = true;
            }
        }
        mp.progress = tools::load_progress("hybrid-compare");
        auto model = tools::loading([&] { return Model::load(dir, mp); });
        if (!model->load_warning().empty())
            std::fprintf(stderr, "%s: warning: %s\n", "hybrid-compare", model->load_warning().c_str());
        tools::warn_oversubscribed("hybrid-compare", mp.n_threads, *model);
        const bool on_gpu = std::string(model->backend().name()) != "cpu";
        for (const char* flag : {"fp8-gemm", "no-cuda-graphs", "no-pdl", "moe-grouped-rows"})
            if (args.count(flag) && !on_gpu)
                std::fprintf(stderr, "hybrid-compare: note: --%s only changes the CUDA backend; ignored on %s\n", flag,
                             model->backend().name());
        const std::string key =
            args.count("key") ? args["key"].as<std::string>() : (on_gpu ? "greedy_bf16_cuda" : "greedy_fp32_cpu");
        // every case must have the token list: a given --key that one lacks is a bad argument (exit 2, as an unknown
        // --case is); the default list missing is a defect of the golden file
        const int V = model->config().vocab_size;
        for (const json& c : golden["cases"]) {
            const std::string name = c["name"].get<std::string>();
            if (!c.contains(key) || !token_list(c[key])) {
                if (args.count("key"))
                    throw tools::UsageError("--key '" + key + "': case '" + name + "' of " + golden_path +
                                            " has no such token list");
                throw Error(Status::format, golden_path + ": case '" + name + "' has no '" + key + "' list");
            }
            // the goldens are generated without an end-of-sequence stop: max_new_tokens tokens each
            if (c[key].size() != c["max_new_tokens"].get<size_t>())
                throw Error(Status::format, golden_path + ": case '" + name + "': '" + key + "' has " +
                                                std::to_string(c[key].size()) + " tokens, max_new_tokens is " +
                                                std::to_string(c["max_new_tokens"].get<int64_t>()));
            for (const char* field : {"input_ids", key.c_str()})
                for (const json& x : c[field])
                    if (x.get<int64_t>() >= V)
                        throw Error(Status::format, golden_path + ": case '" + name + "': '" + field + "' holds " +
                                                        std::to_string(x.get<int64_t>()) +
                                                        ", outside the model's vocabulary [0, " + std::to_string(V) +
                                                        ")");
        }
        // each case that will run has its logits tensor [prompt tokens, vocab] (checked before any case runs)
        const json* batch_names = golden.contains("batch") ? &golden["batch"]["names"] : nullptr;
        for (const json& c : golden["cases"]) {
            const std::string name = c["name"].get<std::string>();
            const bool runs = only_case.empty() || name == only_case ||
                              (only_case == "batch" && batch_names &&
                               std::find(batch_names->begin(), batch_names->end(), c["name"]) != batch_names->end());
            if (!have_logits || !runs) continue;
            const hyst_tensor* t = hyst_find(lf.get(), name.c_str());
            const size_t T = c["input_ids"].size();
            const std::string want = "F32 [" + std::to_string(T) + ", " + std::to_string(V) + "]";
            if (!t) throw Error(Status::format, logits_path + ": no tensor '" + name + "' (expected " + want + ")");
            if (t->dtype != HYST_F32 || t->n_dims != 2 || size_t(t->shape[0]) != T || t->shape[1] != V) {
                std::string found = std::string(hyst_dtype_name(t->dtype)) + " [";
                for (int d = 0; d < t->n_dims; d++) found += (d ? ", " : "") + std::to_string(t->shape[d]);
                throw Error(Status::format,
                            logits_path + ": tensor '" + name + "' is " + found + "], expected " + want);
            }
        }
        const double tol = tol_arg >= 0.0 ? tol_arg : (on_gpu ? 5e-2 : 1e-3);
        std::printf("model %s on %s, golden %s (%s), logit tolerance %g\n", dir.c_str(), model->backend().name(),
                    golden_path.c_str(), key.c_str(), tol);

        int n_cases = 0, n_exact = 0, n_near_tie = 0;  // (a case accepted at a near-tie is not exact)
        double worst = 0.0;
        std::map<std::string, std::vector<int32_t>> solo;
        const std::string& only = only_case;
        // --case batch: the batch entry and the cases whose solo runs it compares with its rows
        std::vector<std::string> batch_cases;
        if (only == "batch" && golden.contains("batch") && golden["batch"].contains("names"))
            batch_cases = golden["batch"]["names"].get<std::vector<std::string>>();
        for (const json& c : golden["cases"]) {
            const std::string name = c["name"].get<std::string>();
            if (!only.empty() && name != only &&
                std::find(batch_cases.begin(), batch_cases.end(), name) == batch_cases.end())
                continue;
            std::vector<int32_t> ids = c["input_ids"].get<std::vector<int32_t>>();
            const int n_new = c["max_new_tokens"].get<int>();
            std::vector<int32_t> want = c[key].get<std::vector<int32_t>>();
            model->reset(0);
            auto all = model->prefill(0, ids, true);
            const size_t T = ids.size();
            double err_all = NAN, err_last = NAN;
            if (have_logits) {
                const hyst_tensor* t = hyst_find(lf.get(), name.c_str());  // (its dtype and shape checked above)
                const char* g = static_cast<const char*>(t->data);         // (any alignment: read with memcpy)
                err_all = err_last = 0.0;
                for (size_t i = 0; i < T * size_t(V); i++) {
                    float gi;
                    std::memcpy(&gi, g + 4 * i, 4);
                    double e = std::fabs(double(all[i]) - double(gi));
                    if (!(e == e)) e = INFINITY;  // NaN never passes
                    err_all = std::max(err_all, e);
                    if (i >= (T - 1) * size_t(V)) err_last = std::max(err_last, e);
                }
                worst = std::max(worst, err_all);
            }
            std::vector<float> last(all.end() - V, all.end());
            Greedy got = greedy(*model, last, n_new);
            solo[name] = got.tokens;
            int matched = 0;
            while (matched < n_new && matched < int(want.size()) &&
                   got.tokens[size_t(matched)] == want[size_t(matched)])
                matched++;
            bool tokens_ok = matched == n_new;
            std::string note;
            if (!tokens_ok) {
                char buf[256];
                std::snprintf(buf, sizeof buf,
                              "; first divergence at step %d: golden %d, got %d, our top-2 margin %.4g", matched,
                              want[size_t(matched)], got.tokens[size_t(matched)], got.margins[size_t(matched)]);
                note = buf;
                if (got.margins[size_t(matched)] < near_tie) {
                    note += " (near-tie: accepted)";
                    tokens_ok = true;
                }
            }
            const bool logits_ok = !have_logits || err_all <= tol;
            const bool ok = tokens_ok && logits_ok;
            if (!logits_ok) {  // (a FAIL line with "near-tie: accepted" said only why the tokens passed)
                char buf[64];
                std::snprintf(buf, sizeof buf, "; logit err above the tolerance %g", tol);
                note += buf;
            }
            n_cases++;
            n_exact += ok && matched == n_new;
            n_near_tie += ok && matched != n_new;
            auto num = [](double v) {
                if (std::isnan(v)) return std::string("n/a");  // no golden logits
                char b[32];
                std::snprintf(b, sizeof b, "%.3g", v);
                return std::string(b);
            };
            std::printf("%-4s %-16s prompt %4zu  tokens %2d/%d  logit err last %s all %s%s\n", ok ? "ok" : "FAIL",
                        name.c_str(), T, matched, n_new, num(err_last).c_str(), num(err_all).c_str(), note.c_str());
        }

        // The batch rows are the fp32 model's greedy tokens: quantized weights (--quant, an FP8 or int4
        // checkpoint) make the model's own tokens diverge from them, which says nothing about batching, so the entry
        // is skipped then (hybrid-tests checks that batch rows equal solo runs with quantized weights)
        bool int_weights = false;
        for (const auto& [type, n] : weight_dtypes(model->weights())) int_weights = int_weights || is_int_quant(type);
        const std::string weights =
            mp.quant != WeightQuant::none       ? std::string("--quant ") + weight_quant_name(mp.quant)
            : has_fp8_weights(model->weights()) ? std::string("the FP8 weights")
            : int_weights ? std::string("the integer weights' products (int8 or bf16 activations)")
                          : std::string();
        if (golden.contains("batch") && (only.empty() || only == "batch") && !weights.empty())
            std::printf("skip %-16s its rows are the fp32 model's tokens, which %s %s\n", "batch", weights.c_str(),
                        mp.quant != WeightQuant::none ? "changes" : "change");
        if (golden.contains("batch") && (only.empty() || only == "batch") && weights.empty()) {
            const json& b = golden["batch"];
            std::vector<std::string> names = b["names"].get<std::vector<std::string>>();
            const json& rows = b["greedy_fp32_left_padded"];
            bool ok = rows.size() == names.size();
            if (!ok) std::printf("     the batch entry has %zu rows for %zu names\n", rows.size(), names.size());
            for (size_t i = 0; ok && i < names.size(); i++) {
                std::vector<int32_t> row = rows[i].get<std::vector<int32_t>>();
                auto it = solo.find(names[i]);
                if (it == solo.end()) {
                    std::printf("     batch row %zu names '%s', which is not a case of this file\n", i,
                                names[i].c_str());
                    ok = false;
                    break;
                }
                const std::vector<int32_t>& s = it->second;
                size_t m = 0;
                while (m < row.size() && m < s.size() && row[m] == s[m]) m++;
                if (m != row.size()) {
                    std::printf("     batch row %zu (%s): solo run diverges from the left-padded row at step %zu\n", i,
                                names[i].c_str(), m);
                    ok = false;
                }
            }
            n_cases++;
            n_exact += ok;
            std::printf("%-4s %-16s %zu prompts: each alone reproduces its left-padded batch row\n", ok ? "ok" : "FAIL",
                        "batch", names.size());
        }
        if (have_logits) hyst_close(lf.get());
        char accepted[96] = "";
        if (n_near_tie > 0) std::snprintf(accepted, sizeof accepted, " (%d more accepted at a near-tie)", n_near_tie);
        if (have_logits)
            std::printf("SUMMARY: %d/%d cases exact%s, max logit err %.3g\n", n_exact, n_cases, accepted, worst);
        else
            std::printf("SUMMARY: %d/%d cases exact%s, max logit err n/a (no golden logits)\n", n_exact, n_cases,
                        accepted);
        return tools::finish("hybrid-compare", n_exact + n_near_tie == n_cases ? tools::exit_ok : tools::exit_check);
    } catch (const tools::UsageError& e) {
        std::fprintf(stderr, "hybrid-compare: %s (see --help)\n", e.what());
        return tools::exit_usage;
    } catch (const tools::Failure& e) {
        std::fprintf(stderr, "hybrid-compare: %s\n", e.what());
        return e.code;
    } catch (const Error& e) {
        std::fprintf(stderr, "hybrid-compare: %s\n", e.what());
        return tools::exit_code_of(e);
    } catch (const json::exception& e) {  // a field the checks above do not cover (the batch section)
        std::fprintf(stderr, "hybrid-compare: a golden file field has the wrong type or is missing: %s\n", e.what());
        return tools::exit_io;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "hybrid-compare: %s\n", e.what());
        return tools::exit_runtime;
    }
}
