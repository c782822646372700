// normcheck's GroupNorm kernel for channels-last CPU tensors (4-D channels_last, 5-D channels_last_3d).
//
// Memory is [N][HxW][C]; a group g of sample n is the D = C/G channels g*D .. g*D+D-1 of every pixel.
// Two strategies, sharing every inner loop:
//   1 ("groups"): parallel over the N*G (n, g) sets.  A thread's consecutive sets of one sample form a
//                 contiguous channel span, which it walks row by row (so D = 2 still reads whole rows).
//   2 ("pixels"): parallel over N*HxW rows in `chunks` contiguous chunks; every chunk sums per (n, c)
//                 into its own buffer, the buffers are reduced between passes (one parallel region).
// Statistics are two-pass (mean first, then sum of squared deviations from it): never E[x^2]-E[x]^2.
// Backward sums dy*(x - mean) directly (not sum(dy*x) - mean*sum(dy)), for the same reason.
// Accumulation: float for f32/f16/bf16 data (double for f64) inside blocks of BLOCK rows, blocks are
// added in double. f16/bf16 data is always converted to float before any arithmetic.
// Inner loops run over the channels of one row with `omp simd`: contiguous, so they vectorise.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t BLOCK = 256;  // rows per float partial sum

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

inline int64_t divup(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Element <-> accumulator conversions written on the bits, so that the channel loops vectorise
// (c10's own conversions branch per element).  Rounding is to nearest even, NaN stays NaN, as in c10.
template <typename T> inline typename Acc<T>::type up(T v) { return v; }
template <typename T> inline T down(typename Acc<T>::type v) { return v; }

template <> inline float up(at::BFloat16 v) {
  const uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
template <> inline at::BFloat16 down(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint16_t bits = (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t(0x7FC0) : static_cast<uint16_t>(rounded);
  return at::BFloat16(bits, at::BFloat16::from_bits());
}
#if defined(__F16C__) && defined(__FLT16_MAX__)  // hardware conversions, and a compiler with _Float16
// vcvtph2ps / vcvtps2ph, vectorised through _Float16.
template <> inline float up(at::Half v) {
  _Float16 h;
  std::memcpy(&h, &v.x, sizeof h);
  return static_cast<float>(h);
}
template <> inline at::Half down(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return at::Half(bits, at::Half::from_bits());
}
#else
template <> inline float up(at::Half v) { return static_cast<float>(v); }
template <> inline at::Half down(float f) { return static_cast<at::Half>(f); }
#endif

struct Dims {
  int64_t N, C, HW, G, D;
};

// Rows [r0, r1) of sample n (global row index n*HxW + pixel), channels [c0, c0 + S).
struct Span {
  int64_t n, r0, r1, c0, S;
};

// Strategy 2's passes in one parallel region.  `steps` are passes f(chunk, begin, end), run on every
// one of `chunks` contiguous pieces of [0, total) in parallel, and serial steps f() (the (n, c)
// reductions between passes), run by one thread once every thread has finished the pass before.
// One region, not one per pass: a fork and a join cost about what a pass over 64K values does.
template <typename... Steps>
void chunk_passes(int64_t total, int64_t chunks, const Steps&... steps) {
  const int64_t per = divup(total, chunks);
#pragma omp parallel num_threads(chunks)
  {
    const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
    auto step = [&](const auto& f) {
      if constexpr (std::is_invocable_v<decltype(f)>) {
#pragma omp barrier
#pragma omp single
        f();  // the end of `single` is a barrier too
      } else {
        for (int64_t k = me; k < chunks; k += team) {
          const int64_t b = k * per, e = std::min(total, b + per);
          if (b < e) f(k, b, e);
        }
      }
    };
    (step(steps), ...);
  }
}

// Strategy 2's unit of work: rows [b, e) cut at sample boundaries, every channel.
template <typename F>
void for_sample_spans(const Dims& d, int64_t b, int64_t e, const F& f) {
  while (b < e) {
    const int64_t n = b / d.HW, stop = std::min(e, (n + 1) * d.HW);
    f(Span{n, b, stop, 0, d.C});
    b = stop;
  }
}

// Strategy 1's unit of work: the (n, g) sets [b, e) of a thread, one span per sample.
template <typename F>
void for_group_spans(const Dims& d, int64_t b, int64_t e, const F& f) {
  while (b < e) {
    const int64_t n = b / d.G, stop = std::min(e, (n + 1) * d.G);
    const int64_t g0 = b - n * d.G, g1 = stop - n * d.G;
    f(Span{n, n * d.HW, (n + 1) * d.HW, g0 * d.D, (g1 - g0) * d.D}, g0, g1);
    b = stop;
  }
}

// The loops over one span.  `part` is float scratch (K*S values), sums are added into double `out`.
template <typename T>
struct Loops {
  using acc_t = typename Acc<T>::type;

  // out[c] (and out[S + c]) += the span's sum of term(i, c) (and term2(i, c)), i = the element's index.
  // Four rows are added pairwise before they reach the float partial: with few channels a row's
  // additions would otherwise wait for the previous row's (a dependency chain through memory).
  template <typename Term, typename Term2>
  static void sums(const Span& s, int64_t C, acc_t* part, double* out, const Term& term, const Term2* term2) {
    const int64_t S = s.S;
    for (int64_t b = s.r0; b < s.r1; b += BLOCK) {
      const int64_t e = std::min(s.r1, b + BLOCK);
      acc_t* __restrict p = part;
      acc_t* __restrict p2 = part + S;
      std::fill(part, part + (term2 ? 2 * S : S), acc_t(0));
      int64_t r = b;
      for (; r + 4 <= e; r += 4) {
        const int64_t o = r * C + s.c0;
#pragma omp simd
        for (int64_t c = 0; c < S; ++c) {
          p[c] += (term(o + c, c) + term(o + C + c, c)) + (term(o + 2 * C + c, c) + term(o + 3 * C + c, c));
          if constexpr (!std::is_same_v<Term2, std::nullptr_t>)
            p2[c] += ((*term2)(o + c, c) + (*term2)(o + C + c, c)) +
                     ((*term2)(o + 2 * C + c, c) + (*term2)(o + 3 * C + c, c));
        }
      }
      for (; r < e; ++r) {
        const int64_t o = r * C + s.c0;
#pragma omp simd
        for (int64_t c = 0; c < S; ++c) {
          p[c] += term(o + c, c);
          if constexpr (!std::is_same_v<Term2, std::nullptr_t>) p2[c] += (*term2)(o + c, c);
        }
      }
      for (int64_t i = 0; i < S; ++i) out[i] += p[i];
      if (term2)
        for (int64_t i = 0; i < S; ++i) out[S + i] += p2[i];
    }
  }

  static int64_t part_size(int64_t K, int64_t S) { return K * S; }

  // out[c] += sum_rows x
  static void sum_x(const T* X, int64_t C, const Span& s, acc_t* part, double* out) {
    sums(s, C, part, out, [X](int64_t i, int64_t) { return up(X[i]); }, static_cast<std::nullptr_t*>(nullptr));
  }

  // out[c] += sum_rows (x - m_c)^2
  static void sum_sq_dev(const T* X, int64_t C, const Span& s, const acc_t* m, acc_t* part, double* out) {
    auto sq = [X, m](int64_t i, int64_t c) {
      const acc_t v = up(X[i]) - m[c];
      return v * v;
    };
    sums(s, C, part, out, sq, static_cast<std::nullptr_t*>(nullptr));
  }

  // out[c] += sum_rows dy*(x - m_c),  out[S + c] += sum_rows dy
  static void sum_dy(const T* X, const T* DY, int64_t C, const Span& s, const acc_t* m, acc_t* part, double* out) {
    auto dy_xmu = [X, DY, m](int64_t i, int64_t c) { return up(DY[i]) * (up(X[i]) - m[c]); };
    auto dy = [DY](int64_t i, int64_t) { return up(DY[i]); };
    sums(s, C, part, out, dy_xmu, &dy);
  }

  // f(i, c) for every element of the span, four rows per channel loop (as in sums: fewer, longer loops).
  template <typename F>
  static void each(const Span& s, int64_t C, const F& f) {
    const int64_t S = s.S;
    int64_t r = s.r0;
    for (; r + 4 <= s.r1; r += 4) {
      const int64_t o = r * C + s.c0;
#pragma omp simd
      for (int64_t c = 0; c < S; ++c) {
        f(o + c, c);
        f(o + C + c, c);
        f(o + 2 * C + c, c);
        f(o + 3 * C + c, c);
      }
    }
    for (; r < s.r1; ++r) {
      const int64_t o = r * C + s.c0;
#pragma omp simd
      for (int64_t c = 0; c < S; ++c) f(o + c, c);
    }
  }

  // y = (x - m_c)*scale_c + shift_c
  static void write_y(const T* X, T* Y, int64_t C, const Span& s, const acc_t* m, const acc_t* scale,
                      const acc_t* shift) {
    each(s, C, [=](int64_t i, int64_t c) { Y[i] = down<T>((up(X[i]) - m[c]) * scale[c] + shift[c]); });
  }

  // dx = a_c*dy + b_c*(x - m_c) + e_c
  static void write_dx(const T* X, const T* DY, T* DX, int64_t C, const Span& s, const acc_t* m, const acc_t* a,
                       const acc_t* b, const acc_t* e) {
    each(s, C, [=](int64_t i, int64_t c) { DX[i] = down<T>(a[c] * up(DY[i]) + b[c] * (up(X[i]) - m[c]) + e[c]); });
  }
};

// ------------------------------------------------------------------------------------------------
// per-group constants, shared by both strategies.  `sums` holds per-channel sums of (n, channels c0..)
// ------------------------------------------------------------------------------------------------
template <typename acc_t>
void group_means(const Dims& d, int64_t n, int64_t g0, int64_t g1, const double* sums, acc_t* mean_c,
                 double* mean_out) {
  const int64_t M = d.D * d.HW;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t j0 = (g - g0) * d.D;
    double total = 0;
    for (int64_t j = 0; j < d.D; ++j) total += sums[j0 + j];
    const acc_t m = static_cast<acc_t>(total / M);
    mean_out[n * d.G + g] = m;
    std::fill(mean_c + j0, mean_c + j0 + d.D, m);
  }
}

// rstd from the squared deviations, and y's per-channel scale/shift (γ·rstd, β)
template <typename acc_t, typename PT>
void group_affine(const Dims& d, double eps, int64_t n, int64_t g0, int64_t g1, const double* ssd, const PT* W,
                  const PT* B, acc_t* scale, acc_t* shift, double* rstd_out) {
  const int64_t M = d.D * d.HW;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t j0 = (g - g0) * d.D;
    double total = 0;
    for (int64_t j = 0; j < d.D; ++j) total += ssd[j0 + j];
    const double rstd = 1.0 / std::sqrt(std::max(total / M, 0.0) + eps);
    rstd_out[n * d.G + g] = rstd;
    for (int64_t j = 0; j < d.D; ++j) {
      const int64_t c = g * d.D + j;
      scale[j0 + j] = static_cast<acc_t>(W ? rstd * static_cast<double>(W[c]) : rstd);
      shift[j0 + j] = B ? static_cast<acc_t>(B[c]) : acc_t(0);
    }
  }
}

// With M = D*HxW, A_c = sum_p dy*(x - mean), B_c = sum_p dy (per n, c),
// S1 = sum_{c in g} w_c B_c, S2 = sum_{c in g} w_c A_c:
//   dx = rstd*w_c*dy - rstd^3*S2/M*(x - mean) - rstd*S1/M
//   dw_c = sum_n rstd*A_c,   db_c = sum_n B_c
template <typename acc_t, typename PT>
void group_dx_coefs(const Dims& d, int64_t n, int64_t g0, int64_t g1, const double* A, const double* Bs,
                    const double* rstd, const PT* W, acc_t* a, acc_t* b, acc_t* e) {
  const int64_t M = d.D * d.HW;
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t j0 = (g - g0) * d.D;
    const double r = rstd[n * d.G + g];
    double s1 = 0, s2 = 0;
    for (int64_t j = 0; j < d.D; ++j) {
      const double w = W ? static_cast<double>(W[g * d.D + j]) : 1.0;
      s1 += w * Bs[j0 + j];
      s2 += w * A[j0 + j];
      a[j0 + j] = static_cast<acc_t>(r * w);
    }
    std::fill(b + j0, b + j0 + d.D, static_cast<acc_t>(-r * r * r * s2 / M));
    std::fill(e + j0, e + j0 + d.D, static_cast<acc_t>(-r * s1 / M));
  }
}

