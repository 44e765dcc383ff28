// The CUDA backend's own kernels (launchers and contracts in kernels.h). One translation unit,
// so the four architectures compile it once each: the build stays a few .cu-minutes on 2 cores.
//
// Arithmetic follows the host code the tests compare against (shared/runtime/ops.cc,
// shared/sparsity/neuron_ffn.h): the same formulas in fp32, summed in a different order.
#include <cuda_fp16.h>

#include "gpu_worker/cuda/block_decode.h"
#include "gpu_worker/cuda/kernels.h"

namespace thermocline::gpu_worker::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kQK = 32;  // elements per Q8_0 / Q4_0 block (ggml_type.h)

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the block; every thread gets the result. `red` holds one float per warp.
template <bool kMax>
__device__ float BlockReduce(float v, float* red) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int n_warps = (blockDim.x + kWarp - 1) / kWarp;
  v = kMax ? WarpMax(v) : WarpSum(v);
  __syncthreads();  // `red` may still be read by a previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = lane < n_warps ? red[lane] : (kMax ? -INFINITY : 0.0f);
  r = kMax ? WarpMax(r) : WarpSum(r);
  return r;
}

__device__ __forceinline__ float HalfBits(const uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}

// ---- weight rows by block type: one FFN kernel template serves all three ----
// BlockDot: the dot product of block b (32 elements) of a row with h[32 b ..].
// Load: element c of a row.

struct F16Rows {
  __device__ static float BlockDot(const uint8_t* row, int64_t b, const float* h) {
    const __half2* p = reinterpret_cast<const __half2*>(row) + b * (kQK / 2);
    const float* x = h + b * kQK;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kQK / 2; ++j) {
      const float2 w = __half22float2(p[j]);
      s += w.x * x[2 * j] + w.y * x[2 * j + 1];
    }
    return s;
  }
  __device__ static float Load(const uint8_t* row, int64_t c) {
    return __half2float(reinterpret_cast<const __half*>(row)[c]);
  }
};

struct Q8Rows {  // {fp16 d; int8 qs[32]}: x = q * d
  static constexpr int kBytes = 34;
  __device__ static float BlockDot(const uint8_t* row, int64_t b, const float* h) {
    const uint8_t* blk = row + b * kBytes;
    const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
    const float* x = h + b * kQK;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kQK; ++j) s += static_cast<float>(q[j]) * x[j];
    return s * HalfBits(blk);
  }
  __device__ static float Load(const uint8_t* row, int64_t c) {
    return blocks::Q8_0::Element(row, c);
  }
};

struct Q4Rows {  // {fp16 d; uint8 qs[16]}: byte j = element j (low nibble), j + 16 (high)
  static constexpr int kBytes = 18;
  __device__ static float BlockDot(const uint8_t* row, int64_t b, const float* h) {
    const uint8_t* blk = row + b * kBytes;
    const uint8_t* q = blk + 2;
    const float* x = h + b * kQK;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kQK / 2; ++j) {
      s += static_cast<float>((q[j] & 0x0F) - 8) * x[j];
      s += static_cast<float>((q[j] >> 4) - 8) * x[j + kQK / 2];
    }
    return s * HalfBits(blk);
  }
  __device__ static float Load(const uint8_t* row, int64_t c) {
    return blocks::Q4_0::Element(row, c);
  }
};

// Any block type of block_decode.h: each 32-element stretch decoded element by element (every
// block size is a multiple of 32, so a stretch lies in one block).
template <class D>
struct DecodedRows {
  __device__ static float BlockDot(const uint8_t* row, int64_t b, const float* h) {
    const float* x = h + b * kQK;
    float s = 0.0f;
#pragma unroll 8
    for (int j = 0; j < kQK; ++j) s += D::Element(row, b * kQK + j) * x[j];
    return s;
  }
  __device__ static float Load(const uint8_t* row, int64_t c) { return D::Element(row, c); }
};

