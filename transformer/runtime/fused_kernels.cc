// Fused CPU kernels for the training step (transformer/runtime/fused_kernels.py builds and loads them).
//
//   FusedLayerNorm / FusedLayerNormGrad: layer norm over the last axis, statistics in float32, one
//     pass over the rows each way (TensorFlow's op-at-a-time graph makes ~10 passes forward and ~12 back).
//   FusedAttentionSoftmax / FusedAttentionSoftmaxGrad: attention logits [B, N, T, S] + a boolean mask
//     [B, T, S] (false: `mask_value` added), softmax in float32, dropout, one pass each way; the
//     dropout mask is not stored but recomputed in the gradient from the same seed (a counter-based
//     hash of the element's position). Also each row's sum of its dropped weights (float32 [B, N, T],
//     1 without dropout), whose gradient the backward pass adds to every element of its row.
//   FusedCrossEntropy / FusedCrossEntropyGrad: the label-smoothed cross-entropy of logits [..., V] read
//     in their own dtype (float32 inside), the gradient's softmax recomputed from the logits.
//   FusedBiasRelu / FusedBiasReluGrad: a matrix product's bias, ReLU and dropout in one pass each way,
//     the bias gradient included.
//   FusedCastSum: a float32 gradient rounded to bfloat16 and summed over its rows, one pass.
//   SmallBatchMatMul: float32 `x [..., M, K] · y [..., K, N]` (either side adjoint) for many small
//     matrices (the attention's per-(row, head) products), one Eigen dense product per matrix.
//
// x/logits and their gradients are float32, bfloat16 or float16; gamma, beta, statistics float32.
// Rows are split over TensorFlow's intra-op threads (`Shard`); every result is independent of the
// thread count (dgamma/dbeta sum fixed blocks of rows in a fixed order).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "Eigen/Core"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

using namespace tensorflow;

namespace {

inline float to_float(float v) { return v; }
inline float to_float(Eigen::bfloat16 v) {
  uint32_t bits = static_cast<uint32_t>(Eigen::numext::bit_cast<uint16_t>(v)) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float to_float(Eigen::half v) { return static_cast<float>(v); }

template <typename T> inline T from_float(float v) { return static_cast<T>(v); }
template <> inline Eigen::bfloat16 from_float<Eigen::bfloat16>(float v) {
  // round to nearest even (NaN stays NaN: its mantissa is non-zero in the kept bits)
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return Eigen::numext::bit_cast<Eigen::bfloat16>(static_cast<uint16_t>(bits >> 16));
}

Status RowShape(shape_inference::InferenceContext* c, int input, shape_inference::ShapeHandle* out) {
  shape_inference::ShapeHandle x = c->input(input);
  if (!c->RankKnown(x)) { *out = c->UnknownShape(); return OkStatus(); }
  return c->Subshape(x, 0, -1, out);
}

// Output 0 shaped as input 0 `[..., d]`, output 1 its column sums `[d]`.
Status ShapeAndColumnSums(shape_inference::InferenceContext* c) {
  c->set_output(0, c->input(0));
  shape_inference::ShapeHandle x = c->input(0);
  c->set_output(1, c->RankKnown(x) ? c->Vector(c->Dim(x, c->Rank(x) - 1)) : c->Vector(c->UnknownDim()));
  return OkStatus();
}

// `out[j]` = Σ over `blocks` partial rows `partials [blocks, d]`, in block order (deterministic).
void SumBlocks(const float* partials, int64_t blocks, int64_t d, float* out) {
  std::fill(out, out + d, 0.f);
  for (int64_t k = 0; k < blocks; ++k)
    for (int64_t j = 0; j < d; ++j) out[j] += partials[k * d + j];
}

}  // namespace

REGISTER_OP("FusedLayerNorm")
    .Input("x: T").Input("gamma: float").Input("beta: float")
    .Output("y: T").Output("mean: float").Output("inv: float")
    .Attr("T: {float, bfloat16, half}").Attr("epsilon: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      shape_inference::ShapeHandle rows;
      TF_RETURN_IF_ERROR(RowShape(c, 0, &rows));
      c->set_output(1, rows);
      c->set_output(2, rows);
      return OkStatus();
    });

REGISTER_OP("FusedLayerNormGrad")
    .Input("dy: T").Input("x: T").Input("gamma: float").Input("mean: float").Input("inv: float")
    .Output("dx: T").Output("dgamma: float").Output("dbeta: float")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(2));
      c->set_output(2, c->input(2));
      return OkStatus();
    });

template <typename T>
class FusedLayerNormOp : public OpKernel {
 public:
  explicit FusedLayerNormOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& gamma = ctx->input(1);
    const Tensor& beta = ctx->input(2);
    OP_REQUIRES(ctx, x.dims() >= 1, errors::InvalidArgument("x must have rank >= 1"));
    const int64_t d = x.dim_size(x.dims() - 1);
    OP_REQUIRES(ctx, gamma.NumElements() == d && beta.NumElements() == d,
                errors::InvalidArgument("gamma and beta must have x's last dimension"));
    TensorShape rows_shape = x.shape();
    rows_shape.RemoveLastDims(1);
    Tensor *y, *mean, *inv;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, rows_shape, &mean));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, rows_shape, &inv));
    const int64_t rows = d > 0 ? x.NumElements() / d : 0;
    const T* xp = x.flat<T>().data();
    T* yp = y->flat<T>().data();
    const float* g = gamma.flat<float>().data();
    const float* b = beta.flat<float>().data();
    float* mp = mean->flat<float>().data();
    float* ip = inv->flat<float>().data();
    const float eps = epsilon_;
    auto work = [&](int64_t begin, int64_t end) {
      std::vector<float> row(d);
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = xp + r * d;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < d; ++j) { row[j] = to_float(xr[j]); sum += row[j]; }
        const float mu = sum / d;
        float sq = 0.f;