template <typename acc_t>
void channel_means(const Dims& d, int64_t n, int64_t g0, int64_t g1, const double* mean, acc_t* mean_c) {
  for (int64_t g = g0; g < g1; ++g)
    std::fill(mean_c + (g - g0) * d.D, mean_c + (g - g0 + 1) * d.D, static_cast<acc_t>(mean[n * d.G + g]));
}

template <typename PT>
void finish_params(const std::vector<double>& A, const std::vector<double>& Bs, const double* rstd, const Dims& d,
                   PT* dW, PT* dB) {
  for (int64_t c = 0; c < d.C; ++c) {
    double sw = 0, sb = 0;
    for (int64_t n = 0; n < d.N; ++n) {
      sw += A[n * d.C + c] * rstd[n * d.G + c / d.D];
      sb += Bs[n * d.C + c];
    }
    if (dW) dW[c] = static_cast<PT>(sw);
    if (dB) dB[c] = static_cast<PT>(sb);
  }
}

// Per-chunk (n, c) sums of strategy 2: bufs[k][n][K*C], then reduced into bufs[0].
struct ChunkBuffers {
  int64_t chunks, width;  // width = N*K*C
  std::vector<double> data;
  ChunkBuffers(int64_t chunks_, int64_t width_) : chunks(chunks_), width(width_), data(chunks_ * width_, 0.0) {}
  double* chunk(int64_t k) { return data.data() + k * width; }
  const double* reduce() {
    for (int64_t k = 1; k < chunks; ++k)
      for (int64_t i = 0; i < width; ++i) data[i] += data[k * width + i];
    return data.data();
  }
  void clear() { std::fill(data.begin(), data.end(), 0.0); }
};