// One warp: the dot product of a whole row with h (lanes take blocks in turn, so the warp
// reads consecutive bytes).
template <typename W>
__device__ float WarpRowDot(const uint8_t* row, const float* h, int64_t dim) {
  const int lane = threadIdx.x % kWarp;
  float s = 0.0f;
  for (int64_t b = lane; b < dim / kQK; b += kWarp) s += W::BlockDot(row, b, h);
  return WarpSum(s);
}

// ---- norms, conversions, rope ----

__global__ void RmsNormKernel(const float* x, const float* w, const int32_t* row_map, int64_t n,
                              float eps, float* out, __half* out_half) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + (row_map ? row_map[r] : r) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockReduce<false>(ss, red);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = w[i] * (scale * xr[i]);
    if (out) out[r * n + i] = v;
    if (out_half) out_half[r * n + i] = __float2half_rn(v);
  }
}

__global__ void LayerNormKernel(const float* x, const float* w, const float* b,
                                const int32_t* row_map, int64_t n, float eps, float* out,
                                __half* out_half) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x;
  const float* xr = x + (row_map ? row_map[r] : r) * n;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += xr[i];
  const float mean = BlockReduce<false>(sum, red) / static_cast<float>(n);
  float var = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) var += (xr[i] - mean) * (xr[i] - mean);
  var = BlockReduce<false>(var, red) / static_cast<float>(n);
  const float scale = 1.0f / sqrtf(var + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float y = (xr[i] - mean) * scale * w[i];
    const float v = b ? y + b[i] : y;
    if (out) out[r * n + i] = v;
    if (out_half) out_half[r * n + i] = __float2half_rn(v);
  }
}

__global__ void AddBiasKernel(float* y, const float* b, int64_t rows, int64_t n) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= rows * n) return;
  y[t] += b[t % n];
}

__global__ void ToHalfKernel(const float* x, int64_t n, bool relu, __half* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  out[i] = __float2half_rn(relu ? fmaxf(x[i], 0.0f) : x[i]);
}

__global__ void RopeKernel(float* x, int64_t rows, int64_t row_stride, int64_t n_heads,
                           RopeDesc p, const int32_t* positions) {
  const int64_t pairs = p.rope_dim / 2;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= rows * n_heads * pairs) return;
  const int64_t r = t / (n_heads * pairs), h = (t / pairs) % n_heads, i = 2 * (t % pairs);
  // The same float operations as ops.cc's RopeExt: base^(i / rope_dim), pos * freq, then
  // llama.cpp's adjustments in its order.
  const float freq = 1.0f / powf(p.base, static_cast<float>(i) / static_cast<float>(p.rope_dim));
  float theta_extrap = static_cast<float>(positions[r]) * freq;
  if (p.freq_factors) theta_extrap /= p.freq_factors[i / 2];
  float theta = p.freq_scale * theta_extrap;
  float mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) {
    const float y = (static_cast<float>(i / 2) - p.corr_low) / fmaxf(0.001f, p.corr_high - p.corr_low);
    const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * p.ext_factor;
    theta = theta * (1.0f - ramp) + theta_extrap * ramp;
    mscale *= 1.0f + 0.1f * logf(1.0f / p.freq_scale);
  }
  const float fcr = cosf(theta) * mscale, fci = sinf(theta) * mscale;
  float* v = x + r * row_stride + h * p.head_dim;
  float* a = p.neox ? v + i / 2 : v + i;
  float* b = p.neox ? v + i / 2 + pairs : v + i + 1;
  const float v0 = *a, v1 = *b;
  *a = v0 * fcr - v1 * fci;
  *b = v0 * fci + v1 * fcr;
}

// ---- KV cache and attention ----

__device__ __forceinline__ void StoreKv(float* p, float v) { *p = v; }
__device__ __forceinline__ void StoreKv(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ float LoadKv(const float* p) { return *p; }
__device__ __forceinline__ float LoadKv(const __half* p) { return __half2float(*p); }

template <typename T>
__global__ void KvStoreKernel(KvDesc kv, int64_t layer, const float* k, const float* v,
                              const int32_t* slots, const int32_t* positions, int64_t rows) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= rows * kv.kv_dim) return;
  const int64_t r = t / kv.kv_dim, i = t % kv.kv_dim;
  const int64_t off = ((layer * kv.n_slots + slots[r]) * kv.capacity + positions[r]) * kv.kv_dim + i;
  StoreKv(static_cast<T*>(kv.k) + off, k[t]);
  StoreKv(static_cast<T*>(kv.v) + off, v[t]);
}

