// The command-line options that hybrid and the hybrid-* tools share, declared once: name, help text, value type and
// default. Each program adds the ones it takes with add_shared_option, so a shared option reads the same in every
// --help. The checks of the values stay with each program (their messages differ).
#pragma once

#include <cxxopts.hpp>
#include <memory>
#include <stdexcept>
#include <string>

namespace hy {

struct SharedOption {
    enum class Type { flag, text, integer };
    const char* names;  // as cxxopts takes them: "m,model" (short and long name) or "device" (long only)
    const char* help;
    Type type;
    const char* default_value;  // "" for none
};

inline constexpr SharedOption kSharedOptions[] = {
    {"m,model", "model folder (config.json, *.safetensors, tokenizer.json)", SharedOption::Type::text, ""},
    {"t,threads", "CPU threads (0 or -1: all cores)", SharedOption::Type::integer, "0"},
    {"device", "auto, cpu or cuda", SharedOption::Type::text, "auto"},
    {"quant",
     "quantize a 16-bit checkpoint's linear weights at load: fp8 (FP8 e4m3 with 128 x 128 block scales, as Qwen's "
     "FP8 releases), int8 or int4 (group-wise symmetric, a scale per 64 (int8) or 32 (int4) weights of a row; "
     "int8:G / int4:G for another group size G, 32 or a multiple of 64 up to 1024; the matrices' input features must "
     "be "
     "a multiple of 64), or none. FP8 "
     "checkpoints "
     "load as they are, without it",
     SharedOption::Type::text, "none"},
    {"quant-lm-head",
     "with --quant int8/int4: quantize lm_head too (a tied lm_head gets a quantized copy of the embeddings). Off by "
     "default, because it moves the logits further from the 16-bit model's (models/tiny int4: top-1 agreement 87.4% "
     "with it, 89.1% without); on, an int4 decode step of a 4B model reads about a quarter fewer bytes",
     SharedOption::Type::flag, ""},
    {"fp8-gemm",
     "CUDA, FP8 weights, steps of more than 8 rows (prefill, big batches): block-scaled (FP8 tensor cores, the "
     "activations quantized to e4m3 per row and 128 values, as vLLM and transformers run FP8 checkpoints) or "
     "dequantize (a bf16 copy of each matrix and the bf16 GEMM: activations kept in bf16, as the decode GEMVs and the "
     "CPU backend; slower)",
     SharedOption::Type::text, "block-scaled"},
    {"moe-grouped-rows",
     "CUDA, MoE models: run the experts grouped by expert from this many rows of a step on (0: the built-in default, "
     "16)",
     SharedOption::Type::integer, "0"},
    {"no-cuda-graphs",
     "CUDA: launch every kernel one by one instead of replaying CUDA graphs (same results, slower; "
     "for profilers and debugging)",
     SharedOption::Type::flag, ""},
    {"no-pdl",
     "CUDA: launch kernels without programmatic dependent launch (each waits for the previous one to end; "
     "for speed comparisons)",
     SharedOption::Type::flag, ""},
    {"h,help", "print this help", SharedOption::Type::flag, ""},
    {"version", "print the version", SharedOption::Type::flag, ""},
};

// Adds the shared option with the long name `name` to `group` of opts (the options of a group are listed in the
// order they are added). default_value, when given, replaces the table's default (hybrid-compare runs on the CPU
// unless told otherwise).
inline void add_shared_option(cxxopts::Options& opts, const std::string& group, const std::string& name,
                              const char* default_value = nullptr) {
    for (const SharedOption& o : kSharedOptions) {
        const std::string names = o.names;
        if (names.substr(names.find(',') + 1) != name) continue;  // (no ',': npos + 1 is 0, the whole string)
        std::shared_ptr<cxxopts::Value> value;
        switch (o.type) {
            case SharedOption::Type::flag: value = cxxopts::value<bool>(); break;
            case SharedOption::Type::text: value = cxxopts::value<std::string>(); break;
            case SharedOption::Type::integer: value = cxxopts::value<int>(); break;
        }
        const char* def = default_value ? default_value : o.default_value;
        if (*def) value->default_value(def);
        opts.add_options(group)(o.names, o.help, value);
        return;
    }
    throw std::logic_error("add_shared_option: no shared option --" + name);
}

}  // namespace hy