// ------------------------------------------------------------------------------------------------
// forward
// ------------------------------------------------------------------------------------------------
template <typename T, typename PT>
void forward_groups(const T* X, const PT* W, const PT* B, T* Y, double* mean_out, double* rstd_out,
                    const Dims& d, double eps, int64_t threads) {
  using L = Loops<T>;
  using acc_t = typename L::acc_t;
  const int64_t NG = d.N * d.G;
  at::parallel_for(0, NG, divup(NG, threads), [&](int64_t b, int64_t e) {
    std::vector<acc_t> part(L::part_size(1, d.C)), m(d.C), scale(d.C), shift(d.C);
    std::vector<double> sums(d.C);
    for_group_spans(d, b, e, [&](const Span& s, int64_t g0, int64_t g1) {
      std::fill(sums.begin(), sums.end(), 0.0);
      L::sum_x(X, d.C, s, part.data(), sums.data());
      group_means(d, s.n, g0, g1, sums.data(), m.data(), mean_out);
      std::fill(sums.begin(), sums.end(), 0.0);
      L::sum_sq_dev(X, d.C, s, m.data(), part.data(), sums.data());
      group_affine(d, eps, s.n, g0, g1, sums.data(), W, B, scale.data(), shift.data(), rstd_out);
      L::write_y(X, Y, d.C, s, m.data(), scale.data(), shift.data());
    });
  });
}

