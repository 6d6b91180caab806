// Loading a Qwen3.5 checkpoint into the arena; sequence slots and snapshots. The forward is in forward.cpp.
#define HYST_IMPLEMENTATION
#include "model/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "model/model.h"

namespace hy {

namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

bool is_dir(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

DType to_dtype(hyst_dtype t) {
    switch (t) {
        case HYST_F32: return DType::F32;
        case HYST_F16: return DType::F16;
        case HYST_BF16: return DType::BF16;
        case HYST_F8_E4M3: return DType::F8_E4M3;
        case HYST_F8_E5M2: return DType::F8_E5M2;
        default: break;
    }
    throw Error(Status::unsupported, "unsupported tensor dtype");
}

// The checkpoint's safetensors files, opened for the duration of the load. A dummy checkpoint (ModelParams::
// dummy_weights) has no files: get() makes a BF16 tensor of the asked shape with no data (F32 for A_log and
// dt_bias), which the loader fills with random values; has() finds only the fused experts' names, so the layout
// the config implies is taken.
struct Checkpoint {
    bool dummy = false;
    std::deque<hyst_tensor> made;        // the dummy tensors (stable addresses)
    mutable std::set<std::string> used;  // the names get() handed out
    std::vector<std::unique_ptr<hyst_file>> files;
    std::map<std::string, const hyst_tensor*> tensors;
    std::map<const hyst_tensor*, std::string> file_of;

    ~Checkpoint() {
        for (auto& f : files) hyst_close(f.get());
    }

    void open_file(const std::string& path) {
        path_present(path);  // (a shard that is a broken link or a loop: named with its target)
        auto f = std::make_unique<hyst_file>();
        int rc = hyst_open(f.get(), path.c_str());
        if (rc != HYST_OK)
            throw Error(rc == HYST_ERR_IO      ? Status::io
                        : rc == HYST_ERR_DTYPE ? Status::unsupported
                                               : Status::format,
                        f->error);
        for (int i = 0; i < f->n_tensors; i++) {
            const hyst_tensor* t = &f->tensors[i];
            if (!tensors.emplace(t->name, t).second)
                throw Error(Status::format,
                            path + ": tensor '" + t->name + "' also appears in " + file_of[tensors[t->name]]);
            file_of[t] = path;
        }
        files.push_back(std::move(f));
    }

    void open(const std::string& dir) {
        std::string single = dir + "/model.safetensors";
        std::string index = dir + "/model.safetensors.index.json";
        if (path_present(single)) {  // (hyst_open refuses anything but a regular file, naming why)
            open_file(single);
            return;
        }
        if (!path_present(index))
            throw Error(Status::io, dir + ": no model.safetensors or model.safetensors.index.json");
        const std::string index_text = read_regular_file(index, kMaxJsonFileBytes);
        const nlohmann::json j = parse_json(index_text, index);
        if (!j.is_object())
            throw Error(Status::format,
                        index + ": must be a JSON object with a 'weight_map', found " + std::string(j.type_name()));
        if (!j.contains("weight_map")) throw Error(Status::format, index + ": field 'weight_map' is missing");
        if (!j["weight_map"].is_object())  // (it read "is missing")
            throw Error(Status::format, index + ": field 'weight_map' must be an object (tensor name -> file), found " +
                                            std::string(j["weight_map"].type_name()));
        std::vector<std::string> shards;
        for (auto& [name, file] : j["weight_map"].items()) {
            if (!file.is_string()) throw Error(Status::format, index + ": weight_map['" + name + "'] is not a string");
            std::string f = file.get<std::string>();
            if (f.find('/') != std::string::npos || f == ".." || f.empty())
                throw Error(Status::format, index + ": weight_map['" + name + "'] names an invalid file '" + f + "'");
            if (std::find(shards.begin(), shards.end(), f) == shards.end()) shards.push_back(f);
        }
        for (const std::string& f : shards) open_file(dir + "/" + f);
        for (auto& [name, file] : j["weight_map"].items()) {
            auto it = tensors.find(name);
            if (it == tensors.end())
                throw Error(Status::model_mismatch, index + ": tensor '" + name + "' is listed for " +
                                                        file.get<std::string>() + " but is not in it");
        }
    }

    bool has(const std::string& name) const {
        if (dummy) return name.ends_with("mlp.experts.gate_up_proj") || name.ends_with("mlp.experts.down_proj");
        return tensors.count(name) > 0;
    }

    const hyst_tensor& get(const std::string& name, const std::vector<int64_t>& shape) const {
        if (dummy) {
            hyst_tensor t{};
            std::snprintf(t.name, sizeof t.name, "%s", name.c_str());
            t.dtype = name.ends_with("A_log") || name.ends_with("dt_bias") ? HYST_F32 : HYST_BF16;
            t.n_dims = int(shape.size());
            for (size_t d = 0; d < shape.size(); d++) t.shape[d] = shape[d];
            return const_cast<std::deque<hyst_tensor>&>(made).emplace_back(t);
        }
        auto it = tensors.find(name);
        if (it == tensors.end())
            throw Error(Status::model_mismatch,
                        "missing tensor '" + name + "' (expected shape " + shape_str(shape) + ")");
        used.insert(name);
        const hyst_tensor* t = it->second;
        std::vector<int64_t> found(t->shape, t->shape + t->n_dims);
        if (found != shape)
            throw Error(Status::model_mismatch,
                        "tensor '" + name + "' has shape " + shape_str(found) + ", expected " + shape_str(shape));
        return *t;
    }
};

}  // namespace

// Builds the arena: a planning pass assigns offsets, then the backend allocates once and the weights are copied in.
// Runs part(0), ..., part(n - 1) on n threads (part(0) on the caller's), then rethrows the first exception one threw.
template <class Part>
void run_parts(int n, Part&& part) {
    std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
    auto guarded = [&](int i) {
        try {
            part(i);
        } catch (...) {
            errors[size_t(i)] = std::current_exception();
        }
    };
    std::vector<std::thread> threads;
    for (int i = 1; i < n; i++) threads.emplace_back(guarded, i);
    guarded(0);
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
}

struct ModelLoader {
    Model& m;
    const Checkpoint& ck;
    Backend& be;
    size_t offset = 0;

    // A tensor (all of it, or the listed rows in that order) converted to `dtype` and copied to arena offset `off`;
    // a dummy one (no data) is filled with random values from `seed`.
    struct Piece {
        const hyst_tensor* src;
        size_t off;
        DType dtype;
        std::vector<int64_t> rows;  // empty: the whole tensor
        uint64_t seed = 0;
    };
    struct MatrixJob {  // after the upload, dst->data = base + off (and dst->scales = base + scale_off for FP8)
        Matrix* dst;
        size_t off;
        size_t scale_off = SIZE_MAX;
    };
    struct VectorJob {      // F32 [n] at off = the tensor converted (an FP8 checkpoint's weight_scale_inv too)
        const float** dst;  // nullptr: nothing to point at it (the block scales of an FP8 matrix)
        const hyst_tensor* src;
        size_t off;
        int64_t n;
    };
    // ModelParams::quant: a 16-bit matrix made of `parts` (as stacked_matrix), quantized on the host segment by
    // segment (quantize_fp8_blocks) into F8_E4M3 data at off and F32 scales at scale_off.
    struct Part {  // (stacked_matrix)
        const hyst_tensor* t;
        std::vector<int64_t> rows;  // empty: every row
        // A compressed-tensors int4 weight (packed_int4_part): t is "<name>.weight_packed" I32 [rows, cols / 8],
        // scale "<name>.weight_scale" [rows, cols / G]; nullptr for a "<name>.weight" tensor.
        const hyst_tensor* scale = nullptr;
    };
    struct QuantJob {
        const Matrix* dst;
        size_t off, scale_off;
        std::vector<Part> parts;
        std::vector<uint64_t> seeds;  // per part (dummy weights)
    };
    std::vector<Piece> pieces;
    std::vector<MatrixJob> matrices;
    std::vector<VectorJob> vectors;
    std::vector<QuantJob> quant_jobs;
    // A compressed-tensors int4 matrix (packed_int4_matrix): its parts' codes and scales repacked into the Q4
    // data at off and the F32 scales at scale_off.
    struct PackedJob {
        const Matrix* dst;
        size_t off, scale_off;
        std::vector<Part> parts;
    };
    std::vector<PackedJob> packed_jobs;
    uint64_t next_seed = 1;  // dummy weights: the seed of the next part, in planning order

    size_t reserve(size_t bytes) {
        size_t o = offset;
        offset += align_up(bytes);
        return o;
    }

    // Which matrices may be FP8: every linear layer but those Qwen's FP8 releases keep in BF16 (the embeddings,
    // lm_head, the Gated DeltaNet's in_proj_a/in_proj_b, the MoE router and shared_expert_gate). `--quant fp8`
    // quantizes exactly the FP8 ones, `--quant int8/int4` the same ones (int_only: lm_head too when
    // ModelParams::quant_lm_head).
    enum class Kind { fp8_ok, int_only, keep_16bit };

    void matrix(Matrix& dst, const std::string& name, int64_t rows, int64_t cols, Kind kind = Kind::fp8_ok) {
        stacked_matrix(dst, name, {weight(name, rows, cols)}, cols, 0, kind);
    }

    // The linear weight `name` ("<module>.weight") of shape [rows, cols], all rows: the tensor itself, or when the
    // checkpoint holds "<module>.weight_packed" instead, its compressed-tensors int4 part (packed_int4_part).
    Part weight(const std::string& name, int64_t rows, int64_t cols) const {
        const std::string module = name.substr(0, name.size() - std::string("weight").size());  // "<module>."
        if (ck.dummy || !name.ends_with(".weight") || !ck.has(module + "weight_packed"))
            return {&ck.get(name, {rows, cols}), {}};
        return packed_int4_part(module, rows, cols);
    }
    bool has_weight(const std::string& name) const {  // "<module>.weight" or its packed form
        return ck.has(name) || (name.ends_with(".weight") && ck.has(name + "_packed"));
    }