#pragma omp simd reduction(+ : sq)
        for (int64_t j = 0; j < d; ++j) { const float c = row[j] - mu; sq += c * c; }
        const float rs = 1.f / std::sqrt(sq / d + eps);
        mp[r] = mu;
        ip[r] = rs;
        T* yr = yp + r * d;
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) yr[j] = from_float<T>((row[j] - mu) * rs * g[j] + b[j]);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, rows, 8 * d, work);
  }
 private:
  float epsilon_;
};

template <typename T>
class FusedLayerNormGradOp : public OpKernel {
 public:
  explicit FusedLayerNormGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& dy = ctx->input(0);
    const Tensor& x = ctx->input(1);
    const Tensor& gamma = ctx->input(2);
    const Tensor& mean = ctx->input(3);
    const Tensor& inv = ctx->input(4);
    OP_REQUIRES(ctx, dy.shape() == x.shape(), errors::InvalidArgument("dy and x shapes differ"));
    const int64_t d = x.dim_size(x.dims() - 1);
    const int64_t rows = d > 0 ? x.NumElements() / d : 0;
    OP_REQUIRES(ctx, mean.NumElements() == rows && inv.NumElements() == rows,
                errors::InvalidArgument("mean/inv must have one value per row"));
    Tensor *dx, *dgamma, *dbeta;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &dx));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, gamma.shape(), &dgamma));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, gamma.shape(), &dbeta));
    const T* dyp = dy.flat<T>().data();
    const T* xp = x.flat<T>().data();
    T* dxp = dx->flat<T>().data();
    const float* g = gamma.flat<float>().data();
    const float* mp = mean.flat<float>().data();
    const float* ip = inv.flat<float>().data();
    // Rows in fixed blocks, each with its own dgamma/dbeta partial sums (summed in block order:
    // deterministic whatever the thread count).
    const int64_t block = 64;
    const int64_t blocks = (rows + block - 1) / block;
    std::vector<float> partial(2 * blocks * d, 0.f);
    auto work = [&](int64_t begin, int64_t end) {
      std::vector<float> xh(d), gy(d);
      for (int64_t k = begin; k < end; ++k) {
        float* pg = partial.data() + 2 * k * d;
        float* pb = pg + d;
        for (int64_t r = k * block; r < std::min(rows, (k + 1) * block); ++r) {
          const T* xr = xp + r * d;
          const T* dr = dyp + r * d;
          const float mu = mp[r], rs = ip[r];
          float sg = 0.f, sgx = 0.f;
#pragma omp simd reduction(+ : sg, sgx)
          for (int64_t j = 0; j < d; ++j) {
            const float h = (to_float(xr[j]) - mu) * rs;
            const float dyj = to_float(dr[j]);
            const float gj = dyj * g[j];
            xh[j] = h; gy[j] = gj;
            sg += gj; sgx += gj * h;
            pg[j] += dyj * h;
            pb[j] += dyj;
          }
          sg /= d; sgx /= d;
          T* out = dxp + r * d;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) out[j] = from_float<T>(rs * (gy[j] - sg - xh[j] * sgx));
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, blocks, 12 * d * block, work);
    float* dg = dgamma->flat<float>().data();
    float* db = dbeta->flat<float>().data();
    std::fill(dg, dg + d, 0.f);
    std::fill(db, db + d, 0.f);
    for (int64_t k = 0; k < blocks; ++k) {
      const float* pg = partial.data() + 2 * k * d;
      for (int64_t j = 0; j < d; ++j) { dg[j] += pg[j]; db[j] += pg[d + j]; }
    }
  }
};