template <typename T, typename PT>
void forward_pixels(const T* X, const PT* W, const PT* B, T* Y, double* mean_out, double* rstd_out,
                    const Dims& d, double eps, int64_t threads) {
  using L = Loops<T>;
  using acc_t = typename L::acc_t;
  const int64_t C = d.C, NC = d.N * d.C;
  const int64_t chunks = std::max<int64_t>(1, std::min(threads, d.N * d.HW));
  ChunkBuffers bufs(chunks, NC);
  std::vector<acc_t> m(NC), scale(NC), shift(NC);
  chunk_passes(
      d.N * d.HW, chunks,
      [&](int64_t k, int64_t b, int64_t e) {
        std::vector<acc_t> part(L::part_size(1, C));
        for_sample_spans(d, b, e, [&](const Span& s) { L::sum_x(X, C, s, part.data(), bufs.chunk(k) + s.n * C); });
      },
      [&] {
        const double* sums = bufs.reduce();
        for (int64_t n = 0; n < d.N; ++n) group_means(d, n, 0, d.G, sums + n * C, m.data() + n * C, mean_out);
        bufs.clear();
      },
      [&](int64_t k, int64_t b, int64_t e) {
        std::vector<acc_t> part(L::part_size(1, C));
        for_sample_spans(d, b, e, [&](const Span& s) {
          L::sum_sq_dev(X, C, s, m.data() + s.n * C, part.data(), bufs.chunk(k) + s.n * C);
        });
      },
      [&] {
        const double* ssd = bufs.reduce();
        for (int64_t n = 0; n < d.N; ++n)
          group_affine(d, eps, n, 0, d.G, ssd + n * C, W, B, scale.data() + n * C, shift.data() + n * C, rstd_out);
      },
      [&](int64_t, int64_t b, int64_t e) {
        for_sample_spans(d, b, e, [&](const Span& s) {
          const int64_t o = s.n * C;
          L::write_y(X, Y, C, s, m.data() + o, scale.data() + o, shift.data() + o);
        });
      });
}

