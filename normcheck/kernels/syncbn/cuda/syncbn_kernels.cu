// normcheck's CUDA kernels for the five aten SyncBatchNorm primitives.
//
// Plain CUDA C++ (no torch headers): extern "C" launchers take raw pointers, sizes, dtype codes,
// the device's SM count and a cudaStream_t; they return 0, a cudaError_t (> 0) or a Status (< 0).
// Semantics are those of normcheck/kernels/syncbn/cpu_primitives.py; the design is in docs/cuda.md.
//
// Every tensor is described as (n, c, s) with offset(q, ch, k) = (q*c + ch)*s + k: a contiguous
// tensor is (N, C, prod(spatial)); a channels-last one is (N*prod(spatial), C, 1).  All index
// arithmetic is int64_t.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

enum DType : int { kFloat = 0, kDouble = 1, kHalf = 2, kBFloat16 = 3, kInt32 = 4, kInt64 = 5 };
enum Status : int { kOk = 0, kBadDtype = -1, kBadWorkspace = -2, kBadShape = -3 };

constexpr int kReduceThreads = 256;   // threads per block of the reductions
constexpr int kMaxTileChannels = 64;  // channels per block when the channel is the inner dim
constexpr int kElemThreads = 256;
constexpr int kUnroll = 4;            // loads in flight per thread before they are used
constexpr int kMinPerThread = 16;     // elements a reduction thread gets before another split pays
constexpr int64_t kMaxGridY = 65535;

// ------------------------------------------------------------------------------ dtypes