#define REGISTER(T)                                                                              \
  REGISTER_KERNEL_BUILDER(Name("FusedLayerNorm").Device(DEVICE_CPU).TypeConstraint<T>("T"),     \
                          FusedLayerNormOp<T>);                                                  \
  REGISTER_KERNEL_BUILDER(Name("FusedLayerNormGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
                          FusedLayerNormGradOp<T>);
REGISTER(float)
REGISTER(Eigen::bfloat16)
REGISTER(Eigen::half)

// ---- masked softmax + dropout over the last axis of attention logits [B, N, T, S]
namespace {
#pragma omp declare simd
inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
  return h;
}
// 32 random bits for element j of row r of a call seeded (s0, s1): MurmurHash3's finalizer, twice
// for the row's key, then once per element (32-bit integer arithmetic only, so the row loop vectorizes).
inline uint32_t row_key(uint64_t r, uint32_t s1) {
  return fmix32(static_cast<uint32_t>(r) ^ s1) ^ fmix32(static_cast<uint32_t>(r >> 32) + 0x7f4a7c15u);
}
#pragma omp declare simd
inline uint32_t element_bits(uint32_t j, uint32_t key, uint32_t s0) { return fmix32((j + key) ^ s0); }

// exp(x) for float32, vectorizable: 2^n · p(r) with x = n·ln2 + r, |r| <= ln2/2, a degree-6
// polynomial (relative error ~2e-7); x below -87.3 gives 0.
#pragma omp declare simd
inline float fast_exp(float x) {
  x = std::max(x, -87.33654f);
  x = std::min(x, 88.37626f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = std::fma(n, -0.693359375f, std::fma(n, 2.12194440e-4f, x));
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p * r, r, r + 1.f);
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x <= -87.33654f ? 0.f : p * scale;
}
// The largest of v[0 .. n-1] (n > 0), 16 lanes at a time (a max reduction vectorizes only this way without -ffast-math).
inline float row_max(const float* v, int64_t n) {
  float lanes[16];
  for (int k = 0; k < 16; ++k) lanes[k] = -INFINITY;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; ++k) lanes[k] = lanes[k] > v[j + k] ? lanes[k] : v[j + k];
  float mx = -INFINITY;
  for (int k = 0; k < 16; ++k) mx = mx > lanes[k] ? mx : lanes[k];
  for (; j < n; ++j) mx = mx > v[j] ? mx : v[j];
  return mx;
}
// The softmax passes take rows in groups of this many, each step for all of them before the next:
// one row's reductions are a chain of dependent instructions, and independent chains keep the core busy.
constexpr int64_t kRowsInFlight = 4;
struct DropoutParams {
  float scale;         // 1 / (1 - rate), 0 when rate >= 1
  uint64_t threshold;  // keep when bits >= threshold (0: keep all)
  uint32_t s0, s1;
};
Status GetDropout(OpKernelContext* ctx, int rate_input, int seed_input, DropoutParams* p) {
  const Tensor& rate_t = ctx->input(rate_input);
  const Tensor& seed_t = ctx->input(seed_input);
  if (rate_t.NumElements() != 1) return errors::InvalidArgument("rate must be a scalar");
  if (seed_t.NumElements() != 2) return errors::InvalidArgument("seed must have 2 elements");
  const float rate = rate_t.flat<float>()(0);
  if (!(rate >= 0.f && rate <= 1.f)) return errors::InvalidArgument("rate must be in [0, 1], got ", rate);
  p->threshold = static_cast<uint64_t>(std::llround(static_cast<double>(rate) * 4294967296.0));
  p->scale = rate < 1.f ? 1.f / (1.f - rate) : 0.f;
  p->s0 = static_cast<uint32_t>(seed_t.flat<int32>()(0));
  p->s1 = fmix32(static_cast<uint32_t>(seed_t.flat<int32>()(1)) + 0x9e3779b9u);
  return OkStatus();
}
}  // namespace

REGISTER_OP("FusedAttentionSoftmax")
    .Input("logits: T").Input("mask: bool").Input("rate: float").Input("seed: int32")
    .Output("dropped: T").Output("probs: T").Output("sums: float")
    .Attr("T: {float, bfloat16, half}").Attr("mask_value: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      c->set_output(1, c->input(0));
      shape_inference::ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->Subshape(c->input(0), 0, -1, &rows));
      c->set_output(2, rows);
      return OkStatus();
    });

// d_sums: the gradient of `sums`, [B, N, T], or an empty tensor where `sums` was not used.
REGISTER_OP("FusedAttentionSoftmaxGrad")
    .Input("d_dropped: T").Input("probs: T").Input("rate: float").Input("seed: int32").Input("d_sums: float")
    .Output("d_logits: T")
    .Attr("T: {float, bfloat16, half}")
    .SetShapeFn(shape_inference::UnchangedShape);