    // A compressed-tensors W4A16 weight (format pack-quantized, ModelConfig::int4_packed_weights) of the module
    // with prefix `module` ("<module>."), checked against the real weight's shape [rows, cols]:
    //   <module>.weight_packed  I32 [rows, cols / 8]: column c's code q in [-8, 7] is stored as q + 8 in bits
    //                           4 * (c % 8) .. 4 * (c % 8) + 3 of int32 c / 8 of its row (compressed-tensors'
    //                           pack_to_int32, num_bits 4: element i of a row at bit 4 * i of the row's words)
    //   <module>.weight_scale   BF16, F16 or F32 [rows, cols / G]: the real weight is q * scale[r, c / G]
    //   <module>.weight_shape   I64 (or I32) [2] = [rows, cols]
    // Throws Error naming the tensor: unsupported for a checkpoint whose config.json is not compressed-tensors
    // pack-quantized, zero points (asymmetric), a g_idx (reordered groups), or a group that Q4 cannot hold for these
    // columns (int_quant_shape_ok); model_mismatch for a missing tensor, a wrong dtype or shape, a weight_shape other
    // than [rows, cols] and a module stored both packed and as "<module>.weight".
    Part packed_int4_part(const std::string& module, int64_t rows, int64_t cols) const {
        const ModelConfig& c = m.config_;
        const std::string packed = module + "weight_packed", scale = module + "weight_scale",
                          shape = module + "weight_shape";
        if (!c.int4_packed_weights)
            throw Error(Status::unsupported, "tensor '" + packed +
                                                 "' is a compressed-tensors packed int4 weight, but config.json's "
                                                 "quantization_config is not compressed-tensors pack-quantized");
        if (ck.has(module + "weight"))
            throw Error(Status::model_mismatch,
                        "the checkpoint holds '" + module + "weight' twice: as it is and as '" + packed + "'");
        if (ck.has(module + "weight_zero_point"))
            throw Error(Status::unsupported, "tensor '" + module +
                                                 "weight_zero_point': asymmetric int4 weights (zero points) are not "
                                                 "supported (supported: symmetric, compressed-tensors W4A16)");
        if (ck.has(module + "weight_g_idx"))
            throw Error(Status::unsupported, "tensor '" + module +
                                                 "weight_g_idx': reordered groups (actorder group) are not supported "
                                                 "(supported: groups of consecutive columns)");
        const int64_t G = c.int4_packed_group;
        if (!int_quant_shape_ok(cols, G))
            throw Error(Status::unsupported, "tensor '" + packed + "': groups of " + std::to_string(G) +
                                                 " weights (config.json's group_size) " + "do not fit its " +
                                                 std::to_string(cols) + " input features (Q4 needs a multiple of " +
                                                 std::to_string(cols % kQuantChunk != 0 ? kQuantChunk : G) + ")");
        auto found = [](const hyst_tensor& t) {
            return std::string(hyst_dtype_name(t.dtype)) + " " +
                   shape_str(std::vector<int64_t>(t.shape, t.shape + t.n_dims));
        };
        if (!ck.has(shape))
            throw Error(Status::model_mismatch, "missing tensor '" + shape + "' (expected I64 [2] = [" +
                                                    std::to_string(rows) + ", " + std::to_string(cols) + "])");
        const hyst_tensor& ts = *ck.tensors.at(shape);
        if ((ts.dtype != HYST_I64 && ts.dtype != HYST_I32) || ts.n_dims != 1 || ts.shape[0] != 2)
            throw Error(Status::model_mismatch, "tensor '" + shape + "' is " + found(ts) + ", expected I64 [2]");
        int64_t dims[2];
        for (int i = 0; i < 2; i++) {
            if (ts.dtype == HYST_I64) {
                std::memcpy(&dims[i], static_cast<const char*>(ts.data) + 8 * i, 8);
            } else {
                int32_t d;
                std::memcpy(&d, static_cast<const char*>(ts.data) + 4 * i, 4);
                dims[i] = d;
            }
        }
        if (dims[0] != rows || dims[1] != cols)
            throw Error(Status::model_mismatch, "tensor '" + shape + "' holds [" + std::to_string(dims[0]) + ", " +
                                                    std::to_string(dims[1]) + "], expected [" + std::to_string(rows) +
                                                    ", " + std::to_string(cols) + "]");
        ck.get(shape, {2});  // (marks it used)
        const hyst_tensor& tp = *ck.tensors.at(packed);
        const std::vector<int64_t> packed_shape = {rows, cols / 8};
        if (tp.dtype != HYST_I32 || std::vector<int64_t>(tp.shape, tp.shape + tp.n_dims) != packed_shape)
            throw Error(Status::model_mismatch, "tensor '" + packed + "' is " + found(tp) + ", expected I32 " +
                                                    shape_str(packed_shape) + " (weight_shape [" +
                                                    std::to_string(rows) + ", " + std::to_string(cols) +
                                                    "], 8 int4 codes per int32)");
        const std::vector<int64_t> scale_shape = {rows, cols / G};
        if (!ck.has(scale))
            throw Error(Status::model_mismatch,
                        "missing tensor '" + scale + "' (expected BF16, F16 or F32 " + shape_str(scale_shape) + ")");
        const hyst_tensor& tsc = *ck.tensors.at(scale);
        if ((tsc.dtype != HYST_BF16 && tsc.dtype != HYST_F16 && tsc.dtype != HYST_F32) ||
            std::vector<int64_t>(tsc.shape, tsc.shape + tsc.n_dims) != scale_shape)
            throw Error(Status::model_mismatch, "tensor '" + scale + "' is " + found(tsc) + ", expected BF16, F16 or " +
                                                    "F32 " + shape_str(scale_shape) + " (one scale per " +
                                                    std::to_string(G) + " weights of a row, config.json's group_size)");
        return {&ck.get(packed, packed_shape), {}, &ck.get(scale, scale_shape)};
    }

    // A compressed-tensors int4 matrix: every part packed (packed_int4_part), stored as Q4 with group G, the codes
    // and scales as the checkpoint holds them (upload_packed_int4), nothing requantized.
    void packed_int4_matrix(Matrix& dst, const std::string& what, const std::vector<Part>& parts, int64_t cols,
                            Kind kind) {
        if (m.params_.quant != WeightQuant::none)
            throw Error(Status::invalid_argument,
                        std::string("weight quantization ") + weight_quant_name(m.params_.quant) +
                            " was asked for, but the checkpoint is already int4 (tensor '" + parts[0].t->name +
                            "', compressed-tensors pack-quantized): load it without --quant");
        if (kind == Kind::keep_16bit && &dst == &m.weights_.embed)
            throw Error(Status::unsupported, std::string("tensor '") + parts[0].t->name +
                                                 "': int4 embeddings are not supported (compressed-tensors W4A16 "
                                                 "checkpoints keep them 16-bit)");
        int64_t rows = 0;
        for (const Part& p : parts) {
            if (!p.scale)
                throw Error(Status::unsupported, std::string("tensor '") + p.t->name + "' is " +
                                                     dtype_name(to_dtype(p.t->dtype)) + ", unlike the other parts of " +
                                                     what + " (compressed-tensors int4)");
            rows += p.rows.empty() ? p.t->shape[0] : int64_t(p.rows.size());
        }
        const DType d = be.matrix_dtype(DType::Q4);  // (throws where the backend has no integer kernels)
        if (d != DType::Q4)
            throw Error(Status::unsupported, std::string("Q4 weights are not supported by the ") + be.name() +
                                                 " backend (a compressed-tensors int4 checkpoint)");
        dst.rows = rows;
        dst.cols = cols;
        dst.dtype = DType::Q4;
        dst.group = m.config_.int4_packed_group;
        dst.scale_segment_rows = 0;  // (rows are independent)
        const size_t off = reserve(size_t(rows) * row_bytes(DType::Q4, cols));
        const size_t scale_off = reserve(size_t(rows * (cols / dst.group)) * 4);
        matrices.push_back({&dst, off, scale_off});
        packed_jobs.push_back({&dst, off, scale_off, parts});
    }

    static int64_t part_rows(const Part& p, int64_t cols) {  // (a whole 3-D tensor [E, R, cols] gives E * R rows)
        if (!p.rows.empty()) return int64_t(p.rows.size());
        int64_t n = 1;
        for (int d = 0; d < p.t->n_dims; d++) n *= p.t->shape[d];
        return n / cols;
    }
    // The FP8 checkpoint's scale tensor of weight `t`: "<name>_scale_inv", F32 (or 16-bit) [ceil(rows/128),
    // ceil(cols/128)] for t [rows, cols] (the real weight is fp8 value * scale, despite the name).
    // A per-tensor scale (one value: vLLM's FP8 layout when quantization_config has no weight_block_size, the scale
    // named "<name>_scale") is refused naming the tensor and the field; when weight_block_size is absent the block
    // scales' shape is what shows the 128 x 128 blocks (transformers' default).
    const hyst_tensor& fp8_scales(const hyst_tensor& t, int64_t rows, int64_t cols) const {
        const std::string name = std::string(t.name) + "_scale_inv", per_tensor = std::string(t.name) + "_scale";
        const std::vector<int64_t> shape = {fp8_scale_rows(rows, 0), fp8_scale_cols(cols)};
        auto refuse_per_tensor = [&](const std::string& scale) {
            return Error(Status::unsupported,
                         std::string("tensor '") + t.name + "' has a single per-tensor scale '" + scale + "'" +
                             (m.config_.fp8_weights && !m.config_.fp8_block_size_given
                                  ? " (config.json's quantization_config has no weight_block_size)"
                                  : "") +
                             ": only block-wise FP8 is supported (weight_block_size [128, 128], block scales '" + name +
                             "' " + shape_str(shape) + ")");
        };
        auto elements = [](const hyst_tensor& x) {
            int64_t n = 1;
            for (int d = 0; d < x.n_dims; d++) n *= x.shape[d];
            return n;
        };
        if (!ck.has(name)) {
            if (ck.has(per_tensor) && elements(*ck.tensors.at(per_tensor)) == 1) throw refuse_per_tensor(per_tensor);
            throw Error(Status::model_mismatch, std::string("tensor '") + t.name + "' is " +
                                                    dtype_name(to_dtype(t.dtype)) + " but its block scales '" + name +
                                                    "' are missing (an FP8 weight needs F32 scales " +
                                                    shape_str(shape) + ")");
        }
        if (const hyst_tensor* x = ck.tensors.at(name); elements(*x) == 1 && shape != std::vector<int64_t>{1, 1})
            throw refuse_per_tensor(name);
        const hyst_tensor& s = ck.get(name, shape);
        if (is_fp8(to_dtype(s.dtype)))
            throw Error(Status::model_mismatch, "tensor '" + name +
                                                    "' holds block scales and must be F32 (or 16-bit), not " +
                                                    dtype_name(to_dtype(s.dtype)));
        return s;
    }

    // The backend's storage for an FP8 matrix: FP8 as it is (Backend::matrix_dtype throws where a backend has no
    // kernels for a type; one that would convert it to another dtype is refused here).
    DType fp8_dtype(DType type) const {
        const DType d = be.matrix_dtype(type);
        if (d != type)
            throw Error(Status::unsupported, std::string("FP8 weights are not supported by the ") + be.name() +
                                                 " backend (it would store them as " + dtype_name(d) + ")");
        return d;
    }