template <class T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ double widen(double v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

// Accumulation type -> storage type (round to nearest even).
template <class T> __device__ __forceinline__ T narrow(typename Acc<T>::type v);
template <> __device__ __forceinline__ float narrow<float>(float v) { return v; }
template <> __device__ __forceinline__ double narrow<double>(double v) { return v; }
template <> __device__ __forceinline__ __half narrow<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 narrow<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float quiet_nan(float) { return nanf(""); }
__device__ __forceinline__ double quiet_nan(double) { return nan(""); }

// 1/sqrt(var + eps), with CUDA's InvStd convention: 0 when var == 0 and eps == 0.  1/sqrt (two
// correctly rounded ops) rather than rsqrt (2 ulp in float).
template <class A> __device__ __forceinline__ A inv_std(A var, double eps) {
  if (var == A(0) && eps == 0.0) return A(0);
  return A(1) / sqrt(var + static_cast<A>(eps));
}

// Runtime-typed load/store for the small per-channel tensors of the gather (any float dtype,
// int counts): one kernel instead of a template per dtype combination.
__device__ double load_any(const void* p, int dtype, int64_t i) {
  switch (dtype) {
    case kFloat: return static_cast<const float*>(p)[i];
    case kDouble: return static_cast<const double*>(p)[i];
    case kHalf: return __half2float(static_cast<const __half*>(p)[i]);
    case kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kInt32: return static_cast<const int32_t*>(p)[i];
    default: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
}

__device__ void store_any(void* p, int dtype, int64_t i, double v) {
  switch (dtype) {
    case kFloat: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case kDouble: static_cast<double*>(p)[i] = v; break;
    case kHalf: static_cast<__half*>(p)[i] = __double2half(v); break;
    default: static_cast<__nv_bfloat16*>(p)[i] = __double2bfloat16(v); break;
  }
}

// ------------------------------------------------------------------------------ walks
// The index arithmetic of every kernel, shared with the host-side coverage check
// (nc_check_*_coverage) so the tests on a machine without a GPU exercise the very code that
// decides which thread reads which element.

// One channel's reduction set: index r in [0, n*s) is element (q, ch, k) with r = q*s + k.
// A thread visits r0, r0 + step, ...; the step is split into (dq, dk) once, so the loop divides
// nothing.
struct ChannelWalk {
  int64_t q, k, dq, dk, s, plane;
  __host__ __device__ ChannelWalk(int64_t r0, int64_t step, int64_t c, int64_t s_)
      : q(r0 / s_), k(r0 % s_), dq(step / s_), dk(step % s_), s(s_), plane(c * s_) {}
  __host__ __device__ int64_t offset(int64_t ch) const { return q * plane + ch * s + k; }
  __host__ __device__ void advance() {
    k += dk;
    q += dq;
    if (k >= s) {
      k -= s;
      ++q;
    }
  }
};

// Every element of the tensor: flat index i has channel (i / s) % c.  The walk keeps the
// position k = i % s and the channel, stepping both without dividing.
struct FlatWalk {
  int64_t k, ch, dk, dch, s, c;
  __host__ __device__ FlatWalk(int64_t i0, int64_t step, int64_t c_, int64_t s_)
      : k(i0 % s_), ch((i0 / s_) % c_), dk(step % s_), dch((step / s_) % c_), s(s_), c(c_) {}
  __host__ __device__ void advance() {
    k += dk;
    int64_t carry = 0;
    if (k >= s) {
      k -= s;
      carry = 1;
    }
    ch += dch + carry;  // < 2c, so one subtraction wraps it
    if (ch >= c) ch -= c;
  }
};

// Visit this thread's elements of channel ch, kUnroll at a time: f(offsets, valid) first sees
// every offset of a group, so the loads can all be issued before any is used.
#pragma nv_exec_check_disable
template <class F>
__host__ __device__ void visit_channel(int64_t r0, int64_t step, int64_t n, int64_t c, int64_t s, int64_t ch,
                                       F&& f) {
  const int64_t length = n * s;
  ChannelWalk walk(r0, step, c, s);
  for (int64_t r = r0; r < length; r += kUnroll * step) {
    int64_t off[kUnroll];
    bool ok[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      ok[u] = r + u * step < length;
      off[u] = walk.offset(ch);
      walk.advance();
    }
    f(off, ok);
  }
}

#pragma nv_exec_check_disable
template <class F>
__host__ __device__ void visit_flat(int64_t i0, int64_t step, int64_t total, int64_t c, int64_t s, F&& f) {
  FlatWalk walk(i0, step, c, s);
  for (int64_t i = i0; i < total; i += kUnroll * step) {
    int64_t idx[kUnroll], chs[kUnroll];
    bool ok[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      idx[u] = i + u * step;
      ok[u] = idx[u] < total;
      chs[u] = walk.ch;
      walk.advance();
    }
    f(idx, chs, ok);
  }
}

// ------------------------------------------------------------------------------ launch plans

struct ReducePlan {
  int64_t grid_x, grid_y, block_x, block_y;
};

// Channels go on grid.x (one per block, or tiles of <= 64 when the channel is the inner dim, so a
// warp reads consecutive addresses); splits of the reduction set go on grid.y, enough for ~4
// blocks per SM but never so many that a thread gets fewer than kMinPerThread elements.
ReducePlan plan_reduce(int64_t n, int64_t c, int64_t s, int sm_count) {
  ReducePlan p;
  if (s == 1) {
    const int64_t tiles = (c + kMaxTileChannels - 1) / kMaxTileChannels;
    p.block_x = (c + tiles - 1) / tiles;  // balanced tiles: C = 65 gives 2 x 33, not 64 + 1
    p.grid_x = tiles;
  } else {
    p.block_x = 1;
    p.grid_x = c;
  }
  p.block_y = kReduceThreads / p.block_x > 0 ? kReduceThreads / p.block_x : 1;
  const int64_t want = (4 * static_cast<int64_t>(sm_count > 0 ? sm_count : 1) + p.grid_x - 1) / p.grid_x;
  const int64_t by_work = (n * s) / (p.block_y * kMinPerThread);
  int64_t gy = want < by_work ? want : by_work;
  if (gy < 1) gy = 1;
  if (gy > kMaxGridY) gy = kMaxGridY;
  p.grid_y = gy;
  return p;
}

int64_t plan_flat_blocks(int64_t total, int sm_count) {
  const int64_t per_block = static_cast<int64_t>(kElemThreads) * kUnroll;
  int64_t blocks = (total + per_block - 1) / per_block;
  const int64_t cap = 16 * static_cast<int64_t>(sm_count > 0 ? sm_count : 1);  // 2 waves of 8 blocks/SM
  if (blocks > cap) blocks = cap;
  return blocks < 1 ? 1 : blocks;
}

// An elementwise kernel over `total` values on the flat grid plan_flat_blocks sizes (nothing for 0).
template <class Kernel, class... Args>
int launch_flat(Kernel kernel, int64_t total, int sm_count, cudaStream_t stream, Args... args) {
  if (total == 0) return kOk;
  kernel<<<static_cast<unsigned>(plan_flat_blocks(total, sm_count)), kElemThreads, 0, stream>>>(args...);
  return static_cast<int>(cudaGetLastError());
}

// ------------------------------------------------------------------------------ partials

// Welford state of one thread, merged across threads and blocks with Chan's formula.
template <class A> struct Welford {
  A mean, m2;
  int64_t n;
  __device__ static Welford empty() { return {A(0), A(0), 0}; }
  __device__ void add(A v) {
    ++n;
    const A d = v - mean;
    mean += d / static_cast<A>(n);
    m2 += d * (v - mean);
  }
  __device__ static Welford merge(const Welford& a, const Welford& b) {
    if (b.n == 0) return a;
    if (a.n == 0) return b;
    const int64_t n = a.n + b.n;
    const A wb = static_cast<A>(b.n) / static_cast<A>(n);
    const A d = b.mean - a.mean;
    return {a.mean + d * wb, a.m2 + b.m2 + d * d * static_cast<A>(a.n) * wb, n};
  }
};

template <class A> struct GradSums {
  A dy, dy_xmu;
  __device__ static GradSums empty() { return {A(0), A(0)}; }
  __device__ static GradSums merge(const GradSums& a, const GradSums& b) { return {a.dy + b.dy, a.dy_xmu + b.dy_xmu}; }
};

__host__ __device__ inline int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Merge the blockDim.y partials of each threadIdx.x column (a tree: equal-sized halves, so the
// Chan merges stay balanced; correct for any blockDim.y, not only powers of two).
template <class P> __device__ P block_reduce_y(P v, P* smem) {
  const int x = threadIdx.x, y = threadIdx.y, X = blockDim.x, Y = blockDim.y;
  smem[y * X + x] = v;
  __syncthreads();
  for (int half = static_cast<int>(pow2_ceil(Y)) / 2; half > 0; half /= 2) {
    if (y < half && y + half < Y) smem[y * X + x] = P::merge(smem[y * X + x], smem[(y + half) * X + x]);
    __syncthreads();
  }
  return smem[x];
}

// ------------------------------------------------------------------------------ jobs
// A reduction job says what a thread accumulates per element and what a channel's final
// partial turns into.

// Welford on d = x - K with K the channel's first element (every thread of the channel uses the
// same K): the updates then round at the scale of the spread, not of |mean|, which matters for
// offset data (mean 1e4, std 1 in float32).  mean = K + mean(d).
template <class T> struct StatsJob {
  using A = typename Acc<T>::type;
  using Partial = Welford<A>;
  const T* x;
  A* mean;
  A* invstd;
  double eps;
  int64_t s, length;  // inner size and elements per channel
  Partial* partials;
  __device__ A channel_constant(int64_t ch) const { return length > 0 ? widen(x[ch * s]) : A(0); }
  __device__ void add(Partial& p, int64_t off, A shift) const { p.add(widen(x[off]) - shift); }
  __device__ void finish(const Partial& p, int64_t ch) const {
    if (p.n == 0) {  // empty input: mean 0, invstd NaN (CUDA's 0/0)
      mean[ch] = A(0);
      invstd[ch] = quiet_nan(A(0));
      return;
    }
    A var = p.m2 / static_cast<A>(p.n);
    if (var < A(0)) var = A(0);
    mean[ch] = channel_constant(ch) + p.mean;
    invstd[ch] = inv_std(var, eps);
  }
};

template <class T, class W> struct GradSumsJob {
  using A = typename Acc<T>::type;
  using Partial = GradSums<A>;
  const T* dy;
  const T* x;
  const A* mean;
  const A* invstd;
  A* sum_dy;        // each output may be null (not requested)
  A* sum_dy_xmu;
  W* grad_weight;
  W* grad_bias;
  Partial* partials;
  __device__ A channel_constant(int64_t ch) const { return mean[ch]; }
  __device__ void add(Partial& p, int64_t off, A mu) const {
    const A g = widen(dy[off]);
    p.dy += g;
    p.dy_xmu += g * (widen(x[off]) - mu);
  }
  __device__ void finish(const Partial& p, int64_t ch) const {
    if (sum_dy) sum_dy[ch] = p.dy;
    if (sum_dy_xmu) sum_dy_xmu[ch] = p.dy_xmu;
    if (grad_weight) grad_weight[ch] = narrow<W>(p.dy_xmu * invstd[ch]);
    if (grad_bias) grad_bias[ch] = narrow<W>(p.dy);
  }
};

// Per-channel reduction over (n, s).  With grid.y == 1 a block owns whole channels and writes the
// results; otherwise it writes one partial per (split, channel) for finish_channels.
template <class Job> __global__ void reduce_channels(Job job, int64_t n, int64_t c, int64_t s) {
  using P = typename Job::Partial;
  using A = decltype(job.channel_constant(0));
  extern __shared__ __align__(16) unsigned char smem_raw[];
  P* smem = reinterpret_cast<P*>(smem_raw);
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  P acc = P::empty();
  if (ch < c) {
    const A k = job.channel_constant(ch);
    visit_channel(r0, step, n, c, s, ch, [&](const int64_t* off, const bool* ok) {
      // Keep the loads independent of the accumulation order: each valid offset is read once.
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (ok[u]) job.add(acc, off[u], k);
    });
  }
  acc = block_reduce_y(acc, smem);
  if (threadIdx.y == 0 && ch < c) {
    if (gridDim.y == 1)
      job.finish(acc, ch);
    else
      job.partials[static_cast<int64_t>(blockIdx.y) * c + ch] = acc;
  }
}

template <class Job> __global__ void finish_channels(Job job, int64_t c, int64_t splits) {
  using P = typename Job::Partial;
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  P acc = P::empty();
  for (int64_t g = 0; g < splits; ++g) acc = P::merge(acc, job.partials[g * c + ch]);
  job.finish(acc, ch);
}

template <class Job>
int launch_reduce(Job job, int64_t n, int64_t c, int64_t s, int sm_count, void* workspace, int64_t workspace_bytes,
                  cudaStream_t stream) {
  using P = typename Job::Partial;
  if (c <= 0) return kOk;
  const ReducePlan p = plan_reduce(n, c, s, sm_count);
  if (p.grid_x > 0x7fffffff) return kBadShape;
  if (p.grid_y > 1) {
    if (workspace == nullptr || workspace_bytes < p.grid_y * c * static_cast<int64_t>(sizeof(P))) return kBadWorkspace;
    job.partials = static_cast<P*>(workspace);
  }
  const dim3 grid(static_cast<unsigned>(p.grid_x), static_cast<unsigned>(p.grid_y));
  const dim3 block(static_cast<unsigned>(p.block_x), static_cast<unsigned>(p.block_y));
  const size_t shared = static_cast<size_t>(p.block_x * p.block_y) * sizeof(P);
  reduce_channels<<<grid, block, shared, stream>>>(job, n, c, s);
  if (p.grid_y > 1) {
    const int64_t blocks = (c + 255) / 256;
    finish_channels<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(job, c, p.grid_y);
  }
  return static_cast<int>(cudaGetLastError());
}

// ------------------------------------------------------------------------------ elementwise

// y = (x - mean)*invstd*w + b, in the accumulation type.
template <class T, class W>
__global__ void elemt_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t total, int64_t c, int64_t s,
                             const W* __restrict__ weight, const W* __restrict__ bias,
                             const typename Acc<T>::type* __restrict__ mean,
                             const typename Acc<T>::type* __restrict__ invstd) {
  using A = typename Acc<T>::type;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  visit_flat(i0, step, total, c, s, [&](const int64_t* idx, const int64_t* chs, const bool* ok) {
    A xv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) xv[u] = ok[u] ? widen(x[idx[u]]) : A(0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!ok[u]) continue;
      const int64_t ch = chs[u];
      const A scale = weight ? invstd[ch] * widen(weight[ch]) : invstd[ch];
      const A shift = bias ? widen(bias[ch]) : A(0);
      y[idx[u]] = narrow<T>((xv[u] - mean[ch]) * scale + shift);
    }
  });
}