template <typename T>
class FusedAttentionSoftmaxOp : public OpKernel {
 public:
  explicit FusedAttentionSoftmaxOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("mask_value", &mask_value_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    const Tensor& mask = ctx->input(1);
    OP_REQUIRES(ctx, logits.dims() == 4, errors::InvalidArgument("logits must be [B, N, T, S]"));
    const int64_t B = logits.dim_size(0), N = logits.dim_size(1), T_ = logits.dim_size(2), S = logits.dim_size(3);
    OP_REQUIRES(ctx, mask.dims() == 3 && mask.dim_size(0) == B && mask.dim_size(1) == T_ && mask.dim_size(2) == S,
                errors::InvalidArgument("mask must be [B, T, S] = [", B, ", ", T_, ", ", S, "], got ",
                                        mask.shape().DebugString()));
    DropoutParams dp;
    OP_REQUIRES_OK(ctx, GetDropout(ctx, 2, 3, &dp));
    Tensor *dropped, *probs, *sums;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, logits.shape(), &dropped));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, logits.shape(), &probs));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({B, N, T_}), &sums));
    const T* lp = logits.flat<T>().data();
    const bool* mp = mask.flat<bool>().data();
    T* yp = dropped->flat<T>().data();
    T* pp = probs->flat<T>().data();
    float* sp = sums->flat<float>().data();
    const float neg = mask_value_;
    auto work = [=](int64_t begin, int64_t end) {
      constexpr int64_t G = kRowsInFlight;
      std::vector<float> buf(G * S);
      float inv[G];
      for (int64_t r0 = begin; r0 < end; r0 += G) {
        const int64_t rows = std::min(G, end - r0);
        for (int64_t k = 0; k < rows; ++k) {
          const int64_t r = r0 + k, b = r / (N * T_), t = r % T_;
          const uint8_t* mr = reinterpret_cast<const uint8_t*>(mp + (b * T_ + t) * S);
          const T* lr = lp + r * S;
          float* v = buf.data() + k * S;
#pragma omp simd
          for (int64_t j = 0; j < S; ++j) v[j] = to_float(lr[j]) + static_cast<float>(1 - mr[j]) * neg;
        }
        for (int64_t k = 0; k < rows; ++k) {
          float* v = buf.data() + k * S;
          const float mx = row_max(v, S);
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < S; ++j) { v[j] = fast_exp(v[j] - mx); sum += v[j]; }
          inv[k] = 1.f / sum;
        }
        for (int64_t k = 0; k < rows; ++k) {
          const int64_t r = r0 + k;
          const float* v = buf.data() + k * S;
          const float in = inv[k];
          T* pr = pp + r * S;
          T* yr = yp + r * S;
          if (dp.threshold == 0) {
#pragma omp simd
            for (int64_t j = 0; j < S; ++j) pr[j] = from_float<T>(v[j] * in);
            std::memcpy(yr, pr, S * sizeof(T));
          } else {
            const uint32_t key = row_key(r, dp.s1), thr = static_cast<uint32_t>(dp.threshold);
            const bool all = dp.threshold > 0xFFFFFFFFull;
            const float scale = dp.scale;
#pragma omp simd
            for (int64_t j = 0; j < S; ++j) {
              const float p = v[j] * in;
              pr[j] = from_float<T>(p);
              const bool keep = !all && element_bits(static_cast<uint32_t>(j), key, dp.s0) >= thr;
              yr[j] = from_float<T>(keep ? p * scale : 0.f);
            }
          }
        }
        // Each row's sum of the weights as stored (rounded to T), as a product with `dropped` reads
        // them; a loop over the rows just written (in L1), which vectorises where one loop did not.
        for (int64_t k = 0; k < rows; ++k) {
          const T* yr = yp + (r0 + k) * S;
          float kept_sum = 0.f;
#pragma omp simd reduction(+ : kept_sum)
          for (int64_t j = 0; j < S; ++j) kept_sum += to_float(yr[j]);
          sp[r0 + k] = kept_sum;
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, B * N * T_, 30 * S, work);
  }
 private:
  float mask_value_;
};

template <typename T>
class FusedAttentionSoftmaxGradOp : public OpKernel {
 public:
  explicit FusedAttentionSoftmaxGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& dy = ctx->input(0);
    const Tensor& probs = ctx->input(1);
    const Tensor& d_sums = ctx->input(4);
    OP_REQUIRES(ctx, dy.shape() == probs.shape() && dy.dims() == 4,
                errors::InvalidArgument("d_dropped and probs must both be [B, N, T, S]"));
    const int64_t S = dy.dim_size(3);
    const int64_t rows = S > 0 ? dy.NumElements() / S : 0;
    const bool with_sums = d_sums.NumElements() > 0;
    OP_REQUIRES(ctx, !with_sums || d_sums.NumElements() == rows,
                errors::InvalidArgument("d_sums must be empty or [B, N, T], got ", d_sums.shape().DebugString()));
    DropoutParams dp;
    OP_REQUIRES_OK(ctx, GetDropout(ctx, 2, 3, &dp));
    Tensor* dl;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, dy.shape(), &dl));
    const T* dyp = dy.flat<T>().data();
    const T* pp = probs.flat<T>().data();
    const float* dsp = with_sums ? d_sums.flat<float>().data() : nullptr;
    T* dlp = dl->flat<T>().data();
    auto work = [&](int64_t begin, int64_t end) {
      constexpr int64_t G = kRowsInFlight;
      std::vector<float> buf(G * S);
      float dot[G];
      for (int64_t r0 = begin; r0 < end; r0 += G) {
        const int64_t rows = std::min(G, end - r0);
        for (int64_t k = 0; k < rows; ++k) {
          const int64_t r = r0 + k;
          const T* dr = dyp + r * S;
          const T* pr = pp + r * S;
          float* g = buf.data() + k * S;
          const float row_grad = with_sums ? dsp[r] : 0.f;  // d sums / d dropped = 1 for every element
          if (dp.threshold == 0) {
#pragma omp simd
            for (int64_t j = 0; j < S; ++j) g[j] = to_float(dr[j]) + row_grad;
          } else {
            const uint32_t key = row_key(r, dp.s1), thr = static_cast<uint32_t>(dp.threshold);
            const bool all = dp.threshold > 0xFFFFFFFFull;
            const float scale = dp.scale;
#pragma omp simd
            for (int64_t j = 0; j < S; ++j)
              g[j] = (!all && element_bits(static_cast<uint32_t>(j), key, dp.s0) >= thr)
                         ? (to_float(dr[j]) + row_grad) * scale : 0.f;
          }
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j < S; ++j) s += g[j] * to_float(pr[j]);
          dot[k] = s;
        }
        for (int64_t k = 0; k < rows; ++k) {
          const int64_t r = r0 + k;
          const T* pr = pp + r * S;
          const float* g = buf.data() + k * S;
          const float s = dot[k];
          T* out = dlp + r * S;
#pragma omp simd
          for (int64_t j = 0; j < S; ++j) out[j] = from_float<T>(to_float(pr[j]) * (g[j] - s));
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, rows, 12 * S, work);
  }
};