// One block per (row, query head): warps take positions in turn for the scores (a warp reads
// one key row at a time, coalesced), then threads take output dims for the weighted sum.
template <typename T>
__global__ void AttentionKernel(KvDesc kv, int64_t layer, const float* q, const int32_t* slots,
                                const int32_t* positions, AttentionDesc att, float* scores,
                                float* out) {
  __shared__ float red[32];
  const int64_t r = blockIdx.x, h = blockIdx.y;
  const int64_t n_heads = att.n_heads, head_dim = att.head_dim;
  const int64_t n_pos = static_cast<int64_t>(positions[r]) + 1;
  // A sliding-window layer sees the last `window` positions, itself included.
  const int64_t first = att.window > 0 && n_pos > att.window ? n_pos - att.window : 0;
  const int64_t kv_off = (h / (n_heads / att.n_kv_heads)) * head_dim;
  const int64_t base = (layer * kv.n_slots + slots[r]) * kv.capacity;
  const T* keys = static_cast<const T*>(kv.k);
  const T* vals = static_cast<const T*>(kv.v);
  const float* qh = q + r * n_heads * head_dim + h * head_dim;
  float* s = scores + (r * n_heads + h) * kv.capacity;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int n_warps = blockDim.x / kWarp;
  for (int64_t t = first + warp; t < n_pos; t += n_warps) {
    const T* kr = keys + (base + t) * kv.kv_dim + kv_off;
    float d = 0.0f;
    for (int64_t i = lane; i < head_dim; i += kWarp) d += qh[i] * LoadKv(kr + i);
    d = WarpSum(d) * att.scale;
    if (att.softcap > 0.0f) d = att.softcap * tanhf(d / att.softcap);
    if (lane == 0) s[t] = d;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int64_t t = first + threadIdx.x; t < n_pos; t += blockDim.x) m = fmaxf(m, s[t]);
  m = BlockReduce<true>(m, red);
  float sum = 0.0f;
  for (int64_t t = first + threadIdx.x; t < n_pos; t += blockDim.x) {
    const float e = expf(s[t] - m);
    s[t] = e;
    sum += e;
  }
  sum = BlockReduce<false>(sum, red);  // its barriers also publish s[] to the block
  const float inv = 1.0f / sum;
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t t = first; t < n_pos; ++t) acc += (s[t] * inv) * LoadKv(vals + (base + t) * kv.kv_dim + kv_off + i);
    out[r * n_heads * head_dim + h * head_dim + i] = acc;
  }
}

// ---- predictor selection ----

// Order-preserving compaction: the block walks the neurons in chunks of blockDim; within a
// chunk, warp ballots and a prefix over the warps' counts give each active neuron its place.
__global__ void PredictSelectKernel(const float* scores, int64_t ffn, float threshold,
                                    const int32_t* hot_slot, int32_t* hot_idx, int32_t* hot_count,
                                    int32_t* cold_ids, int32_t* cold_count) {
  __shared__ int warp_hot[32], warp_cold[32];
  __shared__ int base_hot, base_cold;
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int n_warps = blockDim.x / kWarp;
  if (threadIdx.x == 0) base_hot = base_cold = 0;
  __syncthreads();
  for (int64_t c0 = 0; c0 < ffn; c0 += blockDim.x) {
    const int64_t i = c0 + threadIdx.x;
    const bool active = i < ffn && scores[r * ffn + i] >= threshold;
    const int32_t slot = active ? hot_slot[i] : -1;
    const bool is_hot = active && slot >= 0, is_cold = active && slot < 0;
    const unsigned bh = __ballot_sync(0xffffffffu, is_hot);
    const unsigned bc = __ballot_sync(0xffffffffu, is_cold);
    if (lane == 0) {
      warp_hot[warp] = __popc(bh);
      warp_cold[warp] = __popc(bc);
    }
    __syncthreads();
    int off_hot = base_hot, off_cold = base_cold;
    for (int w = 0; w < warp; ++w) {
      off_hot += warp_hot[w];
      off_cold += warp_cold[w];
    }
    const unsigned below = (1u << lane) - 1u;
    if (is_hot) hot_idx[r * ffn + off_hot + __popc(bh & below)] = slot;
    if (is_cold) cold_ids[r * ffn + off_cold + __popc(bc & below)] = static_cast<int32_t>(i);
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < n_warps; ++w) {
        base_hot += warp_hot[w];
        base_cold += warp_cold[w];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    hot_count[r] = base_hot;
    cold_count[r] = base_cold;
  }
}