// dx = (dy - sum_dy/n - (x - mean)*invstd^2*sum_dy_xmu/n) * invstd*w, n = sum of the int32 counts.
template <class T, class W>
__global__ void backward_elemt_kernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                                      int64_t total, int64_t c, int64_t s, const typename Acc<T>::type* __restrict__ mean,
                                      const typename Acc<T>::type* __restrict__ invstd, const W* __restrict__ weight,
                                      const typename Acc<T>::type* __restrict__ sum_dy,
                                      const typename Acc<T>::type* __restrict__ sum_dy_xmu,
                                      const int32_t* __restrict__ count, int64_t world) {
  using A = typename Acc<T>::type;
  __shared__ A norm_shared;
  if (threadIdx.x == 0) {
    int64_t n = 0;
    for (int64_t r = 0; r < world; ++r) n += count[r];
    norm_shared = A(1) / static_cast<A>(n);  // n == 0: inf, as on the CPU
  }
  __syncthreads();
  const A norm = norm_shared;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  visit_flat(i0, step, total, c, s, [&](const int64_t* idx, const int64_t* chs, const bool* ok) {
    A xv[kUnroll], gv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      xv[u] = ok[u] ? widen(x[idx[u]]) : A(0);
      gv[u] = ok[u] ? widen(dy[idx[u]]) : A(0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!ok[u]) continue;
      const int64_t ch = chs[u];
      const A istd = invstd[ch];
      const A mean_dy = sum_dy[ch] * norm;
      const A proj = sum_dy_xmu[ch] * norm * istd * istd;
      const A scale = weight ? istd * widen(weight[ch]) : istd;
      dx[idx[u]] = narrow<T>((gv[u] - mean_dy - (xv[u] - mean[ch]) * proj) * scale);
    }
  });
}