#define REGISTER_SOFTMAX(T)                                                                               \
  REGISTER_KERNEL_BUILDER(Name("FusedAttentionSoftmax").Device(DEVICE_CPU).TypeConstraint<T>("T"),       \
                          FusedAttentionSoftmaxOp<T>);                                                    \
  REGISTER_KERNEL_BUILDER(Name("FusedAttentionSoftmaxGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),   \
                          FusedAttentionSoftmaxGradOp<T>);
REGISTER_SOFTMAX(float)
REGISTER_SOFTMAX(Eigen::bfloat16)
REGISTER_SOFTMAX(Eigen::half)

// ---- label-smoothed cross-entropy over the last axis of logits [..., V], from the logits' own dtype
//
//   FusedCrossEntropy: per row, loss = logsumexp(z) − (1 − s)·z[label] − (s/V)·Σz (float32 inside),
//     logsumexp(z) kept for the gradient, and max z (for the accuracy: no second pass over z).
//   FusedCrossEntropyGrad: d loss / d z = (softmax(z) − (1 − s)·one_hot(label) − s/V)·upstream, in the
//     logits' dtype, the softmax recomputed from z and logsumexp (no [rows, V] float32 tensor either way).
REGISTER_OP("FusedCrossEntropy")
    .Input("logits: T").Input("labels: int32")
    .Output("loss: float").Output("log_normalizer: float").Output("row_max: float")
    .Attr("T: {float, bfloat16, half}").Attr("smoothing: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->input(1));
      c->set_output(2, c->input(1));
      return OkStatus();
    });

REGISTER_OP("FusedCrossEntropyGrad")
    .Input("logits: T").Input("labels: int32").Input("log_normalizer: float").Input("upstream: float")
    .Output("d_logits: T")
    .Attr("T: {float, bfloat16, half}").Attr("smoothing: float")
    .SetShapeFn(shape_inference::UnchangedShape);

namespace {
// rows and V of logits [..., V] against labels [...]; an error names the mismatch or a label out of range.
Status CrossEntropyShapes(const Tensor& logits, const Tensor& labels, int64_t* rows, int64_t* V) {
  if (logits.dims() < 1) return errors::InvalidArgument("logits must have rank >= 1");
  *V = logits.dim_size(logits.dims() - 1);
  *rows = *V > 0 ? logits.NumElements() / *V : 0;
  if (labels.NumElements() != *rows || labels.dims() != logits.dims() - 1)
    return errors::InvalidArgument("labels ", labels.shape().DebugString(), " must be logits' shape ",
                                   logits.shape().DebugString(), " without its last axis");
  const int32* lab = labels.flat<int32>().data();
  for (int64_t r = 0; r < *rows; ++r)
    if (lab[r] < 0 || lab[r] >= *V) return errors::InvalidArgument("label ", lab[r], " out of [0, ", *V, ")");
  return OkStatus();
}
}  // namespace

template <typename T>
class FusedCrossEntropyOp : public OpKernel {
 public:
  explicit FusedCrossEntropyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("smoothing", &smoothing_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    int64_t rows, V;
    OP_REQUIRES_OK(ctx, CrossEntropyShapes(logits, labels, &rows, &V));
    Tensor *loss, *lse, *maxima;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, labels.shape(), &loss));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, labels.shape(), &lse));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, labels.shape(), &maxima));
    const T* zp = logits.flat<T>().data();
    const int32* lab = labels.flat<int32>().data();
    float* lp = loss->flat<float>().data();
    float* np_ = lse->flat<float>().data();
    float* mp = maxima->flat<float>().data();
    const float s = smoothing_;
    auto work = [&](int64_t begin, int64_t end) {
      std::vector<float> row(V);
      for (int64_t r = begin; r < end; ++r) {
        const T* zr = zp + r * V;
        float* v = row.data();
        float total = 0.f;
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < V; ++j) { v[j] = to_float(zr[j]); total += v[j]; }
        const float mx = row_max(v, V);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < V; ++j) sum += fast_exp(v[j] - mx);
        const float normalizer = mx + std::log(sum);
        np_[r] = normalizer;
        mp[r] = mx;
        lp[r] = normalizer - (1.f - s) * v[lab[r]] - (s / V) * total;
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, rows, 12 * V, work);
  }
 private:
  float smoothing_;
};

