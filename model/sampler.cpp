// Token sampling (see sampler.h for the pipeline and the formulas).
#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "base/softmax.h"
#include "model/common.h"

namespace hy {

Sampler::Sampler(const SamplerParams& p, int n_logits, int n_valid, int history_capacity) : params_(p) {
    if (n_logits <= 0) throw Error(Status::invalid_argument, "sampler: n_logits must be > 0");
    if (n_valid <= 0) throw Error(Status::invalid_argument, "sampler: n_valid must be > 0");
    // (top_p >= 1 and min_p <= 0 are "off", as engine.h documents; min_p 2 and infinities were taken)
    // (NaN fails both: named as what it is)
    if (!(p.top_p >= 0.0f))
        throw Error(Status::invalid_argument, "sampler: top_p must be a number >= 0, got " + std::to_string(p.top_p));
    if (!(p.min_p <= 1.0f))
        throw Error(Status::invalid_argument,
                    "sampler: min_p must be a number at most 1, got " + std::to_string(p.min_p));
    if (!(p.repeat_penalty > 0.0f)) throw Error(Status::invalid_argument, "sampler: repeat_penalty must be > 0");
    if (p.repeat_last_n < -1) throw Error(Status::invalid_argument, "sampler: repeat_last_n must be >= -1");
    if (!std::isfinite(p.temperature) || !std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty) ||
        !std::isfinite(p.repeat_penalty))
        throw Error(Status::invalid_argument, "sampler: temperature and penalties must be finite numbers");
    for (const auto& [id, bias] : p.logit_bias)
        if (!std::isfinite(bias))
            throw Error(Status::invalid_argument,
                        "sampler: the logit bias of id " + std::to_string(id) + " must be a finite number");
    n_logits_ = n_logits;
    n_valid_ = std::min(n_valid, n_logits);
    // the window holds at most history_capacity ids (a sequence never holds more: a larger window would only
    // reserve memory, 4 bytes per id)
    const int cap = std::max(history_capacity, 0);
    const int window = p.repeat_last_n < 0 ? cap : std::min(p.repeat_last_n, cap);
    ring_.assign(size_t(window), 0);
    counts_.assign(size_t(n_logits), 0);
    seen_.assign(size_t(n_logits), 0);
    work_.assign(size_t(n_logits), 0.0f);
    cand_.reserve(size_t(n_valid_));
    rng_.seed(p.seed);
}

void Sampler::set_banned(std::span<const int32_t> ids) {
    banned_.clear();
    for (int32_t id : ids)
        if (id >= 0 && id < n_logits_) banned_.push_back(id);
    std::sort(banned_.begin(), banned_.end());
}

bool Sampler::is_banned(int32_t id) const { return std::binary_search(banned_.begin(), banned_.end(), id); }

bool Sampler::pick_stands(int32_t id) const { return plain_greedy() && id >= 0 && id < n_valid_ && !is_banned(id); }

bool Sampler::plain_greedy() const {
    const SamplerParams& p = params_;
    return (p.temperature <= 0.0f || p.top_k == 1) && p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f &&
           p.frequency_penalty == 0.0f && p.logit_bias.empty();
}

void Sampler::set_seed(uint64_t seed) {
    params_.seed = seed;
    rng_.seed(seed);
}

void Sampler::reset(bool reseed) {
    ring_head_ = ring_count_ = 0;
    std::fill(counts_.begin(), counts_.end(), 0);
    if (reseed) rng_.seed(params_.seed);
}

int Sampler::window_size() const { return int(ring_count_); }

void Sampler::accept(int32_t id) {
    if (id < 0 || id >= n_logits_ || ring_.empty()) return;
    const size_t cap = ring_.size();
    if (ring_count_ == cap) {  // evict the oldest
        const size_t oldest = (ring_head_ + cap - ring_count_) % cap;
        counts_[size_t(ring_[oldest])]--;
        ring_count_--;
    }
    ring_[ring_head_] = id;
    ring_head_ = (ring_head_ + 1) % cap;
    ring_count_++;
    counts_[size_t(id)]++;
}

void Sampler::apply_penalties(std::span<float> logits) const {
    if (ring_count_ == 0) return;
    const float rp = params_.repeat_penalty, pp = params_.presence_penalty, fp = params_.frequency_penalty;
    if (rp == 1.0f && pp == 0.0f && fp == 0.0f) return;
    const size_t cap = ring_.size();
    const size_t start = (ring_head_ + cap - ring_count_) % cap;
    for (size_t k = 0; k < ring_count_; k++) {
        const int32_t id = ring_[(start + k) % cap];
        if (seen_[size_t(id)] || size_t(id) >= logits.size()) continue;
        seen_[size_t(id)] = 1;
        float& l = logits[size_t(id)];
        if (!std::isfinite(l)) continue;  // (a banned -inf stays banned; NaN is never a candidate)
        float v = l;
        if (rp != 1.0f) v = v > 0.0f ? v / rp : v * rp;
        const int c = counts_[size_t(id)];
        v -= pp * (c > 0 ? 1.0f : 0.0f) + fp * float(c);
        // kept finite: a repeat_penalty of 1e-38 made +inf of every positive logit, and +inf is no candidate (the
        // draw fell back to an arbitrary id); at the float limit the boosted ids tie instead
        l = std::clamp(v, -std::numeric_limits<float>::max(), std::numeric_limits<float>::max());
    }
    for (size_t k = 0; k < ring_count_; k++) seen_[size_t(ring_[(start + k) % cap])] = 0;
}

double Sampler::uniform01() {
    return double(rng_() >> 11) * (1.0 / 9007199254740992.0);  // 53 random bits in [0, 1)
}