// ------------------------------------------------------------------------------------------------
// backward
// ------------------------------------------------------------------------------------------------
template <typename T, typename PT>
void backward_groups(const T* DY, const T* X, const double* mean, const double* rstd, const PT* W, T* DX, PT* dW,
                     PT* dB, const Dims& d, int64_t threads) {
  using L = Loops<T>;
  using acc_t = typename L::acc_t;
  const int64_t NG = d.N * d.G, C = d.C;
  std::vector<double> A(d.N * C), Bs(d.N * C);
  at::parallel_for(0, NG, divup(NG, threads), [&](int64_t b, int64_t e) {
    std::vector<acc_t> part(L::part_size(2, C)), m(C), ca(C), cb(C), ce(C);
    std::vector<double> ab(2 * C);
    for_group_spans(d, b, e, [&](const Span& s, int64_t g0, int64_t g1) {
      channel_means(d, s.n, g0, g1, mean, m.data());
      std::fill(ab.begin(), ab.end(), 0.0);
      L::sum_dy(X, DY, C, s, m.data(), part.data(), ab.data());
      std::copy(ab.begin(), ab.begin() + s.S, A.begin() + s.n * C + s.c0);
      std::copy(ab.begin() + s.S, ab.begin() + 2 * s.S, Bs.begin() + s.n * C + s.c0);
      if (!DX) return;
      group_dx_coefs(d, s.n, g0, g1, ab.data(), ab.data() + s.S, rstd, W, ca.data(), cb.data(), ce.data());
      L::write_dx(X, DY, DX, C, s, m.data(), ca.data(), cb.data(), ce.data());
    });
  });
  if (dW || dB) finish_params(A, Bs, rstd, d, dW, dB);
}

template <typename T, typename PT>
void backward_pixels(const T* DY, const T* X, const double* mean, const double* rstd, const PT* W, T* DX, PT* dW,
                     PT* dB, const Dims& d, int64_t threads) {
  using L = Loops<T>;
  using acc_t = typename L::acc_t;
  const int64_t C = d.C, NC = d.N * d.C;
  const int64_t chunks = std::max<int64_t>(1, std::min(threads, d.N * d.HW));
  std::vector<acc_t> m(NC);
  for (int64_t n = 0; n < d.N; ++n) channel_means(d, n, 0, d.G, mean, m.data() + n * C);
  ChunkBuffers bufs(chunks, 2 * NC);  // per n: A (C values) then B (C values)
  std::vector<double> A(NC), Bs(NC);
  std::vector<acc_t> ca(NC), cb(NC), ce(NC);
  auto sums = [&](int64_t k, int64_t b, int64_t e) {
    std::vector<acc_t> part(L::part_size(2, C));
    for_sample_spans(d, b, e, [&](const Span& s) {
      L::sum_dy(X, DY, C, s, m.data() + s.n * C, part.data(), bufs.chunk(k) + s.n * 2 * C);
    });
  };
  auto split_sums = [&] {
    const double* ab = bufs.reduce();
    for (int64_t n = 0; n < d.N; ++n) {
      std::copy(ab + n * 2 * C, ab + n * 2 * C + C, A.begin() + n * C);
      std::copy(ab + n * 2 * C + C, ab + (n + 1) * 2 * C, Bs.begin() + n * C);
    }
  };
  if (DX) {
    chunk_passes(
        d.N * d.HW, chunks, sums,
        [&] {
          split_sums();
          for (int64_t n = 0; n < d.N; ++n)
            group_dx_coefs(d, n, 0, d.G, A.data() + n * C, Bs.data() + n * C, rstd, W, ca.data() + n * C,
                           cb.data() + n * C, ce.data() + n * C);
        },
        [&](int64_t, int64_t b, int64_t e) {
          for_sample_spans(d, b, e, [&](const Span& s) {
            const int64_t o = s.n * C;
            L::write_dx(X, DY, DX, C, s, m.data() + o, ca.data() + o, cb.data() + o, ce.data() + o);
          });
        });
  } else {
    chunk_passes(d.N * d.HW, chunks, sums);
    split_sums();
  }
  if (dW || dB) finish_params(A, Bs, rstd, d, dW, dB);
}