template <typename T>
class FusedCrossEntropyGradOp : public OpKernel {
 public:
  explicit FusedCrossEntropyGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("smoothing", &smoothing_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    const Tensor& lse = ctx->input(2);
    const Tensor& upstream = ctx->input(3);
    int64_t rows, V;
    OP_REQUIRES_OK(ctx, CrossEntropyShapes(logits, labels, &rows, &V));
    OP_REQUIRES(ctx, lse.NumElements() == rows && upstream.NumElements() == rows,
                errors::InvalidArgument("log_normalizer and upstream must have one value per row"));
    Tensor* dz;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, logits.shape(), &dz));
    const T* zp = logits.flat<T>().data();
    const int32* lab = labels.flat<int32>().data();
    const float* np_ = lse.flat<float>().data();
    const float* up = upstream.flat<float>().data();
    T* dp = dz->flat<T>().data();
    const float s = smoothing_;
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* zr = zp + r * V;
        T* dr = dp + r * V;
        const float u = up[r], normalizer = np_[r], floor = s / V * u;
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) dr[j] = from_float<T>(fast_exp(to_float(zr[j]) - normalizer) * u - floor);
        const int64_t y = lab[r];
        dr[y] = from_float<T>(fast_exp(to_float(zr[y]) - normalizer) * u - floor - (1.f - s) * u);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, rows, 10 * V, work);
  }
 private:
  float smoothing_;
};

#define REGISTER_CROSS_ENTROPY(T)                                                                      \
  REGISTER_KERNEL_BUILDER(Name("FusedCrossEntropy").Device(DEVICE_CPU).TypeConstraint<T>("T"),         \
                          FusedCrossEntropyOp<T>);                                                      \
  REGISTER_KERNEL_BUILDER(Name("FusedCrossEntropyGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),     \
                          FusedCrossEntropyGradOp<T>);
REGISTER_CROSS_ENTROPY(float)
REGISTER_CROSS_ENTROPY(Eigen::bfloat16)
REGISTER_CROSS_ENTROPY(Eigen::half)

// ---- bias (+ ReLU) (+ dropout) on a matrix product's rows, in place when TensorFlow lets the input go
//
//   FusedBiasRelu: dropout(act(y [..., d] + bias [d])), act = max(·, 0) if `relu` else identity,
//     float32 inside, one pass; dropout at `rate` with the hash stream of the attention kernels
//     (rate 0: none). A bfloat16 product then runs as oneDNN's plain matmul (AMX), where a
//     product fused with its bias ran as its slower `inner_product` (docs/speed.md).
//   FusedBiasReluGrad: from the upstream gradient and FusedBiasRelu's output, ∂(y + bias) (the
//     ReLU's and the dropout's masks applied, the dropout mask recomputed from the seed) and
//     ∂bias = Σ rows of it, summed in float32 in fixed blocks of rows (deterministic).
REGISTER_OP("FusedBiasRelu")
    .Input("y: T").Input("bias: T").Input("rate: float").Input("seed: int32")
    .Output("out: T")
    .Attr("T: {float, bfloat16, half}").Attr("relu: bool")
    .SetShapeFn(shape_inference::UnchangedShape);

REGISTER_OP("FusedBiasReluGrad")
    .Input("upstream: T").Input("out: T").Input("rate: float").Input("seed: int32")
    .Output("d_y: T").Output("d_bias: T")
    .Attr("T: {float, bfloat16, half}").Attr("relu: bool")
    .SetShapeFn(ShapeAndColumnSums);

template <typename T>
class FusedBiasReluOp : public OpKernel {
 public:
  explicit FusedBiasReluOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("relu", &relu_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& y = ctx->input(0);
    const Tensor& bias = ctx->input(1);
    OP_REQUIRES(ctx, y.dims() >= 1 && bias.dims() == 1 && bias.dim_size(0) == y.dim_size(y.dims() - 1),
                errors::InvalidArgument("bias must be [d] for y [..., d], got ", bias.shape().DebugString(),
                                        " and ", y.shape().DebugString()));
    DropoutParams dp;
    OP_REQUIRES_OK(ctx, GetDropout(ctx, 2, 3, &dp));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, y.shape(), &out));
    const int64_t d = bias.dim_size(0);
    const int64_t rows = d > 0 ? y.NumElements() / d : 0;
    const T* yp = y.flat<T>().data();
    T* op = out->flat<T>().data();
    std::vector<float> b(d);
    for (int64_t j = 0; j < d; ++j) b[j] = to_float(bias.flat<T>()(j));
    const float* bp = b.data();
    const bool relu = relu_;
    // Every loop reads only locals (no captured references): the compiler vectorizes it.
    auto work = [=](int64_t begin, int64_t end) {
      const uint32_t thr = static_cast<uint32_t>(dp.threshold), s0 = dp.s0, s1 = dp.s1;
      const bool dropout = dp.threshold != 0, all = dp.threshold > 0xFFFFFFFFull;
      const float scale = dp.scale, floor = relu ? 0.f : -INFINITY;
      for (int64_t r = begin; r < end; ++r) {
        const T* yr = yp + r * d;
        T* orow = op + r * d;
        if (!dropout) {
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) orow[j] = from_float<T>(std::max(to_float(yr[j]) + bp[j], floor));
        } else {
          const uint32_t key = row_key(r, s1);
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) {
            const float v = std::max(to_float(yr[j]) + bp[j], floor);
            const bool keep = !all && element_bits(static_cast<uint32_t>(j), key, s0) >= thr;
            orow[j] = from_float<T>(keep ? v * scale : 0.f);
          }
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, rows, (dp.threshold ? 12 : 3) * d, work);
  }
 private:
  bool relu_;
};