int32_t Sampler::sample(std::span<const float> logits) {
    if (logits.size() != size_t(n_logits_))
        throw Error(Status::invalid_argument, "sampler: logits row has " + std::to_string(logits.size()) +
                                                  " values, expected " + std::to_string(n_logits_));
    const size_t nv = size_t(n_valid_);
    std::copy(logits.begin(), logits.begin() + std::ptrdiff_t(nv), work_.begin());
    for (int32_t id : banned_) work_[size_t(id)] = -std::numeric_limits<float>::infinity();
    for (const auto& [id, bias] : params_.logit_bias)
        if (id >= 0 && size_t(id) < nv) work_[size_t(id)] += bias;
    // a row without any finite value (NaN or inf weights or activations) has no distribution to sample from:
    // an error, not a silent id 0
    size_t first_finite = 0;
    while (first_finite < nv && !std::isfinite(work_[first_finite])) first_finite++;
    if (first_finite == nv)
        throw Error(Status::backend, "the model produced no finite logits (NaN or inf weights or activations?)");
    apply_penalties(std::span<float>(work_.data(), nv));
    const float* x = work_.data();

    const SamplerParams& p = params_;
    if (p.temperature <= 0.0f || p.top_k == 1) return argmax(std::span<const float>(x, nv), n_valid_);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    auto by_logit = [](const Candidate& a, const Candidate& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };

    // Candidates (finite logits; NaN and -inf never), sorted by logit descending over [0, n_sorted).
    cand_.clear();
    size_t n_sorted = 0;
    if (p.top_k > 0) {
        // top-k by one pass with a min-heap of k (the heap's front is the weakest kept candidate)
        const size_t k = size_t(p.top_k);
        for (size_t i = 0; i < nv; i++) {
            const float v = x[i];
            if (!(v > neg_inf)) continue;  // -inf or NaN
            if (cand_.size() < k) {
                cand_.push_back({int32_t(i), v, 0.0f});
                std::push_heap(cand_.begin(), cand_.end(), by_logit);
            } else if (v > cand_.front().logit) {
                std::pop_heap(cand_.begin(), cand_.end(), by_logit);
                cand_.back() = {int32_t(i), v, 0.0f};
                std::push_heap(cand_.begin(), cand_.end(), by_logit);
            }
        }
        std::sort_heap(cand_.begin(), cand_.end(), by_logit);
        n_sorted = cand_.size();
    } else {
        // no top-k: min-p is a logit threshold (p_i >= min_p * p_max  <=>  x_i >= x_max + log(min_p)), so only
        // the survivors are collected; the top-p prefix is then found by sorting as few of them as needed.
        const float mx = x[argmax(std::span<const float>(x, nv), n_valid_)];
        const float thr = p.min_p > 0.0f ? mx + std::log(std::min(p.min_p, 1.0f)) : neg_inf;
        for (size_t i = 0; i < nv; i++)
            if (x[i] > neg_inf && x[i] >= thr) cand_.push_back({int32_t(i), x[i], 0.0f});
    }
    if (cand_.empty()) return argmax(std::span<const float>(x, nv), n_valid_);
    size_t n = cand_.size();

    // probabilities at temperature 1 over the candidates of the top-k step (all valid ids when top-k is off)
    if (p.top_p < 1.0f || (p.min_p > 0.0f && p.top_k > 0)) {
        double z = 0.0;
        float mx = cand_[0].logit;
        if (p.top_k > 0) {
            for (size_t i = 0; i < n; i++) z += std::exp(double(cand_[i].logit - mx));
        } else {
            mx = x[argmax(std::span<const float>(x, nv), n_valid_)];
            z = exp_sum(std::span<const float>(x, nv), mx);
        }
        const float inv_z = float(1.0 / z);
        for (size_t i = 0; i < n; i++) cand_[i].p = fast_exp(cand_[i].logit - mx) * inv_z;
        if (p.top_p < 1.0f) {
            // sort a growing prefix until its mass reaches top_p
            size_t keep = n;
            double cum = 0.0;
            size_t i = 0;
            for (size_t want = std::min<size_t>(64, n);; want = std::min(2 * want, n)) {
                if (n_sorted < want) {
                    std::partial_sort(cand_.begin() + std::ptrdiff_t(n_sorted), cand_.begin() + std::ptrdiff_t(want),
                                      cand_.end(), by_logit);
                    n_sorted = want;
                }
                for (; i < want; i++) {
                    cum += cand_[i].p;
                    if (cum >= double(p.top_p)) break;
                }
                if (i < want) {
                    keep = i + 1;
                    break;
                }
                if (want == n) break;
            }
            n = std::max<size_t>(keep, 1);
        }
        if (p.min_p > 0.0f && p.top_k > 0) {
            const float thr = p.min_p * cand_[0].p;
            size_t keep = 1;
            while (keep < n && cand_[keep].p >= thr) keep++;
            n = keep;
        }
    }

    // temperature, then one draw; a temperature so small that 1/t overflows the float scale (below about 3e-39)
    // is the greedy limit (an infinite scale would turn the best logit's 0 * inf into NaN)
    const float scale = float(1.0 / double(p.temperature));
    float mx = cand_[0].logit;
    for (size_t i = 1; i < n; i++) mx = std::max(mx, cand_[i].logit);
    if (!std::isfinite(scale)) {
        for (size_t i = 0; i < n; i++)
            if (cand_[i].logit == mx) return cand_[i].id;
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cand_[i].p = fast_exp((cand_[i].logit - mx) * scale);
        sum += double(cand_[i].p);
    }
    const double r = uniform01() * sum;
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        acc += double(cand_[i].p);
        if (r < acc) return cand_[i].id;
    }
    return cand_[n - 1].id;
}

}  // namespace hy