// ------------------------------------------------------------------------------------------------
// bindings.  Input checks raise ValueError (pybind11::value_error); the Python wrapper turns that into
// the detailed one-line message of normcheck.kernels.groupnorm.validate.
// ------------------------------------------------------------------------------------------------
namespace py = pybind11;

void require(bool ok, const char* what) {
  if (!ok) throw py::value_error(std::string("normcheck groupnorm: ") + what);
}

Dims dims_of(const at::Tensor& x, int64_t G) {
  Dims d;
  d.N = x.size(0);
  d.C = x.size(1);
  d.HW = x.numel() / std::max<int64_t>(1, d.N * d.C);
  d.G = G;
  d.D = d.C / G;
  return d;
}

at::MemoryFormat format_of(const at::Tensor& x) {
  return x.dim() == 5 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast;
}

at::ScalarType scalar_type_named(const std::string& name) {
  if (name == "f32") return at::kFloat;
  if (name == "f64") return at::kDouble;
  if (name == "bf16") return at::kBFloat16;
  if (name == "f16") return at::kHalf;
  require(false, "unknown parameter dtype");
  return at::kFloat;
}

bool supported_types(at::ScalarType xt, at::ScalarType pt) {
  const bool half = xt == at::kHalf || xt == at::kBFloat16;
  return (xt == at::kFloat || xt == at::kDouble || half) && (pt == xt || (half && pt == at::kFloat));
}

void check_input(const at::Tensor& x, int64_t G, at::ScalarType param_type,
                 std::initializer_list<const c10::optional<at::Tensor>*> params) {
  require(x.device().is_cpu(), "x must be on the CPU");
  require(x.dim() == 4 || x.dim() == 5, "x must be 4-D or 5-D");
  require(x.is_contiguous(format_of(x)), "x must be channels-last");
  require(G >= 1 && x.size(1) % G == 0, "C must be divisible by G");
  require(supported_types(x.scalar_type(), param_type), "unsupported dtype combination");
  for (auto* p : params)
    if (p->has_value() && (*p)->defined()) {
      const at::Tensor& t = **p;
      require(t.device().is_cpu() && t.dim() == 1 && t.size(0) == x.size(1) && t.is_contiguous(),
              "weight and bias must be contiguous (C,) CPU tensors");
      require(t.scalar_type() == param_type, "weight and bias must have the parameter dtype");
    }
}

// The strategy a call runs (0 = auto: groups when HxW < threshold and there are at least as many
// (n, g) sets as threads, else pixels).
int64_t resolve_strategy(int64_t strategy, const Dims& d, int64_t threshold, int64_t threads) {
  require(strategy >= 0 && strategy <= 2, "strategy must be 0 (auto), 1 (groups) or 2 (pixels)");
  if (strategy != 0) return strategy;
  return d.HW < threshold && d.N * d.G >= threads ? 1 : 2;
}

template <typename F>
void dispatch(at::ScalarType xt, at::ScalarType pt, const F& f) {
  using at::ScalarType;
  if (xt == ScalarType::Float) return f(float(), float());
  if (xt == ScalarType::Double) return f(double(), double());
  if (xt == ScalarType::BFloat16 && pt == ScalarType::Float) return f(at::BFloat16(), float());
  if (xt == ScalarType::Half && pt == ScalarType::Float) return f(at::Half(), float());
  if (xt == ScalarType::BFloat16) return f(at::BFloat16(), at::BFloat16());
  if (xt == ScalarType::Half) return f(at::Half(), at::Half());
}