template <typename T>
class FusedBiasReluGradOp : public OpKernel {
 public:
  explicit FusedBiasReluGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("relu", &relu_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& up = ctx->input(0);
    const Tensor& out = ctx->input(1);
    OP_REQUIRES(ctx, up.dims() >= 1 && up.shape() == out.shape(),
                errors::InvalidArgument("upstream and out must have one shape [..., d], got ",
                                        up.shape().DebugString(), " and ", out.shape().DebugString()));
    DropoutParams dp;
    OP_REQUIRES_OK(ctx, GetDropout(ctx, 2, 3, &dp));
    const int64_t d = up.dim_size(up.dims() - 1);
    const int64_t rows = d > 0 ? up.NumElements() / d : 0;
    Tensor *dy, *db;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, up.shape(), &dy));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({d}), &db));
    const T* upp = up.flat<T>().data();
    const T* outp = out.flat<T>().data();
    T* dyp = dy->flat<T>().data();
    const bool relu = relu_;
    // With ReLU, an element's gradient flows where the output is > 0: kept by the dropout and
    // positive (a dropped or clipped element is 0), so the dropout mask needs no recomputing.
    const bool hash = !relu && dp.threshold != 0;
    const int64_t block = 64;
    const int64_t blocks = (rows + block - 1) / block;
    std::vector<float> partial(blocks * d, 0.f);
    float* partials = partial.data();
    auto work = [=](int64_t begin, int64_t end) {
      const uint32_t thr = static_cast<uint32_t>(dp.threshold), s0 = dp.s0, s1 = dp.s1;
      const bool all = dp.threshold > 0xFFFFFFFFull;
      const float scale = dp.threshold == 0 ? 1.f : dp.scale;
      for (int64_t k = begin; k < end; ++k) {
        float* pb = partials + k * d;
        for (int64_t r = k * block; r < std::min(rows, (k + 1) * block); ++r) {
          const T* ur = upp + r * d;
          const T* orow = outp + r * d;
          T* gr = dyp + r * d;
          if (relu) {
#pragma omp simd
            for (int64_t j = 0; j < d; ++j) {
              gr[j] = from_float<T>(to_float(orow[j]) > 0.f ? to_float(ur[j]) * scale : 0.f);
              pb[j] += to_float(gr[j]);  // (a T temporary instead keeps GCC from vectorizing)
            }
          } else if (hash) {
            const uint32_t key = row_key(r, s1);
#pragma omp simd
            for (int64_t j = 0; j < d; ++j) {
              const bool keep = !all && element_bits(static_cast<uint32_t>(j), key, s0) >= thr;
              gr[j] = from_float<T>(keep ? to_float(ur[j]) * scale : 0.f);
              pb[j] += to_float(gr[j]);
            }
          } else if (gr == ur) {  // the upstream's buffer handed over: the gradient is already in place
#pragma omp simd
            for (int64_t j = 0; j < d; ++j) pb[j] += to_float(ur[j]);
          } else {
#pragma omp simd
            for (int64_t j = 0; j < d; ++j) {
              const float g = to_float(ur[j]);
              gr[j] = from_float<T>(g);  // exact: g holds a T
              pb[j] += g;
            }
          }
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, blocks, (hash ? 12 : 4) * d * block, work);
    std::vector<float> sum(d);
    SumBlocks(partials, blocks, d, sum.data());
    T* dbp = db->flat<T>().data();
    for (int64_t j = 0; j < d; ++j) dbp[j] = from_float<T>(sum[j]);
  }
 private:
  bool relu_;
};

#define REGISTER_BIAS(T)                                                                         \
  REGISTER_KERNEL_BUILDER(Name("FusedBiasRelu").Device(DEVICE_CPU).TypeConstraint<T>("T"),      \
                          FusedBiasReluOp<T>);                                                   \
  REGISTER_KERNEL_BUILDER(Name("FusedBiasReluGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),  \
                          FusedBiasReluGradOp<T>);
REGISTER_BIAS(float)
REGISTER_BIAS(Eigen::bfloat16)
REGISTER_BIAS(Eigen::half)

// ---- a float32 gradient rounded to a narrower dtype, and its column sums, in one pass
//
//   FusedCastSum: x [N, d] float32 → (y = x in `Tout`, Σ rows of x [d] float32, in fixed blocks of
//     rows: deterministic). The output projection's bfloat16 gradient products read y; its bias
//     gradient is the sums (transformer/model/logits.py).
REGISTER_OP("FusedCastSum")
    .Input("x: float")
    .Output("y: Tout").Output("sums: float")
    .Attr("Tout: {bfloat16, half}")
    .SetShapeFn(ShapeAndColumnSums);

template <typename Tout>
class FusedCastSumOp : public OpKernel {
 public:
  explicit FusedCastSumOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    OP_REQUIRES(ctx, x.dims() >= 1, errors::InvalidArgument("x must have rank >= 1"));
    const int64_t d = x.dim_size(x.dims() - 1);
    const int64_t rows = d > 0 ? x.NumElements() / d : 0;
    Tensor *y, *sums;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x.shape(), &y));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({d}), &sums));
    const float* xp = x.flat<float>().data();
    Tout* yp = y->flat<Tout>().data();
    const int64_t block = 64;
    const int64_t blocks = (rows + block - 1) / block;
    std::vector<float> partial(blocks * d, 0.f);
    float* partials = partial.data();
    auto work = [=](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        float* pb = partials + k * d;
        for (int64_t r = k * block; r < std::min(rows, (k + 1) * block); ++r) {
          const float* xr = xp + r * d;
          Tout* yr = yp + r * d;
#pragma omp simd
          for (int64_t j = 0; j < d; ++j) { yr[j] = from_float<Tout>(xr[j]); pb[j] += xr[j]; }
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, blocks, 4 * d * block, work);
    SumBlocks(partials, blocks, d, sums->flat<float>().data());
  }
};