    // An FP8 checkpoint's matrix: the parts are whole 2-D FP8 tensors of the same dtype and, when more than one,
    // of the same rows (one scale segment each: a MoE layer's per-expert tensors), copied as they are with their
    // block scales.
    void fp8_matrix(Matrix& dst, const std::string& what, const std::vector<Part>& parts, int64_t cols, Kind kind) {
        const DType type = to_dtype(parts[0].t->dtype);
        if (m.params_.quant != WeightQuant::none)
            throw Error(Status::invalid_argument,
                        std::string("weight quantization ") + weight_quant_name(m.params_.quant) +
                            " was asked for, but the checkpoint is already FP8 (tensor '" + parts[0].t->name + "' is " +
                            dtype_name(type) + "): load it without --quant");
        if (kind == Kind::keep_16bit && &dst == &m.weights_.embed)
            throw Error(Status::unsupported, std::string("tensor '") + parts[0].t->name + "' is " + dtype_name(type) +
                                                 ": FP8 embeddings are not supported (Qwen's FP8 releases keep them "
                                                 "in BF16)");
        // (config.json's fmt and the tensors' dtype agree: a mismatch is a mislabelled or damaged checkpoint)
        if (const ModelConfig& c = m.config_; c.fp8_weights && type != c.fp8_fmt)
            throw Error(Status::model_mismatch,
                        std::string("tensor '") + parts[0].t->name + "': expected " + dtype_name(c.fp8_fmt) +
                            " (config.json's quantization_config " +
                            (c.fp8_fmt_given ? std::string("fmt ") + (c.fp8_fmt == DType::F8_E5M2 ? "e5m2" : "e4m3")
                                             : std::string("gives no fmt: e4m3")) +
                            "), found " + dtype_name(type));
        const int64_t part_rows0 = parts[0].t->n_dims == 2 ? parts[0].t->shape[0] : 0;
        for (const Part& p : parts) {
            if (to_dtype(p.t->dtype) != type)
                throw Error(Status::unsupported, std::string("tensor '") + p.t->name + "' is " +
                                                     dtype_name(to_dtype(p.t->dtype)) + ", unlike the other parts of " +
                                                     what + " (" + dtype_name(type) + ")");
            if (!p.rows.empty() || p.t->n_dims != 2)
                throw Error(Status::unsupported,
                            std::string("tensor '") + p.t->name + "' is " + dtype_name(type) +
                                (p.t->n_dims != 2 ? " with " + std::to_string(p.t->n_dims) + " dims"
                                                  : " and its rows would be reordered at load (" + what + ")") +
                                ": FP8 weights are supported as 2-D tensors loaded as they are (the layout of Qwen's "
                                "FP8 releases, per-expert tensors for MoE layers)");
            if (p.t->shape[0] != part_rows0)
                throw Error(Status::model_mismatch,
                            std::string("tensor '") + p.t->name + "' has " + std::to_string(p.t->shape[0]) +
                                " rows, unlike the other parts of " + what + " (" + std::to_string(part_rows0) + ")");
        }
        const int64_t rows = part_rows0 * int64_t(parts.size());
        dst.rows = rows;
        dst.cols = cols;
        dst.dtype = fp8_dtype(type);
        dst.scale_segment_rows = parts.size() > 1 ? part_rows0 : 0;
        size_t off = reserve(size_t(rows * cols));
        const int64_t part_scales = fp8_scale_rows(part_rows0, 0) * fp8_scale_cols(cols);
        size_t scale_off = reserve(size_t(fp8_scale_rows(rows, dst.scale_segment_rows) * fp8_scale_cols(cols)) * 4);
        matrices.push_back({&dst, off, scale_off});
        for (const Part& p : parts) {
            pieces.push_back({p.t, off, type, {}, next_seed++});
            off += size_t(part_rows0 * cols);
            vectors.push_back({nullptr, &fp8_scales(*p.t, part_rows0, cols), scale_off, part_scales});
            scale_off += size_t(part_scales) * 4;
        }
    }

    // dst [sum of the lists' lengths, cols] = the listed rows of each (tensor, rows) part, in order (a fused tensor
    // split, reordered or several tensors stacked); every part must convert to the same matrix dtype.
    // `segment_rows`: the rows of one scale segment should the matrix be stored as FP8 (0: the whole matrix).
    void stacked_matrix(Matrix& dst, const std::string& what, const std::vector<Part>& parts, int64_t cols,
                        int64_t segment_rows = 0, Kind kind = Kind::fp8_ok) {
        if (parts[0].scale) return packed_int4_matrix(dst, what, parts, cols, kind);
        for (const Part& p : parts)
            if (p.scale)
                throw Error(Status::unsupported, std::string("tensor '") + p.t->name +
                                                     "' is compressed-tensors int4, unlike the other parts of " + what +
                                                     " (" + dtype_name(to_dtype(parts[0].t->dtype)) + ")");
        for (const Part& p : parts) not_integer(*p.t);
        if (is_fp8(to_dtype(parts[0].t->dtype))) return fp8_matrix(dst, what, parts, cols, kind);
        int64_t rows = 0;
        for (const Part& p : parts)
            if (is_fp8(to_dtype(p.t->dtype)))
                throw Error(Status::unsupported, std::string("tensor '") + p.t->name + "' is " +
                                                     dtype_name(to_dtype(p.t->dtype)) + ", unlike the other parts of " +
                                                     what + " (" + dtype_name(to_dtype(parts[0].t->dtype)) + ")");
        const WeightQuant quant = m.params_.quant;
        if ((quant == WeightQuant::int8 || quant == WeightQuant::int4) && kind != Kind::keep_16bit) {
            for (const Part& p : parts) rows += part_rows(p, cols);
            const int64_t group = weight_quant_group(quant, m.params_.quant_group);
            if (!int_quant_shape_ok(cols, group))
                throw Error(
                    Status::invalid_argument,
                    std::string("weight quantization ") + weight_quant_name(quant) + " with groups of " +
                        std::to_string(group) + " weights does not fit " + what + ": its " + std::to_string(cols) +
                        " input features are not a multiple of " +
                        std::to_string(cols % kQuantChunk != 0 ? kQuantChunk : group) +
                        (cols % kQuantChunk != 0
                             ? " (the integer layouts' chunk, so no group size fits; --quant fp8 takes any shape)"
                             : " (choose a group size dividing them, e.g. " + std::string(weight_quant_name(quant)) +
                                   ":64)"));
            const DType type = int_quant_dtype(quant);
            const DType d = be.matrix_dtype(type);  // (throws where the backend has no integer kernels)
            if (d != type)
                throw Error(Status::unsupported, std::string(dtype_name(type)) + " weights are not supported by the " +
                                                     be.name() + " backend");
            dst.rows = rows;
            dst.cols = cols;
            dst.dtype = type;
            dst.group = group;
            dst.scale_segment_rows = 0;  // (rows are independent)
            const size_t off = reserve(size_t(rows) * row_bytes(type, cols));
            const size_t scale_off = reserve(size_t(rows * (cols / group)) * 4);
            matrices.push_back({&dst, off, scale_off});
            QuantJob job{&dst, off, scale_off, parts, {}};
            for (size_t i = 0; i < parts.size(); i++) job.seeds.push_back(next_seed++);
            quant_jobs.push_back(std::move(job));
            return;
        }
        if (quant == WeightQuant::fp8 && kind == Kind::fp8_ok) {
            for (const Part& p : parts) rows += part_rows(p, cols);
            dst.rows = rows;
            dst.cols = cols;
            dst.dtype = fp8_dtype(DType::F8_E4M3);
            dst.scale_segment_rows = segment_rows;
            const size_t off = reserve(size_t(rows * cols));
            const size_t scale_off = reserve(size_t(fp8_scale_rows(rows, segment_rows) * fp8_scale_cols(cols)) * 4);
            matrices.push_back({&dst, off, scale_off});
            QuantJob job{&dst, off, scale_off, parts, {}};
            for (size_t i = 0; i < parts.size(); i++) job.seeds.push_back(next_seed++);
            quant_jobs.push_back(std::move(job));
            return;
        }
        dst.dtype = be.matrix_dtype(to_dtype(parts[0].t->dtype));
        for (const Part& p : parts) {
            if (be.matrix_dtype(to_dtype(p.t->dtype)) != dst.dtype)
                throw Error(Status::unsupported, std::string("tensor '") + p.t->name + "' is " +
                                                     dtype_name(to_dtype(p.t->dtype)) + ", unlike the other parts of " +
                                                     what + " (" + dtype_name(to_dtype(parts[0].t->dtype)) + ")");
            rows += part_rows(p, cols);
        }
        dst.rows = rows;
        dst.cols = cols;
        const size_t es = dtype_size(dst.dtype);
        size_t off = reserve(size_t(rows * cols) * es);
        matrices.push_back({&dst, off});
        for (const Part& p : parts) {
            pieces.push_back({p.t, off, dst.dtype, p.rows, next_seed++});
            off += size_t(part_rows(p, cols) * cols) * es;
        }
    }

    // Integer tensors are only compressed-tensors' weight_packed and weight_shape: anywhere else, Error(unsupported)
    // naming the tensor.
    static void not_integer(const hyst_tensor& t) {
        if (t.dtype == HYST_I32 || t.dtype == HYST_I64)
            throw Error(Status::unsupported, std::string("tensor '") + t.name + "' is " + hyst_dtype_name(t.dtype) +
                                                 " (integer tensors are read only as compressed-tensors' "
                                                 "weight_packed and weight_shape)");
    }

    void vector(const float*& dst, const std::string& name, const std::vector<int64_t>& shape) {
        const hyst_tensor& t = ck.get(name, shape);
        not_integer(t);
        if (is_fp8(to_dtype(t.dtype)))
            throw Error(Status::unsupported, "tensor '" + name + "' is " + dtype_name(to_dtype(t.dtype)) +
                                                 ": only linear weights may be FP8 (norms, conv1d, A_log and dt_bias "
                                                 "stay 16-bit or F32)");
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        vectors.push_back({&dst, &t, reserve(size_t(n) * 4), n});
    }