template <typename P>
const P* opt_ptr(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr<P>() : nullptr;
}

// returns y, mean, rstd (mean/rstd float64, shape (N, G)) and the strategy taken (1 or 2)
std::tuple<at::Tensor, at::Tensor, at::Tensor, int64_t> forward(
    const at::Tensor& x, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias, int64_t G,
    double eps, int64_t strategy, int64_t threshold, int64_t threads, const std::string& param_name) {
  const auto param_type = scalar_type_named(param_name);
  check_input(x, G, param_type, {&weight, &bias});
  threads = std::max<int64_t>(1, threads);
  const Dims d = dims_of(x, G);
  strategy = resolve_strategy(strategy, d, threshold, threads);
  auto y = at::empty_like(x, x.options(), format_of(x));
  auto mean = at::empty({d.N, G}, x.options().dtype(at::kDouble));
  auto rstd = at::empty({d.N, G}, x.options().dtype(at::kDouble));
  if (x.numel() == 0) return {y, mean, rstd, strategy};
  dispatch(x.scalar_type(), param_type, [&](auto xt, auto pt) {
    using T = decltype(xt);
    using PT = decltype(pt);
    auto fn = strategy == 1 ? forward_groups<T, PT> : forward_pixels<T, PT>;
    fn(x.data_ptr<T>(), opt_ptr<PT>(weight), opt_ptr<PT>(bias), y.data_ptr<T>(), mean.data_ptr<double>(),
       rstd.data_ptr<double>(), d, eps, threads);
  });
  return {y, mean, rstd, strategy};
}

// returns dx, dweight, dbias (undefined where not requested) and the strategy taken (1 or 2)
std::tuple<at::Tensor, at::Tensor, at::Tensor, int64_t> backward(
    const at::Tensor& dy_any, const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
    const c10::optional<at::Tensor>& weight, int64_t G, int64_t strategy, int64_t threshold, int64_t threads,
    bool need_dx, bool need_dw, bool need_db, const std::string& param_name) {
  const auto param_type = scalar_type_named(param_name);
  check_input(x, G, param_type, {&weight});
  require(dy_any.sizes() == x.sizes() && dy_any.scalar_type() == x.scalar_type() && dy_any.device().is_cpu(),
          "dy must match x in shape, dtype and device");
  const Dims d = dims_of(x, G);
  require(mean.numel() == d.N * G && rstd.numel() == d.N * G, "mean and rstd must hold N*G values");
  threads = std::max<int64_t>(1, threads);
  strategy = resolve_strategy(strategy, d, threshold, threads);
  const auto dy = dy_any.contiguous(format_of(x));  // pytorch#92166: never read dy with x's strides blindly
  const auto mean64 = mean.to(at::kDouble).contiguous();
  const auto rstd64 = rstd.to(at::kDouble).contiguous();
  need_dw = need_dw && weight.has_value() && weight->defined();
  at::Tensor dx, dw, db;
  auto popts = x.options().dtype(param_type);
  if (need_dx) dx = at::empty_like(x, x.options(), format_of(x));
  if (need_dw) dw = at::zeros({d.C}, popts);
  if (need_db) db = at::zeros({d.C}, popts);
  if (x.numel() == 0 || !(need_dx || need_dw || need_db)) return {dx, dw, db, strategy};
  dispatch(x.scalar_type(), param_type, [&](auto xt, auto pt) {
    using T = decltype(xt);
    using PT = decltype(pt);
    auto fn = strategy == 1 ? backward_groups<T, PT> : backward_pixels<T, PT>;
    fn(dy.data_ptr<T>(), x.data_ptr<T>(), mean64.data_ptr<double>(), rstd64.data_ptr<double>(),
       opt_ptr<PT>(weight), need_dx ? dx.data_ptr<T>() : nullptr, need_dw ? dw.data_ptr<PT>() : nullptr,
       need_db ? db.data_ptr<PT>() : nullptr, d, threads);
  });
  return {dx, dw, db, strategy};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "GroupNorm forward, channels-last CPU");
  m.def("backward", &backward, "GroupNorm backward, channels-last CPU");
}