REGISTER_KERNEL_BUILDER(Name("FusedCastSum").Device(DEVICE_CPU).TypeConstraint<Eigen::bfloat16>("Tout"),
                        FusedCastSumOp<Eigen::bfloat16>);
REGISTER_KERNEL_BUILDER(Name("FusedCastSum").Device(DEVICE_CPU).TypeConstraint<Eigen::half>("Tout"),
                        FusedCastSumOp<Eigen::half>);

// ---- many small float32 matrix products: the attention's per-(row, head) products
//
//   SmallBatchMatMul: z[b] = op(x[b]) · op(y[b]) for every leading index b (equal leading axes, no
//     broadcasting), op = transpose where `adj_x` / `adj_y`. TensorFlow's own BatchMatMul without its
//     oneDNN ops runs each `[32, 32] × [32, 32]` product as an Eigen tensor contraction, ~6 GFLOP/s
//     on an AVX2 EPYC; Eigen's dense matrix product on the same matrices runs 2-4x as fast
//     (docs/speed.md). Products are split over the intra-op threads; each is computed by one thread.
REGISTER_OP("SmallBatchMatMul")
    .Input("x: float").Input("y: float")
    .Output("z: float")
    .Attr("adj_x: bool = false").Attr("adj_y: bool = false")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle x, y, batch, out;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 3, &x));
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(1), 3, &y));
      bool adj_x, adj_y;
      TF_RETURN_IF_ERROR(c->GetAttr("adj_x", &adj_x));
      TF_RETURN_IF_ERROR(c->GetAttr("adj_y", &adj_y));
      TF_RETURN_IF_ERROR(c->Subshape(x, 0, -2, &batch));
      TF_RETURN_IF_ERROR(c->Concatenate(batch, c->Matrix(c->Dim(x, adj_x ? -1 : -2), c->Dim(y, adj_y ? -2 : -1)), &out));
      c->set_output(0, out);
      return OkStatus();
    });

class SmallBatchMatMulOp : public OpKernel {
 public:
  explicit SmallBatchMatMulOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("adj_x", &adj_x_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("adj_y", &adj_y_));
  }
  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const Tensor& y = ctx->input(1);
    const int r = x.dims();
    bool batch_equal = r >= 3 && y.dims() == r;
    for (int i = 0; batch_equal && i < r - 2; ++i) batch_equal = x.dim_size(i) == y.dim_size(i);
    OP_REQUIRES(ctx, batch_equal,
                errors::InvalidArgument("x and y must be [..., M, K] and [..., K, N] with the same leading axes, got ",
                                        x.shape().DebugString(), " and ", y.shape().DebugString()));
    const int64_t xr = x.dim_size(r - 2), xc = x.dim_size(r - 1), yr = y.dim_size(r - 2), yc = y.dim_size(r - 1);
    const int64_t m = adj_x_ ? xc : xr, k = adj_x_ ? xr : xc, n = adj_y_ ? yr : yc;
    OP_REQUIRES(ctx, k == (adj_y_ ? yc : yr),
                errors::InvalidArgument("inner dimensions differ: ", x.shape().DebugString(), " (adj_x ", adj_x_,
                                        ") and ", y.shape().DebugString(), " (adj_y ", adj_y_, ")"));
    TensorShape shape = x.shape();
    shape.set_dim(r - 2, m);
    shape.set_dim(r - 1, n);
    Tensor* z;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &z));
    if (z->NumElements() == 0) return;
    const int64_t batch = z->NumElements() / (m * n);
    if (k == 0) { z->flat<float>().setZero(); return; }
    const float* xp = x.flat<float>().data();
    const float* yp = y.flat<float>().data();
    float* zp = z->flat<float>().data();
    using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const bool adj_x = adj_x_, adj_y = adj_y_;
    auto work = [=](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        Eigen::Map<const Matrix> xb(xp + b * xr * xc, xr, xc);
        Eigen::Map<const Matrix> yb(yp + b * yr * yc, yr, yc);
        Eigen::Map<Matrix> zb(zp + b * m * n, m, n);
        if (adj_x && adj_y) zb.noalias() = xb.transpose() * yb.transpose();
        else if (adj_x) zb.noalias() = xb.transpose() * yb;
        else if (adj_y) zb.noalias() = xb * yb.transpose();
        else zb.noalias() = xb * yb;
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, batch, 2 * m * n * k, work);
  }
 private:
  bool adj_x_, adj_y_;
};

REGISTER_KERNEL_BUILDER(Name("SmallBatchMatMul").Device(DEVICE_CPU), SmallBatchMatMulOp);