    // Qwen3-Next's fused Gated DeltaNet input projections (docs/QWEN35.md; transformers'
    // fix_query_key_value_ordering): in_proj_qkvz holds per key head g the rows [q_g | k_g | v of its Hv/Hk value
    // heads | z of them], in_proj_ba per key head [b of its value heads | a of them]. Reordered at load into the
    // separate [q | k | v], z, b and a matrices of the Qwen3.5 layout.
    void fused_gdn_in_proj(GatedDeltaNetWeights& g, const std::string& gp) {
        const ModelConfig& c = m.config_;
        const int64_t H = c.hidden_size, Hk = c.gdn_k_heads, Hv = c.gdn_v_heads, Dk = c.gdn_k_dim, Dv = c.gdn_v_dim;
        const int64_t r = Hv / Hk, G = 2 * Dk + 2 * r * Dv;
        const Part qkvz = weight(gp + "in_proj_qkvz.weight", Hk * G, H);  // (int4 packed rows reorder as they are)
        const Part ba = weight(gp + "in_proj_ba.weight", 2 * Hv, H);
        std::vector<int64_t> q, k, v, z, b, a;
        for (int64_t grp = 0; grp < Hk; grp++) {
            const int64_t base = grp * G;
            for (int64_t i = 0; i < Dk; i++) q.push_back(base + i);
            for (int64_t i = 0; i < Dk; i++) k.push_back(base + Dk + i);
            for (int64_t i = 0; i < r * Dv; i++) v.push_back(base + 2 * Dk + i);
            for (int64_t i = 0; i < r * Dv; i++) z.push_back(base + 2 * Dk + r * Dv + i);
            for (int64_t i = 0; i < r; i++) b.push_back(grp * 2 * r + i);
            for (int64_t i = 0; i < r; i++) a.push_back(grp * 2 * r + r + i);
        }
        auto rows = [](const Part& p, std::vector<int64_t> r) { return Part{p.t, std::move(r), p.scale}; };
        stacked_matrix(g.in_proj_qkv, gp + "in_proj_qkvz", {rows(qkvz, q), rows(qkvz, k), rows(qkvz, v)}, H);
        stacked_matrix(g.in_proj_z, gp + "in_proj_qkvz", {rows(qkvz, z)}, H);
        stacked_matrix(g.in_proj_b, gp + "in_proj_ba", {rows(ba, b)}, H, 0, Kind::keep_16bit);
        stacked_matrix(g.in_proj_a, gp + "in_proj_ba", {rows(ba, a)}, H, 0, Kind::keep_16bit);
    }

    // A sparse MoE block: the router, the routed experts (fused 3-D tensors as transformers 5 saves them, or one
    // tensor per expert as the official FP8 releases store them), the shared expert and its gate.
    void moe_block(MoeWeights& w, const std::string& mp, int layer) {
        const ModelConfig& c = m.config_;
        const int64_t H = c.hidden_size, E = c.n_experts, I = c.moe_intermediate_size;
        const std::string where = "layer " + std::to_string(layer) + ": ";
        if (!ck.has(mp + "gate.weight") && ck.has(mp + "gate_proj.weight"))
            throw Error(Status::model_mismatch,
                        where + "config.json describes a mixture-of-experts block (model_type " + c.model_type +
                            ", num_experts " + std::to_string(E) + ") but the checkpoint holds a dense MLP ('" + mp +
                            "gate_proj.weight')");
        matrix(w.router, mp + "gate.weight", E, H, Kind::keep_16bit);
        w.experts.n_experts = int(E);
        w.experts.intermediate = int(I);
        const std::string xp = mp + "experts.";
        if (ck.has(xp + "gate_up_proj") && has_weight(xp + "0.gate_proj.weight"))
            throw Error(Status::model_mismatch, where + "the checkpoint holds the experts twice, fused ('" + xp +
                                                    "gate_up_proj') and one tensor per expert ('" + xp +
                                                    "0.gate_proj.weight')");
        if (ck.has(xp + "gate_up_proj")) {
            stacked_matrix(w.experts.gate_up, xp + "gate_up_proj", {{&ck.get(xp + "gate_up_proj", {E, 2 * I, H}), {}}},
                           H, I);
            stacked_matrix(w.experts.down, xp + "down_proj", {{&ck.get(xp + "down_proj", {E, H, I}), {}}}, I, H);
        } else if (has_weight(xp + "0.gate_proj.weight")) {
            std::vector<Part> gate_up, down;
            for (int64_t e = 0; e < E; e++) {
                const std::string ep = xp + std::to_string(e) + ".";
                for (const char* part : {"gate_proj", "up_proj", "down_proj"})
                    if (!has_weight(ep + part + ".weight"))
                        throw Error(Status::model_mismatch, where + "expert " + std::to_string(e) + " of " +
                                                                std::to_string(E) + " is missing: no tensor '" + ep +
                                                                part + ".weight'");
                gate_up.push_back(weight(ep + "gate_proj.weight", I, H));
                gate_up.push_back(weight(ep + "up_proj.weight", I, H));
                down.push_back(weight(ep + "down_proj.weight", H, I));
            }
            if (has_weight(xp + std::to_string(E) + ".gate_proj.weight"))
                throw Error(Status::model_mismatch, where + "the checkpoint holds more experts than num_experts " +
                                                        std::to_string(E) + " ('" + xp + std::to_string(E) +
                                                        ".gate_proj.weight')");
            stacked_matrix(w.experts.gate_up, xp + "*.gate_proj/up_proj", gate_up, H, I);
            stacked_matrix(w.experts.down, xp + "*.down_proj", down, I, H);
        } else {
            throw Error(Status::model_mismatch,
                        where + "no experts: expected '" + xp + "gate_up_proj' or '" + xp + "0.gate_proj.weight'");
        }
        const int64_t S = c.shared_expert_intermediate_size;
        if (S == 0 && ck.has(mp + "shared_expert.gate_proj.weight"))
            throw Error(Status::model_mismatch, where + "the checkpoint holds a shared expert ('" + mp +
                                                    "shared_expert.gate_proj.weight') but config.json's "
                                                    "shared_expert_intermediate_size is 0");
        if (S > 0) {
            if (ck.has(mp + "shared_expert.gate_proj.weight")) {  // (name where S comes from: it may be a default)
                const hyst_tensor& g = *ck.tensors.at(mp + "shared_expert.gate_proj.weight");
                if (g.n_dims != 2 || g.shape[0] != S || g.shape[1] != H)
                    throw Error(Status::model_mismatch,
                                "tensor '" + mp + "shared_expert.gate_proj.weight' has shape " +
                                    shape_str(std::vector<int64_t>(g.shape, g.shape + g.n_dims)) + ", expected [" +
                                    std::to_string(S) + ", " + std::to_string(H) +
                                    "] from config.json's shared_expert_intermediate_size (transformers' default 512 "
                                    "when the field is absent)");
            }
            matrix(w.shared.gate_proj, mp + "shared_expert.gate_proj.weight", S, H);
            matrix(w.shared.up_proj, mp + "shared_expert.up_proj.weight", S, H);
            matrix(w.shared.down_proj, mp + "shared_expert.down_proj.weight", H, S);
            matrix(w.shared.gate, mp + "shared_expert_gate.weight", 1, H, Kind::keep_16bit);
        }
    }

    void plan_weights() {
        const ModelConfig& c = m.config_;
        const std::string& p = c.tensor_prefix;
        const int64_t H = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
        const int64_t Hq = c.n_heads, Hkv = c.n_kv_heads, Hv = c.gdn_v_heads, Dv = c.gdn_v_dim;
        const int64_t C = c.gdn_conv_channels(), K = c.conv_kernel;
        Weights& w = m.weights_;
        matrix(w.embed, p + "embed_tokens.weight", c.vocab_size, H, Kind::keep_16bit);
        vector(w.final_norm, p + "norm.weight", {H});
        const bool int_quant = m.params_.quant == WeightQuant::int8 || m.params_.quant == WeightQuant::int4;
        const Kind lm_head = int_quant && m.params_.quant_lm_head ? Kind::int_only : Kind::keep_16bit;
        if (!c.tie_word_embeddings)
            matrix(w.output, "lm_head.weight", c.vocab_size, H, lm_head);
        else if (lm_head == Kind::int_only)  // a quantized copy of the embeddings (which stay 16-bit)
            matrix(w.output, p + "embed_tokens.weight", c.vocab_size, H, lm_head);
        // (else tied: output = embed, set after the upload)
        w.layers.resize(size_t(c.n_layers));
        int n_attn = 0, n_gdn = 0;
        for (int i = 0; i < c.n_layers; i++) {
            LayerWeights& L = w.layers[size_t(i)];
            std::string lp = p + "layers." + std::to_string(i) + ".";
            L.kind = c.layer_kinds[size_t(i)];
            vector(L.input_norm, lp + "input_layernorm.weight", {H});
            vector(L.post_norm, lp + "post_attention_layernorm.weight", {H});
            if (L.kind == LayerKind::full_attention) {
                L.state_index = n_attn++;
                std::string ap = lp + "self_attn.";
                matrix(L.attn.q_proj, ap + "q_proj.weight", Hq * 2 * D, H);
                matrix(L.attn.k_proj, ap + "k_proj.weight", Hkv * D, H);
                matrix(L.attn.v_proj, ap + "v_proj.weight", Hkv * D, H);
                matrix(L.attn.o_proj, ap + "o_proj.weight", H, Hq * D);
                vector(L.attn.q_norm, ap + "q_norm.weight", {D});
                vector(L.attn.k_norm, ap + "k_norm.weight", {D});
            } else {
                L.state_index = n_gdn++;
                std::string gp = lp + "linear_attn.";
                if (c.gdn_fused_in_proj) {
                    fused_gdn_in_proj(L.gdn, gp);
                } else {
                    matrix(L.gdn.in_proj_qkv, gp + "in_proj_qkv.weight", C, H);
                    matrix(L.gdn.in_proj_z, gp + "in_proj_z.weight", Hv * Dv, H);
                    matrix(L.gdn.in_proj_b, gp + "in_proj_b.weight", Hv, H, Kind::keep_16bit);
                    matrix(L.gdn.in_proj_a, gp + "in_proj_a.weight", Hv, H, Kind::keep_16bit);
                }
                matrix(L.gdn.out_proj, gp + "out_proj.weight", H, Hv * Dv);
                vector(L.gdn.conv1d, gp + "conv1d.weight", {C, 1, K});
                vector(L.gdn.A_log, gp + "A_log", {Hv});
                vector(L.gdn.dt_bias, gp + "dt_bias", {Hv});
                vector(L.gdn.norm, gp + "norm.weight", {Dv});
            }
            std::string mp = lp + "mlp.";
            L.moe = c.layer_is_moe[size_t(i)] != 0;
            if (L.moe) {
                moe_block(L.moe_block, mp, i);
                continue;
            }
            if (!ck.dummy && !ck.has(mp + "gate_proj.weight") &&
                (ck.has(mp + "gate.weight") || ck.has(mp + "experts.gate_up_proj")))
                throw Error(Status::model_mismatch,
                            "layer " + std::to_string(i) + ": the checkpoint holds a mixture-of-experts block ('" + mp +
                                (ck.has(mp + "gate.weight") ? "gate.weight" : "experts.gate_up_proj") +
                                "') but config.json describes a dense MLP (model_type " + c.model_type +
                                (c.has_moe() ? ": mlp_only_layers and decoder_sparse_step make this layer dense" : "") +
                                ")");
            matrix(L.mlp.gate_proj, mp + "gate_proj.weight", F, H);
            matrix(L.mlp.up_proj, mp + "up_proj.weight", F, H);
            matrix(L.mlp.down_proj, mp + "down_proj.weight", H, F);
        }
    }