__global__ void PackColdKernel(const int32_t* cold_ids, const int32_t* cold_count, int64_t stride,
                               int32_t* packed, uint32_t* row_end) {
  __shared__ int64_t begin;
  const int64_t r = blockIdx.x;
  if (threadIdx.x == 0) {
    int64_t b = 0;
    for (int64_t j = 0; j < r; ++j) b += cold_count[j];
    begin = b;
    row_end[r] = static_cast<uint32_t>(b + cold_count[r]);
  }
  __syncthreads();
  for (int64_t k = threadIdx.x; k < cold_count[r]; k += blockDim.x) {
    packed[begin + k] = cold_ids[r * stride + k];
  }
}

// ---- the sparse hot FFN ----

__device__ __forceinline__ int32_t CandidateCount(const HotFfnArgs& a, int64_t r) {
  return a.counts ? a.counts[r] : a.fixed_count;
}

// act(g) as ops.cc / neuron_ffn.cc compute it: relu; silu as v * (1 / (1 + exp(-v))); GELU as
// ggml's table, the tanh form of the fp16-rounded input rounded to fp16 (and 0 / x beyond
// -10 / 10).
__device__ __forceinline__ float Act(HotAct act, float g) {
  switch (act) {
    case HotAct::kRelu:
    case HotAct::kDrelu:
      return g > 0.0f ? g : 0.0f;
    case HotAct::kGelu: {
      if (g <= -10.0f) return 0.0f;
      if (g >= 10.0f) return g;
      const float x = __half2float(__float2half_rn(g));
      const float y = 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
      return __half2float(__float2half_rn(y));
    }
    case HotAct::kSilu:
      break;
  }
  return g * (1.0f / (1.0f + expf(-g)));
}

// Gate and up: one warp per candidate. Writes each candidate's coefficient (0 when filtered).
template <typename W>
__global__ void HotGateUpKernel(HotFfnArgs a) {
  const int64_t r = blockIdx.y;
  const int warps = blockDim.x / kWarp;
  const int64_t k = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int32_t count = CandidateCount(a, r);
  if (a.stats && blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(a.stats + 1, static_cast<uint32_t>(count));
  if (k >= count) return;
  const int64_t n = a.idx[r * a.idx_stride + k];
  const float* h = a.h + r * a.dim;
  const bool gated = a.gate != nullptr;
  // The selector: the gate, or up plus its bias in an FFN without a gate.
  float g = WarpRowDot<W>((gated ? a.gate : a.up) + n * a.row_bytes, h, a.dim);
  if (!gated && a.up_b) g += a.up_b[n];
  const float act = Act(a.act, g);
  const float cut = a.row_cut ? a.row_cut[2 * n] : a.cut;
  const float coeff_cut = a.row_cut ? a.row_cut[2 * n + 1] : a.coeff_cut;
  bool pass = true;
  if (a.filter == 1) pass = act > 0.0f;
  if (a.filter == 2) pass = fabsf(act) >= cut;
  float c = 0.0f;
  if (pass) {
    c = act;
    if (gated) {
      float u = WarpRowDot<W>(a.up + n * a.row_bytes, h, a.dim);
      if (a.up_b) u += a.up_b[n];
      c = a.act == HotAct::kDrelu ? act * (u > 0.0f ? u : 0.0f) : act * u;
    }
    if (coeff_cut > 0.0f && fabsf(c) < coeff_cut) c = 0.0f;
    if (a.scale) c *= a.scale[r * a.idx_stride + k];
    if (a.stats && lane == 0) atomicAdd(a.stats, 1u);
  }
  if (lane == 0) a.coeff[r * a.max_count + k] = c;
}

constexpr int kDownChunk = 64;  // candidates per block of the down kernel

// Down: y[r][c] += sum_k coeff_k down_k[c]; blocks take (column tile, candidate chunk, row) and
// add their partial sums atomically, so the sum order varies run to run in the last bits.
template <typename W>
__global__ void HotDownKernel(HotFfnArgs a) {
  __shared__ float cf[kDownChunk];
  __shared__ int32_t ids[kDownChunk];
  const int64_t r = blockIdx.z;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kDownChunk;
  const int32_t count = CandidateCount(a, r);
  if (k0 >= count) return;
  const int64_t kn = min(static_cast<int64_t>(kDownChunk), count - k0);
  for (int64_t j = threadIdx.x; j < kn; j += blockDim.x) {
    cf[j] = a.coeff[r * a.max_count + k0 + j];
    ids[j] = a.idx[r * a.idx_stride + k0 + j];
  }
  __syncthreads();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= a.dim) return;
  float acc = 0.0f;
  for (int64_t j = 0; j < kn; ++j) {
    if (cf[j] == 0.0f) continue;  // the same for every thread: no divergence
    acc += cf[j] * W::Load(a.down + ids[j] * a.down_row_bytes, c);
  }
  if (acc != 0.0f) atomicAdd(a.y + r * a.dim + c, acc);
}