// ------------------------------------------------------------------------------ gather

// Chan's parallel merge of the per-rank (count, mean, biased var), in double; ranks with
// count <= 0 carry nothing (their mean/invstd may be NaN).  One thread per channel.
__global__ void gather_kernel(const void* mean, const void* invstd, int stat_dtype, const void* counts,
                              int counts_dtype, int64_t world, int64_t c, void* running_mean, void* running_var,
                              int running_dtype, double momentum, double eps, void* mean_out, void* invstd_out,
                              int out_dtype) {
  const int64_t ch = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  double n = 0.0, weighted = 0.0;
  for (int64_t r = 0; r < world; ++r) {
    const double w = load_any(counts, counts_dtype, r);
    if (!(w > 0.0)) continue;
    n += w;
    weighted += w * load_any(mean, stat_dtype, r * c + ch);
  }
  if (!(n > 0.0)) {  // nothing to merge: mean 0, invstd NaN, running stats untouched
    store_any(mean_out, out_dtype, ch, 0.0);
    store_any(invstd_out, out_dtype, ch, nan(""));
    return;
  }
  const double mean_g = weighted / n;
  double within = 0.0, between = 0.0;
  for (int64_t r = 0; r < world; ++r) {
    const double w = load_any(counts, counts_dtype, r);
    if (!(w > 0.0)) continue;
    const double istd = load_any(invstd, stat_dtype, r * c + ch);
    const double var_r = (eps == 0.0 && istd == 0.0) ? 0.0 : 1.0 / (istd * istd) - eps;
    const double dev = load_any(mean, stat_dtype, r * c + ch) - mean_g;
    within += w * var_r;
    between += w * dev * dev;
  }
  const double m2 = within + between;
  double var_g = m2 / n;
  if (var_g < 0.0) var_g = 0.0;
  store_any(mean_out, out_dtype, ch, mean_g);
  store_any(invstd_out, out_dtype, ch, inv_std(var_g, eps));
  if (running_mean)
    store_any(running_mean, running_dtype, ch,
              load_any(running_mean, running_dtype, ch) * (1.0 - momentum) + momentum * mean_g);
  if (running_var)  // n == 1: 0/0 = NaN, as on CUDA
    store_any(running_var, running_dtype, ch,
              load_any(running_var, running_dtype, ch) * (1.0 - momentum) + momentum * (m2 / (n - 1.0)));
}