    // A dummy checkpoint's small vectors: what a trained model's are near (zero-centred norms 0, the gated norm 1,
    // A = e^0.5, dt_bias 1), the conv taps uniform in +-0.25.
    static void dummy_vector(const std::string& name, std::vector<float>& v) {
        float value = 0.0f;
        if (name.ends_with("A_log")) value = 0.5f;
        if (name.ends_with("dt_bias") || name.ends_with("linear_attn.norm.weight")) value = 1.0f;
        for (size_t i = 0; i < v.size(); i++)
            v[i] = name.ends_with("conv1d.weight") ? -0.25f + 0.5f * random_unit(7, i) : value;
    }

    // Rows [r0, r0 + n) of the matrix made of `parts` (QuantJob) as f32 into out [n, cols]: converted from the
    // checkpoint, or for dummy weights the values fill_random gives a BF16 matrix (so `--quant fp8` quantizes what a
    // 16-bit dummy model holds).
    static void read_rows(const QuantJob& job, int64_t cols, int64_t r0, int64_t n, float* out) {
        int64_t first = 0;  // the matrix row of the part's first row
        for (size_t i = 0; i < job.parts.size() && n > 0; i++) {
            const Part& p = job.parts[i];
            const int64_t pr = part_rows(p, cols);
            for (int64_t r = std::max(r0, first); r < std::min(r0 + n, first + pr); r++) {
                const int64_t src_row = p.rows.empty() ? r - first : p.rows[size_t(r - first)];
                float* dst = out + (r - r0) * cols;
                if (!p.t->data) {
                    for (int64_t c = 0; c < cols; c++)
                        dst[c] = bf16_to_f32(
                            f32_to_bf16(-0.035f + 0.07f * random_unit(job.seeds[i], uint64_t((r - first) * cols + c))));
                    continue;
                }
                const DType st = to_dtype(p.t->dtype);
                convert_to_f32(static_cast<const char*>(p.t->data) + size_t(src_row * cols) * dtype_size(st), st, dst,
                               size_t(cols));
            }
            first += pr;
        }
    }

    // Quantizes a QuantJob's Q8/Q4 matrix (quantize_int_groups) in runs of rows and uploads its codes and scales.
    void upload_int_quantized(char* base, const QuantJob& job) {
        const Matrix& d = *job.dst;
        const int64_t n_groups = d.cols / d.group;
        // Runs of at most 2^24 weights (64 MiB of F32 at a time), rows split among host threads.
        const int64_t run = std::max<int64_t>(1, std::min<int64_t>(d.rows, (int64_t(1) << 24) / d.cols));
        const int n_threads = int(std::min<int64_t>(
            run,
            std::max(1, m.params_.n_threads > 0 ? m.params_.n_threads : int(std::thread::hardware_concurrency()))));
        std::vector<float> w(size_t(run * d.cols)), scales(size_t(run * n_groups));
        std::vector<uint8_t> q(size_t(run) * row_bytes(d.dtype, d.cols));
        for (int64_t r0 = 0; r0 < d.rows; r0 += run) {
            const int64_t n = std::min(run, d.rows - r0);
            auto part = [&](int i) {
                const int64_t a = n * i / n_threads, b = n * (i + 1) / n_threads;
                read_rows(job, d.cols, r0 + a, b - a, w.data() + a * d.cols);
                quantize_int_groups(w.data() + a * d.cols, b - a, d.cols, d.group, d.dtype,
                                    q.data() + size_t(a) * row_bytes(d.dtype, d.cols), scales.data() + a * n_groups);
            };
            run_parts(n_threads, part);
            be.upload(base + job.off + size_t(r0) * row_bytes(d.dtype, d.cols), q.data(),
                      size_t(n) * row_bytes(d.dtype, d.cols));
            be.upload(base + job.scale_off + size_t(r0 * n_groups) * 4, scales.data(), size_t(n * n_groups) * 4);
        }
    }

    // Quantizes a QuantJob's matrix and uploads its FP8 data and scales, in runs of whole segments (at least one,
    // about 2^24 weights: a 35B-A3B expert segment is 512 x 2048, so a run holds 16 of them). A segment's
    // 128-row blocks are independent; host threads take runs of (segment, block row) pairs, so an MoE matrix of
    // many small segments uses every thread (one segment at a time gave 4 threads and took 137 s for 35B-A3B's
    // dummy weights, thirty-fourth session).
    void upload_quantized(char* base, const QuantJob& job) {
        const Matrix& d = *job.dst;
        if (is_int_quant(d.dtype)) return upload_int_quantized(base, job);
        const int64_t seg = d.scale_segment_rows > 0 ? d.scale_segment_rows : d.rows, sc = fp8_scale_cols(d.cols);
        const int64_t seg_blocks = fp8_scale_rows(seg, 0);  // block rows of a segment
        // (no more segments than the matrix has: a small matrix gets buffers of its own size, not of 2^24 weights)
        const int64_t run_segs =
            std::min(std::max<int64_t>(1, ((int64_t(1) << 24) / d.cols) / seg), (d.rows + seg - 1) / seg);
        std::vector<float> w(size_t(run_segs * seg * d.cols)), scales(size_t(run_segs * seg_blocks * sc));
        std::vector<uint8_t> q(size_t(run_segs * seg * d.cols));
        const int max_threads =
            std::max(1, m.params_.n_threads > 0 ? m.params_.n_threads : int(std::thread::hardware_concurrency()));
        for (int64_t r0 = 0; r0 < d.rows; r0 += run_segs * seg) {
            const int64_t rows = std::min(run_segs * seg, d.rows - r0);
            const int64_t n_segs = (rows + seg - 1) / seg, items = n_segs * seg_blocks;
            const int n_threads = int(std::min<int64_t>(items, max_threads));
            auto part = [&](int i) {
                for (int64_t it = items * i / n_threads; it < items * (i + 1) / n_threads; it++) {
                    const int64_t s = it / seg_blocks, b = it % seg_blocks;
                    const int64_t a = s * seg + b * kFp8Block;  // the block row's first row in the run
                    const int64_t n = std::min({kFp8Block, seg - b * kFp8Block, rows - a});
                    if (n <= 0) continue;
                    read_rows(job, d.cols, r0 + a, n, w.data() + a * d.cols);
                    quantize_fp8_blocks(w.data() + a * d.cols, n, d.cols, 0, q.data() + a * d.cols,
                                        scales.data() + it * sc);
                }
            };
            run_parts(n_threads, part);
            be.upload(base + job.off + size_t(r0 * d.cols), q.data(), size_t(rows * d.cols));
            be.upload(base + job.scale_off + size_t(fp8_scale_row(r0, d.scale_segment_rows) * sc) * 4, scales.data(),
                      size_t(fp8_scale_rows(rows, seg) * sc) * 4);
        }
    }

    // Repacks a PackedJob's compressed-tensors int4 rows into Q4 (kernels/backend.h: byte i of each 64-column chunk
    // holds column i in its low nibble and column 32 + i in its high one, as q + 8) and converts the scales to F32
    // (exact from BF16 / F16), so each dequantized weight q * scale is the checkpoint's exactly. Runs of at most
    // 2^24 weights. A scale that is not finite is Error(format) naming the tensor, row and group.
    void upload_packed_int4(char* base, const PackedJob& job) {
        const Matrix& d = *job.dst;
        const int64_t n_groups = d.cols / d.group, words = d.cols / 8;
        const size_t rb = row_bytes(DType::Q4, d.cols);
        const int64_t run = std::max<int64_t>(1, std::min<int64_t>(d.rows, (int64_t(1) << 24) / d.cols));
        std::vector<uint8_t> q(size_t(run) * rb);
        std::vector<float> scales(size_t(run * n_groups));
        std::vector<uint32_t> w(static_cast<size_t>(words));
        int64_t r = 0, r0 = 0;  // matrix row; first row of the run
        auto flush = [&] {
            be.upload(base + job.off + size_t(r0) * rb, q.data(), size_t(r - r0) * rb);
            be.upload(base + job.scale_off + size_t(r0 * n_groups) * 4, scales.data(), size_t((r - r0) * n_groups) * 4);
            r0 = r;
        };
        for (const Part& p : job.parts) {
            const int64_t n = p.rows.empty() ? p.t->shape[0] : int64_t(p.rows.size());
            const DType st = to_dtype(p.scale->dtype);
            for (int64_t i = 0; i < n; i++) {
                const int64_t src = p.rows.empty() ? i : p.rows[size_t(i)];
                std::memcpy(w.data(), static_cast<const char*>(p.t->data) + size_t(src * words) * 4, size_t(words) * 4);
                uint8_t* qr = q.data() + size_t(r - r0) * rb;
                auto nibble = [&](int64_t c) { return uint8_t((w[size_t(c / 8)] >> (4 * (c % 8))) & 0xf); };
                for (int64_t c0 = 0; c0 < d.cols; c0 += kQuantChunk)
                    for (int64_t j = 0; j < kQuantChunk / 2; j++)
                        qr[c0 / 2 + j] = uint8_t(nibble(c0 + j) | nibble(c0 + kQuantChunk / 2 + j) << 4);
                float* sr = scales.data() + (r - r0) * n_groups;
                convert_to_f32(static_cast<const char*>(p.scale->data) + size_t(src * n_groups) * dtype_size(st), st,
                               sr, size_t(n_groups));
                for (int64_t g = 0; g < n_groups; g++)
                    if (!std::isfinite(sr[g]))
                        throw Error(Status::format, std::string("tensor '") + p.scale->name + "': the scale of row " +
                                                        std::to_string(src) + ", group " + std::to_string(g) + " is " +
                                                        std::to_string(sr[g]) + " (int4 scales must be finite)");
                if (++r - r0 == run) flush();
            }
        }
        if (r > r0) flush();
    }

    // A piece's columns (the product of its tensor's dims after the first) and the elements of the arena it fills
    // (its rows, or the rows it picks, times the columns).
    static size_t piece_cols(const Piece& p) {
        size_t cols = 1;
        for (int d = 1; d < p.src->n_dims; d++) cols *= size_t(p.src->shape[d]);
        return cols;
    }
    static size_t piece_elements(const Piece& p) {
        return (p.rows.empty() ? size_t(p.src->shape[0]) : p.rows.size()) * piece_cols(p);
    }