// The two kernels of the hot FFN, each over its own block type (gate and up share one).
template <typename W>
cudaError_t LaunchGateUp(const HotFfnArgs& a, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const dim3 gu((a.max_count + kThreads / kWarp - 1) / (kThreads / kWarp), a.rows);
  HotGateUpKernel<W><<<gu, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename W>
cudaError_t LaunchDown(const HotFfnArgs& a, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const dim3 dn((a.dim + kThreads - 1) / kThreads, (a.max_count + kDownChunk - 1) / kDownChunk,
                a.rows);
  HotDownKernel<W><<<dn, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

// Calls Launch<W>::Run(a, stream) with W the row reader of `kind`.
template <template <typename> class Launch, typename Args>
cudaError_t ForKind(WeightFormat kind, const Args& a, cudaStream_t stream) {
  namespace b = blocks;
  switch (kind) {
    case WeightFormat::kF16:
      return Launch<F16Rows>::Run(a, stream);
    case WeightFormat::kQ8_0:
      return Launch<Q8Rows>::Run(a, stream);
    case WeightFormat::kQ4_0:
      return Launch<Q4Rows>::Run(a, stream);
    case WeightFormat::kQ4_1:
      return Launch<DecodedRows<b::Q4_1>>::Run(a, stream);
    case WeightFormat::kQ5_0:
      return Launch<DecodedRows<b::Q5_0>>::Run(a, stream);
    case WeightFormat::kQ5_1:
      return Launch<DecodedRows<b::Q5_1>>::Run(a, stream);
    case WeightFormat::kQ2_K:
      return Launch<DecodedRows<b::Q2_K>>::Run(a, stream);
    case WeightFormat::kQ3_K:
      return Launch<DecodedRows<b::Q3_K>>::Run(a, stream);
    case WeightFormat::kQ4_K:
      return Launch<DecodedRows<b::Q4_K>>::Run(a, stream);
    case WeightFormat::kQ5_K:
      return Launch<DecodedRows<b::Q5_K>>::Run(a, stream);
    case WeightFormat::kQ6_K:
      return Launch<DecodedRows<b::Q6_K>>::Run(a, stream);
    case WeightFormat::kIQ4_NL:
      return Launch<DecodedRows<b::IQ4_NL>>::Run(a, stream);
    case WeightFormat::kIQ4_XS:
      return Launch<DecodedRows<b::IQ4_XS>>::Run(a, stream);
  }
  return cudaErrorInvalidValue;
}

// One warp per row r: y[t][r] for every token t (the row stays in L1 after the first).
template <typename W>
__global__ void BlockGemvKernel(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols,
                                const float* x, int64_t n, float* y, int64_t ldy) {
  const int warps = blockDim.x / kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / kWarp;
  if (r >= rows) return;
  const uint8_t* row = w + r * row_bytes;
  for (int64_t t = 0; t < n; ++t) {
    const float s = WarpRowDot<W>(row, x + t * cols, cols);
    if (threadIdx.x % kWarp == 0) y[t * ldy + r] = s;
  }
}

template <typename W>
__global__ void BlockToHalfKernel(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols,
                                  __half* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  out[i] = __float2half_rn(W::Load(w + (i / cols) * row_bytes, i % cols));
}

struct BlockArgs {
  const uint8_t* w;
  int64_t row_bytes, rows, cols;
  const float* x;
  int64_t n;
  float* y;
  int64_t ldy;
  __half* half;
};

template <typename W>
struct GemvLauncher {
  static cudaError_t Run(const BlockArgs& a, cudaStream_t s) {
    constexpr int kThreads = 256;
    const unsigned blocks = static_cast<unsigned>((a.rows + kThreads / kWarp - 1) / (kThreads / kWarp));
    BlockGemvKernel<W><<<blocks, kThreads, 0, s>>>(a.w, a.row_bytes, a.rows, a.cols, a.x, a.n, a.y, a.ldy);
    return cudaGetLastError();
  }
};
template <typename W>
struct ToHalfLauncher {
  static cudaError_t Run(const BlockArgs& a, cudaStream_t s) {
    const int64_t n = a.rows * a.cols;
    BlockToHalfKernel<W><<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(a.w, a.row_bytes, a.rows, a.cols, a.half);
    return cudaGetLastError();
  }
};

template <typename W>
struct GateUpLauncher {
  static cudaError_t Run(const HotFfnArgs& a, cudaStream_t s) { return LaunchGateUp<W>(a, s); }
};
template <typename W>
struct DownLauncher {
  static cudaError_t Run(const HotFfnArgs& a, cudaStream_t s) { return LaunchDown<W>(a, s); }
};

__global__ void MergeKernel(float* x, const float* y_hot, const float* y_cold, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  // (y_hot + y_cold) first, as the host split FFN sums its output before the residual add.
  x[i] += y_cold ? y_hot[i] + y_cold[i] : y_hot[i];
}

unsigned Blocks(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

cudaError_t LaunchRmsNorm(const float* x, const float* w, const int32_t* row_map, int64_t rows,
                          int64_t n, float eps, float* out, uint16_t* out_half,
                          cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(
      x, w, row_map, n, eps, out, reinterpret_cast<__half*>(out_half));
  return cudaGetLastError();
}

cudaError_t LaunchToHalf(const float* x, int64_t n, bool relu, uint16_t* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ToHalfKernel<<<Blocks(n, 256), 256, 0, stream>>>(x, n, relu, reinterpret_cast<__half*>(out));
  return cudaGetLastError();
}

cudaError_t LaunchLayerNorm(const float* x, const float* w, const float* b, const int32_t* row_map,
                            int64_t rows, int64_t n, float eps, float* out, uint16_t* out_half,
                            cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LayerNormKernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(
      x, w, b, row_map, n, eps, out, reinterpret_cast<__half*>(out_half));
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* y, const float* b, int64_t rows, int64_t n, cudaStream_t stream) {
  if (rows * n == 0) return cudaSuccess;
  AddBiasKernel<<<Blocks(rows * n, 256), 256, 0, stream>>>(y, b, rows, n);
  return cudaGetLastError();
}

cudaError_t LaunchRopeExt(float* x, int64_t rows, int64_t row_stride, int64_t n_heads,
                          const RopeDesc& rope, const int32_t* positions, cudaStream_t stream) {
  const int64_t n = rows * n_heads * (rope.rope_dim / 2);
  if (n == 0) return cudaSuccess;
  RopeKernel<<<Blocks(n, 256), 256, 0, stream>>>(x, rows, row_stride, n_heads, rope, positions);
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* x, int64_t rows, int64_t row_stride, int64_t n_heads,
                       int64_t head_dim, int64_t rope_dim, const int32_t* positions, float base,
                       cudaStream_t stream) {
  RopeDesc rope;
  rope.head_dim = head_dim;
  rope.rope_dim = rope_dim;
  rope.base = base;
  return LaunchRopeExt(x, rows, row_stride, n_heads, rope, positions, stream);
}

cudaError_t LaunchKvStore(const KvDesc& kv, int64_t layer, const float* k, const float* v,
                          const int32_t* slots, const int32_t* positions, int64_t rows,
                          cudaStream_t stream) {
  const int64_t n = rows * kv.kv_dim;
  if (n == 0) return cudaSuccess;
  if (kv.f16) {
    KvStoreKernel<__half><<<Blocks(n, 256), 256, 0, stream>>>(kv, layer, k, v, slots, positions, rows);
  } else {
    KvStoreKernel<float><<<Blocks(n, 256), 256, 0, stream>>>(kv, layer, k, v, slots, positions, rows);
  }
  return cudaGetLastError();
}

cudaError_t LaunchAttention(const KvDesc& kv, int64_t layer, const float* q, const int32_t* slots,
                            const int32_t* positions, int64_t rows, const AttentionDesc& att,
                            float* scores, float* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(att.n_heads));
  if (kv.f16) {
    AttentionKernel<__half><<<grid, 256, 0, stream>>>(kv, layer, q, slots, positions, att, scores, out);
  } else {
    AttentionKernel<float><<<grid, 256, 0, stream>>>(kv, layer, q, slots, positions, att, scores, out);
  }
  return cudaGetLastError();
}

cudaError_t LaunchPredictSelect(const float* scores, int64_t rows, int64_t ffn, float threshold,
                                const int32_t* hot_slot, int32_t* hot_idx, int32_t* hot_count,
                                int32_t* cold_ids, int32_t* cold_count, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  PredictSelectKernel<<<static_cast<unsigned>(rows), 1024, 0, stream>>>(
      scores, ffn, threshold, hot_slot, hot_idx, hot_count, cold_ids, cold_count);
  return cudaGetLastError();
}

cudaError_t LaunchPackCold(const int32_t* cold_ids, const int32_t* cold_count, int64_t rows,
                           int64_t stride, int32_t* packed, uint32_t* row_end,
                           cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  PackColdKernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(cold_ids, cold_count, stride,
                                                                  packed, row_end);
  return cudaGetLastError();
}

cudaError_t LaunchHotFfn(const HotFfnArgs& args, cudaStream_t stream) {
  if (cudaError_t e = cudaMemsetAsync(args.y, 0, args.rows * args.dim * sizeof(float), stream);
      e != cudaSuccess) {
    return e;
  }
  if (args.max_count == 0 || args.rows == 0) return cudaSuccess;
  if (cudaError_t e = ForKind<GateUpLauncher>(args.weights, args, stream); e != cudaSuccess) {
    return e;
  }
  return ForKind<DownLauncher>(args.down_weights, args, stream);
}

cudaError_t LaunchBlockGemv(WeightFormat format, const uint8_t* w, int64_t row_bytes, int64_t rows,
                            int64_t cols, const float* x, int64_t n, float* y, int64_t ldy,
                            cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return ForKind<GemvLauncher>(format, BlockArgs{w, row_bytes, rows, cols, x, n, y, ldy, nullptr},
                               stream);
}

cudaError_t LaunchBlockToHalf(WeightFormat format, const uint8_t* w, int64_t row_bytes,
                              int64_t rows, int64_t cols, uint16_t* out, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  return ForKind<ToHalfLauncher>(
      format,
      BlockArgs{w, row_bytes, rows, cols, nullptr, 0, nullptr, 0, reinterpret_cast<__half*>(out)},
      stream);
}

cudaError_t LaunchMerge(float* x, const float* y_hot, const float* y_cold, int64_t n,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MergeKernel<<<Blocks(n, 256), 256, 0, stream>>>(x, y_hot, y_cold, n);
  return cudaGetLastError();
}

}  // namespace thermocline::gpu_worker::cuda