// ------------------------------------------------------------------------------ dispatch helpers

bool is_float_dtype(int d) { return d == kFloat || d == kDouble || d == kHalf || d == kBFloat16; }

// Calls f(T{}, W{}) for the supported (input, parameter) dtype pairs: W is T, or float for
// half/bfloat16 input (mixed precision).
template <class F> int dispatch_pair(int dtype, int param_dtype, F&& f) {
  switch (dtype) {
    case kFloat:
      if (param_dtype == kFloat) return f(float{}, float{});
      break;
    case kDouble:
      if (param_dtype == kDouble) return f(double{}, double{});
      break;
    case kHalf:
      if (param_dtype == kHalf) return f(__half{}, __half{});
      if (param_dtype == kFloat) return f(__half{}, float{});
      break;
    case kBFloat16:
      if (param_dtype == kBFloat16) return f(__nv_bfloat16{}, __nv_bfloat16{});
      if (param_dtype == kFloat) return f(__nv_bfloat16{}, float{});
      break;
  }
  return kBadDtype;
}

template <class F> int dispatch_one(int dtype, F&& f) {
  switch (dtype) {
    case kFloat: return f(float{});
    case kDouble: return f(double{});
    case kHalf: return f(__half{});
    case kBFloat16: return f(__nv_bfloat16{});
  }
  return kBadDtype;
}