    // Copies (converting where the dtypes differ) or fills (dummy weights) one piece into the arena.
    void upload_piece(char* base, const Piece& p, std::vector<float>& tmp, std::vector<uint16_t>& half) {
        const size_t n = piece_elements(p);
        if (!p.src->data) {  // dummy weights: uniform in +-0.035 (standard deviation 0.02, as HF's initializer)
            be.fill_random(base + p.off, n, p.dtype, -0.035f, 0.035f, p.seed);
            return;
        }
        const size_t cols = piece_cols(p);
        const DType src_type = to_dtype(p.src->dtype);
        const size_t ss = dtype_size(src_type);
        // the source bytes in destination order
        const char* src = static_cast<const char*>(p.src->data);
        std::vector<char> gathered;
        if (!p.rows.empty()) {
            gathered.resize(n * ss);
            for (size_t r = 0; r < p.rows.size(); r++)
                std::memcpy(gathered.data() + r * cols * ss, src + size_t(p.rows[r]) * cols * ss, cols * ss);
            src = gathered.data();
        }
        void* dst = base + p.off;
        if (src_type == p.dtype) return be.upload(dst, src, n * ss);
        tmp.resize(n);
        convert_to_f32(src, src_type, tmp.data(), n);
        if (p.dtype == DType::F32) {
            be.upload(dst, tmp.data(), n * 4);
        } else if (p.dtype == DType::BF16) {
            half.resize(n);
            for (size_t i = 0; i < n; i++) half[i] = f32_to_bf16(tmp[i]);
            be.upload(dst, half.data(), n * 2);
        } else {
            throw Error(Status::internal, "no conversion to the backend's matrix dtype");
        }
    }

    void upload_weights(char* base) {
        std::vector<float> tmp;
        std::vector<uint16_t> half;
        // progress by weight count: quantized matrices, packed ones and plain pieces (the vectors are negligible)
        const auto& progress = m.params_.progress;
        double total_weights = 0.0, done_weights = 0.0;
        auto weights_of = [](const Matrix& d) { return double(d.rows) * double(d.cols); };
        for (const QuantJob& j : quant_jobs) total_weights += weights_of(*j.dst);
        for (const PackedJob& j : packed_jobs) total_weights += weights_of(*j.dst);
        for (const Piece& p : pieces) total_weights += double(piece_elements(p));
        auto advance = [&](double n) {
            done_weights += n;
            if (progress && done_weights < total_weights) progress(float(done_weights / total_weights));
        };
        for (const QuantJob& j : quant_jobs) {
            upload_quantized(base, j);
            advance(weights_of(*j.dst));
        }
        for (const PackedJob& j : packed_jobs) {
            upload_packed_int4(base, j);
            advance(weights_of(*j.dst));
        }
        for (const Piece& p : pieces) {
            upload_piece(base, p, tmp, half);
            advance(double(piece_elements(p)));
        }
        for (const MatrixJob& j : matrices) {
            j.dst->data = base + j.off;
            if (j.scale_off != SIZE_MAX) j.dst->scales = reinterpret_cast<const float*>(base + j.scale_off);
        }
        for (const VectorJob& j : vectors) {
            tmp.resize(size_t(j.n));
            if (!j.src->data)
                dummy_vector(j.src->name, tmp);
            else
                convert_to_f32(j.src->data, to_dtype(j.src->dtype), tmp.data(), size_t(j.n));
            if (!j.dst && j.src->data)  // an FP8 matrix's block scales: finite and positive, or the output is garbage
                for (int64_t i = 0; i < j.n; i++)
                    if (!(std::isfinite(tmp[size_t(i)]) && tmp[size_t(i)] > 0.0f)) {
                        char v[32];  // (-1, 0, nan, inf: as short as the value allows)
                        std::snprintf(v, sizeof v, "%g", double(tmp[size_t(i)]));
                        throw Error(Status::format, "tensor '" + std::string(j.src->name) + "': block scale " +
                                                        std::to_string(i) + " is " + v +
                                                        " (FP8 block scales must be finite and > 0)");
                    }
            be.upload(base + j.off, tmp.data(), size_t(j.n) * 4);
            if (j.dst) *j.dst = reinterpret_cast<const float*>(base + j.off);
        }
        if (progress) progress(1.0f);
    }
};

// The checkpoint's tensors the config does not use: a layer past num_hidden_layers is an error (the config would
// silently run a shorter model); others are listed in the returned warning, as transformers reports unexpected
// keys. The multi-token-prediction head (mtp.*) and the vision tower (model.visual.*) are skipped without a word.
static std::string check_unused_tensors(const Checkpoint& ck, const ModelConfig& c) {
    std::vector<std::string> unused;
    const std::string layers = c.tensor_prefix + "layers.";
    for (const auto& [name, t] : ck.tensors) {
        if (ck.used.count(name) || name.starts_with("mtp.") || name.starts_with("model.visual.")) continue;
        if (name.starts_with(layers)) {
            const long long layer = std::atoll(name.c_str() + layers.size());
            if (layer >= c.n_layers)
                throw Error(Status::model_mismatch, "tensor '" + name + "' belongs to layer " + std::to_string(layer) +
                                                        ", but config.json's num_hidden_layers is " +
                                                        std::to_string(c.n_layers) +
                                                        ": the checkpoint has more layers than the config uses");
        }
        unused.push_back(name);
    }
    if (unused.empty()) return {};
    std::string w = std::to_string(unused.size()) + " checkpoint tensor" + (unused.size() > 1 ? "s are" : " is") +
                    " not used by this config: ";
    for (size_t i = 0; i < unused.size() && i < 5; i++) w += (i ? ", " : "") + unused[i];
    if (unused.size() > 5) w += " (and " + std::to_string(unused.size() - 5) + " more)";
    return w;
}

static std::unique_ptr<Backend> choose_backend(const ModelParams& p) {
    switch (p.device) {
        case Device::cpu: return make_cpu_backend(p.n_threads);
        case Device::cuda: return make_cuda_backend(0, p.cuda);
        case Device::auto_select:
            return cuda_available() ? make_cuda_backend(0, p.cuda) : make_cpu_backend(p.n_threads);
    }
    return make_cpu_backend(p.n_threads);
}

// "31.2 MiB", "9.87 GiB"
static std::string gib(size_t bytes) {
    char buf[32];
    const double m = double(bytes) / double(1 << 20);
    if (m >= 1024.0)
        std::snprintf(buf, sizeof buf, "%.2f GiB", m / 1024.0);
    else
        std::snprintf(buf, sizeof buf, "%.1f MiB", m);
    return buf;
}

void require_model_folder(const std::string& dir) {
    if (dir.empty()) throw Error(Status::io, "the model folder path is empty");
    if (!is_dir(dir)) {
        path_present(dir);  // (a symbolic link loop or a broken link: named with its target)
        struct stat st;
        throw Error(Status::io, dir + (::stat(dir.c_str(), &st) == 0 ? ": not a folder" : ": no such model folder"));
    }
    if (!path_present(dir + "/config.json")) throw Error(Status::io, dir + ": not a model folder (no config.json)");
}

std::unique_ptr<Model> Model::load(const std::string& dir_in, const ModelParams& params_in) {
    const std::string dir = folder_path(dir_in);
    require_model_folder(dir);
    std::unique_ptr<Model> m(new Model());
    m->dir_ = dir;
    m->config_ = load_model_config(dir);
    const ModelConfig& c = m->config_;

    ModelParams p = params_in;
    if (p.n_ctx == 0) {  // the context the model was trained for (llama.cpp's -c 0)
        if (c.max_position_embeddings <= 0)
            throw Error(Status::invalid_argument,
                        "context length 0 asks for the model's trained context, but " + dir +
                            "/config.json does not give max_position_embeddings: give a context length");
        p.n_ctx = c.max_position_embeddings;
    }
    if (p.n_ctx < 0)
        throw Error(Status::invalid_argument,
                    "context length must be positive (0: the trained context), got " + std::to_string(p.n_ctx));
    if (p.n_threads > 1024)  // (as the tools' -t; 50,000 started 32,000 threads before the OS refused one)
        throw Error(Status::invalid_argument,
                    "CPU threads must be at most 1024 (0: all cores), got " + std::to_string(p.n_threads));
    if (p.n_slots <= 0 || p.n_slots > 4096)
        throw Error(Status::invalid_argument,
                    "number of sequence slots must lie in [1, 4096], got " + std::to_string(p.n_slots));
    if (p.max_batch_tokens <= 0)
        throw Error(Status::invalid_argument, "batch size must be positive, got " + std::to_string(p.max_batch_tokens));
    // no step holds more tokens than the slots' positions together (-c 10 -b 100000000 asked for 2 TB of activations)
    p.max_batch_tokens = int(std::min<int64_t>(p.max_batch_tokens, int64_t(std::max(p.n_ctx, 1)) * p.n_slots));
    p.max_batch_tokens = std::max(p.max_batch_tokens, p.n_slots);  // a decode step of every slot fits
    if (p.max_logits <= 0) p.max_logits = std::max(p.n_slots, 1);
    p.max_logits = std::min(p.max_logits, p.max_batch_tokens);
    m->params_ = p;

    Checkpoint ck;
    ck.dummy = p.dummy_weights;
    if (!ck.dummy) ck.open(dir);
    m->backend_ = choose_backend(p);
    Backend& be = *m->backend_;

    // (FP8 by config.json with FP8 matrices, or dummy weights made in its format; 16-bit matrices under such a config
    // are quantized as asked, with the load warning below)
    bool fp8_matrices = false;
    for (const auto& [name, t] : ck.tensors)
        fp8_matrices = fp8_matrices || t->dtype == HYST_F8_E4M3 || t->dtype == HYST_F8_E5M2;
    if (p.quant != WeightQuant::none && c.fp8_weights && (fp8_matrices || p.dummy_weights))
        throw Error(Status::invalid_argument, std::string("weight quantization ") + weight_quant_name(p.quant) +
                                                  " was asked for, but " + dir +
                                                  " is already an FP8 checkpoint (config.json quantization_config "
                                                  "quant_method fp8): load it without --quant");
    if (p.quant != WeightQuant::none && c.int4_packed_weights)
        throw Error(Status::invalid_argument, std::string("weight quantization ") + weight_quant_name(p.quant) +
                                                  " was asked for, but " + dir +
                                                  " is already an int4 checkpoint (config.json quantization_config "
                                                  "quant_method compressed-tensors, format pack-quantized): load it "
                                                  "without --quant");
    // Dummy weights for an FP8 checkpoint's config.json: made as 16-bit values and quantized to FP8 at load (the
    // matrices Qwen's FP8 releases hold in FP8, as --quant fp8), so that the shape is measured in its own format
    if (p.dummy_weights && c.fp8_weights) m->params_.quant = WeightQuant::fp8;
    // (and for a compressed-tensors int4 one, quantized to Q4 with its group size, as --quant int4:G)
    if (p.dummy_weights && c.int4_packed_weights) {
        m->params_.quant = WeightQuant::int4;
        m->params_.quant_group = c.int4_packed_group;
    }
    ModelLoader ld{*m, ck, be, 0, {}, {}, {}, {}, {}, 1};
    ld.plan_weights();
    m->weight_bytes_ = ld.offset;
    // the load's warnings, "; "-separated: config.json's first, then unused tensors, then the weights' formats
    m->load_warning_ = c.warning;
    auto warn = [&](const std::string& w) {
        if (!w.empty()) m->load_warning_ += (m->load_warning_.empty() ? "" : "; ") + w;
    };
    warn(check_unused_tensors(ck, c));
    // (a folder whose config.json says FP8 but whose matrices are 16-bit loads them as stored: said, not silent)
    if (c.fp8_weights && !p.dummy_weights && !fp8_matrices)
        warn(dir + "/config.json: quantization_config says quant_method fp8, but no matrix is FP8: the weights are " +
             (p.quant == WeightQuant::none
                  ? std::string("used as stored (16-bit)")
                  : std::string("16-bit, quantized at load as asked (--quant ") + weight_quant_name(p.quant) + ")"));

    // Sequence state.
    const DType act = be.act_dtype();
    const size_t as = dtype_size(act);
    const size_t S = size_t(p.n_slots), T = size_t(p.max_batch_tokens);
    const size_t H = size_t(c.hidden_size), C = size_t(c.gdn_conv_channels());
    const size_t kv_row = size_t(c.n_kv_heads) * size_t(c.head_dim);
    struct StateOffsets {
        size_t k = 0, v = 0, conv = 0, ssm = 0;
    };
    std::vector<StateOffsets> so(size_t(c.n_layers));
    for (int i = 0; i < c.n_layers; i++) {
        if (c.layer_kinds[size_t(i)] == LayerKind::full_attention) {
            so[size_t(i)].k = ld.reserve(S * size_t(p.n_ctx) * kv_row * as);
            so[size_t(i)].v = ld.reserve(S * size_t(p.n_ctx) * kv_row * as);
        } else {
            so[size_t(i)].conv = ld.reserve(S * size_t(c.conv_kernel - 1) * C * as);
            so[size_t(i)].ssm = ld.reserve(S * size_t(c.gdn_v_heads) * size_t(c.gdn_k_dim) * size_t(c.gdn_v_dim) * 4);
        }
    }
    m->state_bytes_ = ld.offset - m->weight_bytes_;

    // Activations.
    const size_t Hq = size_t(c.n_heads), D = size_t(c.head_dim), Hv = size_t(c.gdn_v_heads), Dv = size_t(c.gdn_v_dim);
    const size_t F = std::max(size_t(c.intermediate_size), size_t(c.shared_expert_intermediate_size));
    const size_t K = size_t(std::max(c.n_experts_per_tok, 1));
    size_t o_x = ld.reserve(T * H * as), o_xn = ld.reserve(T * H * as), o_y = ld.reserve(T * H * as);
    size_t o_mix_in = ld.reserve(T * std::max(Hq * 2 * D, C) * as);
    size_t o_k = ld.reserve(T * kv_row * as), o_v = ld.reserve(T * kv_row * as);
    size_t o_z = ld.reserve(T * Hv * Dv * as), o_b = ld.reserve(T * Hv * as), o_a = ld.reserve(T * Hv * as);
    size_t o_mix_out = ld.reserve(T * std::max(Hq * D, Hv * Dv) * as);
    size_t o_gate = ld.reserve(T * F * as), o_up = ld.reserve(T * F * as);
    size_t o_route_w = c.has_moe() ? ld.reserve(T * K * 4) : 0, o_route_ids = c.has_moe() ? ld.reserve(T * K * 4) : 0;
    size_t o_last = ld.reserve(size_t(p.max_logits) * H * as);
    size_t o_logits = ld.reserve(size_t(p.max_logits) * size_t(c.vocab_size) * 4);
    size_t o_picks = ld.reserve(size_t(p.max_logits) * sizeof(TokenPick));

    BatchLimits limits{p.max_batch_tokens, p.n_slots, p.n_ctx, p.n_slots};
    WorkspaceShape ws;
    ws.max_heads = std::max(c.n_heads, c.gdn_v_heads);
    ws.max_head_dim = std::max(c.head_dim, std::max(c.gdn_k_dim, c.gdn_v_dim));
    ws.hidden = c.hidden_size;
    ws.n_experts = c.n_experts;
    ws.experts_per_tok = c.n_experts_per_tok;
    ws.moe_intermediate = c.moe_intermediate_size;
    ws.shared_intermediate = c.shared_expert_intermediate_size;
    // (the dequantization scratch of FP8 and Q8/Q4 matrices; a quantized lm_head, far larger, is not dequantized:
    // cuda::matmul_int runs it by GEMVs of 8 rows)
    for (const auto& job : ld.matrices)
        if (is_fp8(job.dst->dtype) || (is_int_quant(job.dst->dtype) && job.dst != &m->weights_.output)) {
            ws.fp8_max_cols = std::max(ws.fp8_max_cols, job.dst->cols);
            ws.fp8_max_elems = std::max(ws.fp8_max_elems, job.dst->rows * job.dst->cols);
        }
    const size_t ws_bytes = be.workspace_bytes(limits, ws);
    size_t o_ws = ld.reserve(ws_bytes);
    m->arena_bytes_ = ld.offset;
    // An arena larger than the memory it can ever have is refused now, with the numbers, before anything is
    // allocated (on the CPU the state pages become resident as the sequences grow: the failure would come late).
    if (const size_t cap = be.memory_capacity(); cap > 0 && m->arena_bytes_ > cap) {
        const size_t kv = [&] {
            size_t b = 0;
            for (int i = 0; i < c.n_layers; i++)
                if (c.layer_kinds[size_t(i)] == LayerKind::full_attention) b += 2 * S * kv_row * as;
            return b;  // per position, every slot
        }();
        // The largest context that fits: the KV cache and the working memory both grow with it (the working memory
        // of a 2-billion-position context was 15 GiB on the CPU), so search it rather than divide (the hint was
        // then the smaller the larger the -c asked for). It must leave a tenth of the memory free: an arena of all
        // of it passes this check but not the allocation (the fresh-user test: host memory 23.54 GiB, the hint's
        // arena 24,105 MiB, "cannot allocate").
        const size_t fixed = m->arena_bytes_ - size_t(p.n_ctx) * kv - ws_bytes, budget = cap - cap / 10;
        const auto fits_at = [&](int64_t n) {
            BatchLimits l = limits;
            l.n_ctx = int(n);
            return fixed + size_t(n) * kv + be.workspace_bytes(l, ws) <= budget;
        };
        int64_t lo = 0, hi = p.n_ctx;  // fits_at(lo) or lo == 0; !fits_at(hi)
        while (hi - lo > 1) {
            const int64_t mid = lo + (hi - lo) / 2;
            (fits_at(mid) ? lo : hi) = mid;
        }
        const std::string fits = kv > 0 && lo > 0 ? "; a context of up to " + std::to_string(lo) +
                                                        " positions would fit, leaving a tenth of it free" +
                                                        (p.n_slots > 1 ? " (so would more with fewer sequences)" : "")
                                                  : "";
        throw Error(Status::out_of_memory,
                    "the model needs " + gib(m->arena_bytes_) + " (weights " + gib(m->weight_bytes_) +
                        ", KV cache and states " + gib(m->state_bytes_) + " for a context of " +
                        std::to_string(p.n_ctx) + " positions x " + std::to_string(p.n_slots) +
                        (p.n_slots == 1 ? " sequence" : " sequences") + ", working memory " +
                        gib(m->arena_bytes_ - m->weight_bytes_ - m->state_bytes_) + " for steps of up to " +
                        std::to_string(p.max_batch_tokens) + " tokens), more than the " + gib(cap) + " of " +
                        (std::string(be.name()) == "cpu" ? "host" : "device") + " memory" + fits);
    }

    m->arena_ = be.alloc(m->arena_bytes_);
    char* base = static_cast<char*>(m->arena_);
    ld.upload_weights(base);
    m->params_.progress = nullptr;  // (its captures belong to the caller's load: not kept with the model's params)
    if (c.tie_word_embeddings && !m->weights_.output.data) m->weights_.output = m->weights_.embed;

    m->state_.resize(size_t(c.n_layers));
    for (int i = 0; i < c.n_layers; i++) {
        LayerState& st = m->state_[size_t(i)];
        if (c.layer_kinds[size_t(i)] == LayerKind::full_attention) {
            st.k_cache = base + so[size_t(i)].k;
            st.v_cache = base + so[size_t(i)].v;
        } else {
            st.conv_state = base + so[size_t(i)].conv;
            st.ssm_state = reinterpret_cast<float*>(base + so[size_t(i)].ssm);
        }
    }
    if (!be.alloc_zeroed()) be.fill_zero(base + m->weight_bytes_, m->state_bytes_);
    Activations& a = m->act_;
    a.x = base + o_x;
    a.xn = base + o_xn;
    a.y = base + o_y;
    a.mix_in = base + o_mix_in;
    a.k = base + o_k;
    a.v = base + o_v;
    a.z = base + o_z;
    a.b = base + o_b;
    a.a = base + o_a;
    a.mix_out = base + o_mix_out;
    a.gate = base + o_gate;
    a.up = base + o_up;
    if (c.has_moe()) {
        a.route_weights = reinterpret_cast<float*>(base + o_route_w);
        a.route_ids = reinterpret_cast<int32_t*>(base + o_route_ids);
    }
    a.last = base + o_last;
    a.logits = reinterpret_cast<float*>(base + o_logits);
    a.picks = reinterpret_cast<TokenPick*>(base + o_picks);
    be.set_workspace(base + o_ws, limits);
    be.synchronize();

    m->seq_len_.assign(S, 0);
    m->logits_host_.resize(size_t(p.max_logits) * size_t(c.vocab_size));
    m->picks_host_.resize(size_t(p.max_logits));
    m->runs_scratch_.resize(S);
    m->slot_seen_.assign(S, 0);
    m->rows_scratch_.resize(T);
    m->last_step_key_.reserve(S + size_t(p.max_logits) + 4);
    m->step_key_.reserve(S + size_t(p.max_logits) + 4);
    return m;
}

Model::~Model() {
    if (arena_ && backend_) backend_->free(arena_);
}

int Model::seq_len(int slot) const {
    if (slot < 0 || slot >= params_.n_slots)
        throw Error(Status::invalid_argument, "sequence slot " + std::to_string(slot) + " out of range [0, " +
                                                  std::to_string(params_.n_slots) + ")");
    return seq_len_[size_t(slot)];
}

void Model::reset(int slot) {
    seq_len(slot);  // validates
    seq_len_[size_t(slot)] = 0;
    const ModelConfig& c = config_;
    const size_t as = dtype_size(backend_->act_dtype());
    const size_t conv = size_t(c.conv_kernel - 1) * size_t(c.gdn_conv_channels()) * as;
    const size_t ssm = size_t(c.gdn_v_heads) * size_t(c.gdn_k_dim) * size_t(c.gdn_v_dim) * 4;
    for (int i = 0; i < c.n_layers; i++) {
        if (c.layer_kinds[size_t(i)] != LayerKind::gated_delta_net) continue;
        LayerState& st = state_[size_t(i)];
        backend_->fill_zero(static_cast<char*>(st.conv_state) + size_t(slot) * conv, conv);
        backend_->fill_zero(reinterpret_cast<char*>(st.ssm_state) + size_t(slot) * ssm, ssm);
    }
}

// Snapshot layout: a fixed header, then per layer its state for this slot (KV rows [0, len) for attention layers;
// conv state and recurrent state for GDN layers).
namespace {
struct SnapshotHeader {
    char magic[8];  // "HYSNAP1\0"
    uint32_t n_layers, hidden, vocab, n_kv_heads, head_dim, gdn_v_heads, gdn_k_dim, gdn_v_dim, conv_channels,
        conv_kernel, act_dtype, seq_len;
};
}  // namespace

namespace {
SnapshotHeader snapshot_header(const ModelConfig& c, DType act, int len) {
    SnapshotHeader h{};
    std::memcpy(h.magic, "HYSNAP1", 8);
    h.n_layers = uint32_t(c.n_layers);
    h.hidden = uint32_t(c.hidden_size);
    h.vocab = uint32_t(c.vocab_size);
    h.n_kv_heads = uint32_t(c.n_kv_heads);
    h.head_dim = uint32_t(c.head_dim);
    h.gdn_v_heads = uint32_t(c.gdn_v_heads);
    h.gdn_k_dim = uint32_t(c.gdn_k_dim);
    h.gdn_v_dim = uint32_t(c.gdn_v_dim);
    h.conv_channels = uint32_t(c.gdn_conv_channels());
    h.conv_kernel = uint32_t(c.conv_kernel);
    h.act_dtype = uint32_t(act);
    h.seq_len = uint32_t(len);
    return h;
}

// Walks a byte stream laid over host ranges: each call takes the next n bytes, as one or more pieces.
class RangeCursor {
public:
    explicit RangeCursor(std::span<const std::span<uint8_t>> ranges) : r_(ranges) {}
    // f(host pointer, offset within the n bytes, piece size) for each piece of the next n bytes; false when the
    // ranges end first.
    template <class F>
    bool take(size_t n, F&& f) {
        size_t done = 0;
        while (done < n) {
            while (i_ < r_.size() && at_ == r_[i_].size()) i_++, at_ = 0;
            if (i_ == r_.size()) return false;
            const size_t k = std::min(n - done, r_[i_].size() - at_);
            f(r_[i_].data() + at_, done, k);
            at_ += k;
            done += k;
        }
        return true;
    }

private:
    std::span<const std::span<uint8_t>> r_;
    size_t i_ = 0, at_ = 0;
};

size_t total_size(std::span<const std::span<uint8_t>> ranges) {
    size_t n = 0;
    for (const std::span<uint8_t>& r : ranges) n += r.size();
    return n;
}
}  // namespace

// The slot's state after the header: (device address, bytes) pieces in snapshot order.
std::vector<std::pair<char*, size_t>> Model::state_pieces(int slot, size_t len) const {
    const ModelConfig& c = config_;
    const size_t as = dtype_size(backend_->act_dtype());
    const size_t kv_row = size_t(c.n_kv_heads) * size_t(c.head_dim) * as;
    const size_t conv = size_t(c.conv_kernel - 1) * size_t(c.gdn_conv_channels()) * as;
    const size_t ssm = size_t(c.gdn_v_heads) * size_t(c.gdn_k_dim) * size_t(c.gdn_v_dim) * 4;
    std::vector<std::pair<char*, size_t>> out;
    out.reserve(size_t(c.n_layers) * 2);
    for (int i = 0; i < c.n_layers; i++) {
        const LayerState& st = state_[size_t(i)];
        if (c.layer_kinds[size_t(i)] == LayerKind::full_attention) {
            const size_t slot_bytes = size_t(params_.n_ctx) * kv_row;
            out.push_back({static_cast<char*>(st.k_cache) + size_t(slot) * slot_bytes, len * kv_row});
            out.push_back({static_cast<char*>(st.v_cache) + size_t(slot) * slot_bytes, len * kv_row});
        } else {
            out.push_back({static_cast<char*>(st.conv_state) + size_t(slot) * conv, conv});
            out.push_back({reinterpret_cast<char*>(st.ssm_state) + size_t(slot) * ssm, ssm});
        }
    }
    return out;
}

size_t Model::state_bytes(int slot) const {
    size_t total = sizeof(SnapshotHeader);
    for (const auto& [p, n] : state_pieces(slot, size_t(seq_len(slot)))) total += n;
    return total;
}

std::vector<uint8_t> Model::save_state(int slot) const {
    std::vector<uint8_t> out(state_bytes(slot));
    const std::span<uint8_t> whole(out);
    save_state(slot, std::span<const std::span<uint8_t>>(&whole, 1));
    return out;
}

void Model::save_state(int slot, std::span<const std::span<uint8_t>> dst) const {
    const int len = seq_len(slot);
    const size_t total = state_bytes(slot);
    if (total_size(dst) != total)
        throw Error(Status::invalid_argument, "save_state: the ranges hold " + std::to_string(total_size(dst)) +
                                                  " bytes, the state " + std::to_string(total));
    const SnapshotHeader h = snapshot_header(config_, backend_->act_dtype(), len);
    RangeCursor out(dst);
    out.take(sizeof h,
             [&](uint8_t* p, size_t at, size_t n) { std::memcpy(p, reinterpret_cast<const char*>(&h) + at, n); });
    Backend& be = *backend_;
    for (const auto& [src, bytes] : state_pieces(slot, size_t(len)))
        out.take(bytes, [&, src = src](uint8_t* p, size_t at, size_t n) { be.download_async(p, src + at, n); });
    be.synchronize();
}

void Model::load_state(int slot, std::span<const uint8_t> snap) {
    const std::span<uint8_t> whole(const_cast<uint8_t*>(snap.data()), snap.size());  // only read
    load_state(slot, std::span<const std::span<uint8_t>>(&whole, 1));
}

void Model::load_state(int slot, std::span<const std::span<uint8_t>> src) {
    seq_len(slot);
    const ModelConfig& c = config_;
    const size_t size = total_size(src);
    SnapshotHeader h{};
    if (size < sizeof h) throw Error(Status::format, "snapshot is truncated (" + std::to_string(size) + " bytes)");
    RangeCursor in(src);
    in.take(sizeof h, [&](uint8_t* p, size_t at, size_t n) { std::memcpy(reinterpret_cast<char*>(&h) + at, p, n); });
    if (std::memcmp(h.magic, "HYSNAP1", 8) != 0) throw Error(Status::format, "not a hybrid state snapshot (bad magic)");
    const SnapshotHeader mine = snapshot_header(c, backend_->act_dtype(), 0);
    const bool same = h.n_layers == mine.n_layers && h.hidden == mine.hidden && h.vocab == mine.vocab &&
                      h.n_kv_heads == mine.n_kv_heads && h.head_dim == mine.head_dim &&
                      h.gdn_v_heads == mine.gdn_v_heads && h.gdn_k_dim == mine.gdn_k_dim &&
                      h.gdn_v_dim == mine.gdn_v_dim && h.conv_channels == mine.conv_channels &&
                      h.conv_kernel == mine.conv_kernel;
    if (!same) throw Error(Status::model_mismatch, "snapshot was saved from a model of different shape");
    if (h.act_dtype != mine.act_dtype)
        throw Error(Status::model_mismatch, std::string("snapshot holds ") + dtype_name(DType(h.act_dtype)) +
                                                " state but this backend keeps " + dtype_name(backend_->act_dtype()));
    if (h.seq_len > uint32_t(params_.n_ctx))
        throw Error(Status::context_full, "snapshot holds " + std::to_string(h.seq_len) + " tokens, context is " +
                                              std::to_string(params_.n_ctx));
    const std::vector<std::pair<char*, size_t>> pieces = state_pieces(slot, h.seq_len);
    size_t total = sizeof h;
    for (const auto& [p, n] : pieces) total += n;
    if (size != total)
        throw Error(Status::format,
                    "snapshot has " + std::to_string(size) + " bytes, expected " + std::to_string(total));
    Backend& be = *backend_;
    for (const auto& [dst, bytes] : pieces)
        in.take(bytes, [&, dst = dst](uint8_t* p, size_t at, size_t n) { be.upload_async(dst + at, p, n); });
    be.synchronize();
    seq_len_[size_t(slot)] = int32_t(h.seq_len);
}

std::vector<std::pair<DType, int64_t>> weight_dtypes(const Weights& w) {
    std::vector<std::pair<DType, int64_t>> out;
    auto add = [&](const Matrix& m) {
        if (m.rows <= 0 || m.cols <= 0) return;
        for (auto& [t, n] : out)
            if (t == m.dtype) {
                n += m.rows * m.cols;
                return;
            }
        out.emplace_back(m.dtype, m.rows * m.cols);
    };
    add(w.embed);
    if (w.output.data != w.embed.data || w.output.dtype != w.embed.dtype) add(w.output);  // (tied: the same matrix)
    for (const LayerWeights& L : w.layers) {
        if (L.kind == LayerKind::full_attention) {
            for (const Matrix* m : {&L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, &L.attn.o_proj}) add(*m);
        } else {
            for (const Matrix* m :
                 {&L.gdn.in_proj_qkv, &L.gdn.in_proj_z, &L.gdn.in_proj_b, &L.gdn.in_proj_a, &L.gdn.out_proj})
                add(*m);
        }
        if (L.moe) {
            const MoeWeights& e = L.moe_block;
            for (const Matrix* m : {&e.router, &e.experts.gate_up, &e.experts.down, &e.shared.gate_proj,
                                    &e.shared.up_proj, &e.shared.down_proj, &e.shared.gate})
                add(*m);
        } else {
            for (const Matrix* m : {&L.mlp.gate_proj, &L.mlp.up_proj, &L.mlp.down_proj}) add(*m);
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return out;
}

std::string weight_dtypes_text(const Weights& w) {
    const auto types = weight_dtypes(w);
    if (types.size() == 1) return dtype_name(types[0].first);
    int64_t total = 0;
    for (const auto& t : types) total += t.second;
    std::string s;
    for (const auto& [t, n] : types) {
        char pct[32];
        const double share = 100.0 * double(n) / double(total);
        std::snprintf(pct, sizeof pct, share < 1.0 ? " %.1f%%" : " %.0f%%", share);
        s += (s.empty() ? "" : ", ") + std::string(dtype_name(t)) + pct;
    }
    return s;
}

bool has_fp8_weights(const Weights& w) {
    for (const auto& t : weight_dtypes(w))
        if (is_fp8(t.first)) return true;
    return false;
}

}  // namespace hy