// This library links its own CUDA runtime, whose current device is not torch's: name it on
// every call (cheap when it is already current).
int select_device(int device) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return kOk;
  return static_cast<int>(cudaSetDevice(device));
}

template <class P> int64_t workspace_for(int64_t n, int64_t c, int64_t s, int sm_count) {
  if (c <= 0) return 0;
  const ReducePlan p = plan_reduce(n, c, s, sm_count);
  return p.grid_y > 1 ? p.grid_y * c * static_cast<int64_t>(sizeof(P)) : 0;
}

}  // namespace

// ================================================================================ C interface

extern "C" {

// Version of this interface; the loader checks it.
int nc_abi_version() { return 2; }

const char* nc_error_string(int code) {
  switch (code) {
    case kOk: return "no error";
    case kBadDtype: return "unsupported dtype combination";
    case kBadWorkspace: return "workspace missing or too small";
    case kBadShape: return "too many channel blocks for one grid";
  }
  return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown normcheck status";
}

// Bytes of scratch memory a reduction needs (0: none). job 0 = batch_norm_stats,
// 1 = batch_norm_backward_reduce; dtype is the input's.
int64_t nc_reduce_workspace_bytes(int job, int dtype, int64_t n, int64_t c, int64_t s, int sm_count) {
  const bool dbl = dtype == kDouble;
  if (job == 0) return dbl ? workspace_for<Welford<double>>(n, c, s, sm_count) : workspace_for<Welford<float>>(n, c, s, sm_count);
  return dbl ? workspace_for<GradSums<double>>(n, c, s, sm_count) : workspace_for<GradSums<float>>(n, c, s, sm_count);
}

// The reduction launch plan: out[0..3] = grid.x, grid.y, block.x, block.y.
void nc_reduce_plan(int64_t n, int64_t c, int64_t s, int sm_count, int64_t* out) {
  const ReducePlan p = plan_reduce(n, c, s, sm_count);
  out[0] = p.grid_x;
  out[1] = p.grid_y;
  out[2] = p.block_x;
  out[3] = p.block_y;
}

// Host-side replay of the reductions' thread -> element mapping: returns 0 when every element
// is read exactly once, by a thread of its own channel; otherwise 1 (an element read twice),
// 2 (never read), 3 (read for the wrong channel), 4 (an offset outside the tensor).
int nc_check_reduce_coverage(int64_t n, int64_t c, int64_t s, int sm_count) {
  const int64_t total = n * c * s;
  std::vector<unsigned char> seen(static_cast<size_t>(total), 0);
  const ReducePlan p = plan_reduce(n, c, s, sm_count);
  int status = 0;
  for (int64_t gx = 0; gx < p.grid_x; ++gx)
    for (int64_t gy = 0; gy < p.grid_y; ++gy)
      for (int64_t tx = 0; tx < p.block_x; ++tx)
        for (int64_t ty = 0; ty < p.block_y; ++ty) {
          const int64_t ch = gx * p.block_x + tx;
          if (ch >= c) continue;
          visit_channel(gy * p.block_y + ty, p.grid_y * p.block_y, n, c, s, ch, [&](const int64_t* off, const bool* ok) {
            for (int u = 0; u < kUnroll; ++u) {
              if (!ok[u]) continue;
              if (off[u] < 0 || off[u] >= total) { status = status ? status : 4; continue; }
              if ((off[u] / s) % c != ch) status = status ? status : 3;
              if (seen[off[u]]++) status = status ? status : 1;
            }
          });
        }
  if (!status && std::memchr(seen.data(), 0, seen.size())) status = 2;
  return status;
}

// The same for the elementwise kernels: every flat index visited once, with channel (i/s) % c.
int nc_check_flat_coverage(int64_t n, int64_t c, int64_t s, int sm_count) {
  const int64_t total = n * c * s;
  std::vector<unsigned char> seen(static_cast<size_t>(total), 0);
  const int64_t blocks = plan_flat_blocks(total, sm_count);
  int status = 0;
  for (int64_t t = 0; t < blocks * kElemThreads; ++t)
    visit_flat(t, blocks * kElemThreads, total, c, s, [&](const int64_t* idx, const int64_t* chs, const bool* ok) {
      for (int u = 0; u < kUnroll; ++u) {
        if (!ok[u]) continue;
        if (idx[u] < 0 || idx[u] >= total) { status = status ? status : 4; continue; }
        if ((idx[u] / s) % c != chs[u]) status = status ? status : 3;
        if (seen[idx[u]]++) status = status ? status : 1;
      }
    });
  if (!status && total && std::memchr(seen.data(), 0, seen.size())) status = 2;
  return status;
}

// mean, invstd (C, accumulation dtype) of x (n, c, s).
int nc_batch_norm_stats(int dtype, const void* x, int64_t n, int64_t c, int64_t s, double eps, void* mean,
                        void* invstd, void* workspace, int64_t workspace_bytes, int sm_count, int device, cudaStream_t stream) {
  return dispatch_one(dtype, [&](auto t) {
    if (const int e = select_device(device)) return e;
    using T = decltype(t);
    using A = typename Acc<T>::type;
    StatsJob<T> job{static_cast<const T*>(x), static_cast<A*>(mean), static_cast<A*>(invstd), eps, s, n * s, nullptr};
    return launch_reduce(job, n, c, s, sm_count, workspace, workspace_bytes, stream);
  });
}

// Merge (world, c) per-rank statistics; updates the running stats in place (either may be null).
int nc_batch_norm_gather_stats_with_counts(int stat_dtype, const void* mean, const void* invstd, int counts_dtype,
                                           const void* counts, int64_t world, int64_t c, int running_dtype,
                                           void* running_mean, void* running_var, double momentum, double eps,
                                           int out_dtype, void* mean_out, void* invstd_out, int device, cudaStream_t stream) {
  if (!is_float_dtype(stat_dtype) || !(is_float_dtype(counts_dtype) || counts_dtype == kInt32 || counts_dtype == kInt64) ||
      !(out_dtype == kFloat || out_dtype == kDouble) ||
      ((running_mean || running_var) && !is_float_dtype(running_dtype)))
    return kBadDtype;
  if (c <= 0) return kOk;
  if (const int e = select_device(device)) return e;
  const int64_t blocks = (c + 255) / 256;
  gather_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(mean, invstd, stat_dtype, counts, counts_dtype, world,
                                                                  c, running_mean, running_var, running_dtype, momentum,
                                                                  eps, mean_out, invstd_out, out_dtype);
  return static_cast<int>(cudaGetLastError());
}

// y = (x - mean)*invstd*weight + bias; weight and bias (param_dtype) may be null.
int nc_batch_norm_elemt(int dtype, int param_dtype, const void* x, void* y, int64_t n, int64_t c, int64_t s,
                        const void* weight, const void* bias, const void* mean, const void* invstd, int sm_count,
                        int device, cudaStream_t stream) {
  return dispatch_pair(dtype, param_dtype, [&](auto t, auto w) {
    if (const int e = select_device(device)) return e;
    using T = decltype(t);
    using W = decltype(w);
    using A = typename Acc<T>::type;
    const int64_t total = n * c * s;
    return launch_flat(elemt_kernel<T, W>, total, sm_count, stream, static_cast<const T*>(x), static_cast<T*>(y),
                       total, c, s, static_cast<const W*>(weight), static_cast<const W*>(bias),
                       static_cast<const A*>(mean), static_cast<const A*>(invstd));
  });
}

// sum_dy, sum_dy_xmu (accumulation dtype) and grad_weight, grad_bias (param_dtype); any output
// may be null.
int nc_batch_norm_backward_reduce(int dtype, int param_dtype, const void* dy, const void* x, int64_t n, int64_t c,
                                  int64_t s, const void* mean, const void* invstd, void* sum_dy, void* sum_dy_xmu,
                                  void* grad_weight, void* grad_bias, void* workspace, int64_t workspace_bytes,
                                  int sm_count, int device, cudaStream_t stream) {
  return dispatch_pair(dtype, param_dtype, [&](auto t, auto w) {
    if (const int e = select_device(device)) return e;
    using T = decltype(t);
    using W = decltype(w);
    using A = typename Acc<T>::type;
    GradSumsJob<T, W> job{static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const A*>(mean),
                          static_cast<const A*>(invstd), static_cast<A*>(sum_dy), static_cast<A*>(sum_dy_xmu),
                          static_cast<W*>(grad_weight), static_cast<W*>(grad_bias), nullptr};
    return launch_reduce(job, n, c, s, sm_count, workspace, workspace_bytes, stream);
  });
}

// dx from the global sums and the int32 per-rank counts (count has `world` entries).
int nc_batch_norm_backward_elemt(int dtype, int param_dtype, const void* dy, const void* x, void* dx, int64_t n,
                                 int64_t c, int64_t s, const void* mean, const void* invstd, const void* weight,
                                 const void* sum_dy, const void* sum_dy_xmu, const int32_t* count, int64_t world,
                                 int sm_count, int device, cudaStream_t stream) {
  return dispatch_pair(dtype, param_dtype, [&](auto t, auto w) {
    if (const int e = select_device(device)) return e;
    using T = decltype(t);
    using W = decltype(w);
    using A = typename Acc<T>::type;
    const int64_t total = n * c * s;
    return launch_flat(backward_elemt_kernel<T, W>, total, sm_count, stream, static_cast<const T*>(dy),
                       static_cast<const T*>(x), static_cast<T*>(dx), total, c, s, static_cast<const A*>(mean),
                       static_cast<const A*>(invstd), static_cast<const W*>(weight),
                       static_cast<const A*>(sum_dy), static_cast<const A*>(sum_dy_xmu), count, world);
  });
}

}  // extern "C"
