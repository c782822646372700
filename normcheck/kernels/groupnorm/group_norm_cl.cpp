// normcheck's GroupNorm kernel for channels-last CPU tensors (4-D channels_last, 5-D channels_last_3d).
//
// Memory is [N][HxW][C]; a group g of sample n is the D = C/G channels g*D .. g*D+D-1 of every pixel.
// Two strategies:
//   1 ("groups"): parallel over the N*G (n, g) sets; each task walks its set's pixels (D values each).
//   2 ("pixels"): parallel over N*HxW rows in `chunks` contiguous chunks; every chunk sums per (n, c)
//                 into its own buffer, the buffers are reduced afterwards, then a second parallel pass.
// Statistics are two-pass (mean first, then sum of squared deviations from it): never E[x^2]-E[x]^2.
// Backward sums dy*(x - mean) directly (not sum(dy*x) - mean*sum(dy)), for the same reason.
// Accumulation: float for f32/f16/bf16 data (double for f64) inside blocks of BLOCK pixels, blocks are
// added in double. f16/bf16 data is always converted to float before any arithmetic.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t BLOCK = 256;

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

inline int64_t divup(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Dims {
  int64_t N, C, HW, G, D;
};

// Run f(chunk, begin, end) on `chunks` contiguous pieces of [0, total), in parallel.
template <typename F>
void for_chunks(int64_t total, int64_t chunks, const F& f) {
  const int64_t per = divup(total, chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t k = cb; k < ce; ++k) {
      const int64_t b = k * per, e = std::min(total, b + per);
      if (b < e) f(k, b, e);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// forward
// ------------------------------------------------------------------------------------------------
template <typename T, typename PT>
void forward_groups(const T* X, const PT* W, const PT* B, T* Y, double* mean_out, double* rstd_out,
                    const Dims& d, double eps, int64_t threads) {
  using acc_t = typename Acc<T>::type;
  const int64_t NG = d.N * d.G, M = d.D * d.HW;
  at::parallel_for(0, NG, divup(NG, threads), [&](int64_t b, int64_t e) {
    std::vector<acc_t> part(d.D);
    std::vector<acc_t> scale(d.D), shift(d.D);
    for (int64_t ng = b; ng < e; ++ng) {
      const int64_t n = ng / d.G, g = ng % d.G;
      const T* xs = X + n * d.HW * d.C + g * d.D;
      T* ys = Y + n * d.HW * d.C + g * d.D;
      // pass 1: mean
      double total = 0;
      for (int64_t p0 = 0; p0 < d.HW; p0 += BLOCK) {
        std::fill(part.begin(), part.end(), acc_t(0));
        const int64_t p1 = std::min(d.HW, p0 + BLOCK);
        for (int64_t p = p0; p < p1; ++p) {
          const T* row = xs + p * d.C;
          for (int64_t j = 0; j < d.D; ++j) part[j] += static_cast<acc_t>(row[j]);
        }
        for (int64_t j = 0; j < d.D; ++j) total += part[j];
      }
      const acc_t mean = static_cast<acc_t>(total / M);
      // pass 2: sum of squared deviations
      double ssd = 0;
      for (int64_t p0 = 0; p0 < d.HW; p0 += BLOCK) {
        std::fill(part.begin(), part.end(), acc_t(0));
        const int64_t p1 = std::min(d.HW, p0 + BLOCK);
        for (int64_t p = p0; p < p1; ++p) {
          const T* row = xs + p * d.C;
          for (int64_t j = 0; j < d.D; ++j) {
            const acc_t v = static_cast<acc_t>(row[j]) - mean;
            part[j] += v * v;
          }
        }
        for (int64_t j = 0; j < d.D; ++j) ssd += part[j];
      }
      const double rstd = 1.0 / std::sqrt(std::max(ssd / M, 0.0) + eps);
      mean_out[ng] = mean;
      rstd_out[ng] = rstd;
      for (int64_t j = 0; j < d.D; ++j) {
        const int64_t c = g * d.D + j;
        scale[j] = static_cast<acc_t>(W ? rstd * static_cast<double>(W[c]) : rstd);
        shift[j] = B ? static_cast<acc_t>(B[c]) : acc_t(0);
      }
      for (int64_t p = 0; p < d.HW; ++p) {
        const T* row = xs + p * d.C;
        T* out = ys + p * d.C;
        for (int64_t j = 0; j < d.D; ++j)
          out[j] = static_cast<T>((static_cast<acc_t>(row[j]) - mean) * scale[j] + shift[j]);
      }
    }
  });
}

// Per-chunk sums over rows: f(n, row pointer offset, part) adds one row into part[0..C).
// Returns totals[n*C + c] (double).
template <typename acc_t, typename RowF>
std::vector<double> pixel_sums(const Dims& d, int64_t chunks, const RowF& row_f) {
  const int64_t rows = d.N * d.HW, NC = d.N * d.C;
  std::vector<double> bufs(chunks * NC, 0.0);  // the per-chunk (per-thread) buffers
  for_chunks(rows, chunks, [&](int64_t k, int64_t b, int64_t e) {
    double* buf = bufs.data() + k * NC;
    std::vector<acc_t> part(d.C);
    int64_t r = b;
    while (r < e) {
      const int64_t n = r / d.HW;
      const int64_t stop = std::min(e, std::min((n + 1) * d.HW, r + BLOCK));
      std::fill(part.begin(), part.end(), acc_t(0));
      for (; r < stop; ++r) row_f(n, r, part.data());
      double* dst = buf + n * d.C;
      for (int64_t c = 0; c < d.C; ++c) dst[c] += part[c];
    }
  });
  for (int64_t k = 1; k < chunks; ++k)
    for (int64_t i = 0; i < NC; ++i) bufs[i] += bufs[k * NC + i];
  bufs.resize(NC);
  return bufs;
}

template <typename T, typename PT>
void forward_pixels(const T* X, const PT* W, const PT* B, T* Y, double* mean_out, double* rstd_out,
                    const Dims& d, double eps, int64_t threads) {
  using acc_t = typename Acc<T>::type;
  const int64_t M = d.D * d.HW, C = d.C, NC = d.N * d.C;
  const int64_t chunks = std::max<int64_t>(1, std::min(threads, d.N * d.HW));
  auto sums = pixel_sums<acc_t>(d, chunks, [&](int64_t, int64_t r, acc_t* part) {
    const T* row = X + r * C;
    for (int64_t c = 0; c < C; ++c) part[c] += static_cast<acc_t>(row[c]);
  });
  std::vector<acc_t> meanc(NC);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t g = 0; g < d.G; ++g) {
      double s = 0;
      for (int64_t j = 0; j < d.D; ++j) s += sums[n * C + g * d.D + j];
      const acc_t m = static_cast<acc_t>(s / M);
      mean_out[n * d.G + g] = m;
      for (int64_t j = 0; j < d.D; ++j) meanc[n * C + g * d.D + j] = m;
    }
  auto ssd = pixel_sums<acc_t>(d, chunks, [&](int64_t n, int64_t r, acc_t* part) {
    const T* row = X + r * C;
    const acc_t* m = meanc.data() + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const acc_t v = static_cast<acc_t>(row[c]) - m[c];
      part[c] += v * v;
    }
  });
  std::vector<acc_t> scale(NC), shift(NC);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t g = 0; g < d.G; ++g) {
      double s = 0;
      for (int64_t j = 0; j < d.D; ++j) s += ssd[n * C + g * d.D + j];
      const double rstd = 1.0 / std::sqrt(std::max(s / M, 0.0) + eps);
      rstd_out[n * d.G + g] = rstd;
      for (int64_t j = 0; j < d.D; ++j) {
        const int64_t c = g * d.D + j;
        scale[n * C + c] = static_cast<acc_t>(W ? rstd * static_cast<double>(W[c]) : rstd);
        shift[n * C + c] = B ? static_cast<acc_t>(B[c]) : acc_t(0);
      }
    }
  for_chunks(d.N * d.HW, chunks, [&](int64_t, int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t n = r / d.HW;
      const T* row = X + r * C;
      T* out = Y + r * C;
      const acc_t* m = meanc.data() + n * C;
      const acc_t* sc = scale.data() + n * C;
      const acc_t* sh = shift.data() + n * C;
      for (int64_t c = 0; c < C; ++c)
        out[c] = static_cast<T>((static_cast<acc_t>(row[c]) - m[c]) * sc[c] + sh[c]);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// backward.  With M = D*HxW, A_c = sum_p dy*(x - mean), B_c = sum_p dy (per n, c),
// S1 = sum_{c in g} w_c B_c, S2 = sum_{c in g} w_c A_c:
//   dx = rstd*w_c*dy - rstd^3*S2/M*(x - mean) - rstd*S1/M
//   dw_c = sum_n rstd*A_c,   db_c = sum_n B_c
// ------------------------------------------------------------------------------------------------
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

template <typename T, typename PT>
void backward_groups(const T* DY, const T* X, const double* mean, const double* rstd, const PT* W, T* DX, PT* dW,
                     PT* dB, const Dims& d, int64_t threads) {
  using acc_t = typename Acc<T>::type;
  const int64_t NG = d.N * d.G, M = d.D * d.HW;
  std::vector<double> A(d.N * d.C), Bs(d.N * d.C);
  at::parallel_for(0, NG, divup(NG, threads), [&](int64_t b, int64_t e) {
    std::vector<acc_t> pa(d.D), pb(d.D), coef(d.D);
    for (int64_t ng = b; ng < e; ++ng) {
      const int64_t n = ng / d.G, g = ng % d.G;
      const int64_t off = n * d.HW * d.C + g * d.D;
      const T* xs = X + off;
      const T* dys = DY + off;
      const acc_t m = static_cast<acc_t>(mean[ng]);
      double* a = A.data() + n * d.C + g * d.D;
      double* bs = Bs.data() + n * d.C + g * d.D;
      for (int64_t j = 0; j < d.D; ++j) a[j] = bs[j] = 0;
      for (int64_t p0 = 0; p0 < d.HW; p0 += BLOCK) {
        std::fill(pa.begin(), pa.end(), acc_t(0));
        std::fill(pb.begin(), pb.end(), acc_t(0));
        const int64_t p1 = std::min(d.HW, p0 + BLOCK);
        for (int64_t p = p0; p < p1; ++p) {
          const T* xr = xs + p * d.C;
          const T* dr = dys + p * d.C;
          for (int64_t j = 0; j < d.D; ++j) {
            const acc_t dyv = static_cast<acc_t>(dr[j]);
            pa[j] += dyv * (static_cast<acc_t>(xr[j]) - m);
            pb[j] += dyv;
          }
        }
        for (int64_t j = 0; j < d.D; ++j) {
          a[j] += pa[j];
          bs[j] += pb[j];
        }
      }
      if (!DX) continue;
      double s1 = 0, s2 = 0;
      for (int64_t j = 0; j < d.D; ++j) {
        const double w = W ? static_cast<double>(W[g * d.D + j]) : 1.0;
        s1 += w * bs[j];
        s2 += w * a[j];
        coef[j] = static_cast<acc_t>(rstd[ng] * w);
      }
      const double r = rstd[ng];
      const acc_t cb = static_cast<acc_t>(-r * r * r * s2 / M);
      const acc_t ce = static_cast<acc_t>(-r * s1 / M);
      T* dxs = DX + off;
      for (int64_t p = 0; p < d.HW; ++p) {
        const T* xr = xs + p * d.C;
        const T* dr = dys + p * d.C;
        T* out = dxs + p * d.C;
        for (int64_t j = 0; j < d.D; ++j)
          out[j] = static_cast<T>(coef[j] * static_cast<acc_t>(dr[j]) + cb * (static_cast<acc_t>(xr[j]) - m) + ce);
      }
    }
  });
  if (dW || dB) finish_params(A, Bs, rstd, d, dW, dB);
}

template <typename T, typename PT>
void backward_pixels(const T* DY, const T* X, const double* mean, const double* rstd, const PT* W, T* DX, PT* dW,
                     PT* dB, const Dims& d, int64_t threads) {
  using acc_t = typename Acc<T>::type;
  const int64_t M = d.D * d.HW, C = d.C, NC = d.N * d.C;
  const int64_t chunks = std::max<int64_t>(1, std::min(threads, d.N * d.HW));
  std::vector<acc_t> meanc(NC);
  for (int64_t i = 0; i < NC; ++i) meanc[i] = static_cast<acc_t>(mean[(i / C) * d.G + (i % C) / d.D]);
  // one pass producing both sums: buffers interleave A (first C) and B (next C) per n
  Dims d2 = d;
  d2.C = 2 * C;
  auto ab = pixel_sums<acc_t>(d2, chunks, [&](int64_t n, int64_t r, acc_t* part) {
    const T* xr = X + r * C;
    const T* dr = DY + r * C;
    const acc_t* m = meanc.data() + n * C;
    acc_t* pb = part + C;
    for (int64_t c = 0; c < C; ++c) {
      const acc_t dyv = static_cast<acc_t>(dr[c]);
      part[c] += dyv * (static_cast<acc_t>(xr[c]) - m[c]);
      pb[c] += dyv;
    }
  });
  std::vector<double> A(NC), Bs(NC);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      A[n * C + c] = ab[n * 2 * C + c];
      Bs[n * C + c] = ab[n * 2 * C + C + c];
    }
  if (DX) {
    std::vector<acc_t> coef(NC), cb(NC), ce(NC);
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t g = 0; g < d.G; ++g) {
        double s1 = 0, s2 = 0;
        const double r = rstd[n * d.G + g];
        for (int64_t j = 0; j < d.D; ++j) {
          const int64_t c = g * d.D + j;
          const double w = W ? static_cast<double>(W[c]) : 1.0;
          s1 += w * Bs[n * C + c];
          s2 += w * A[n * C + c];
          coef[n * C + c] = static_cast<acc_t>(r * w);
        }
        for (int64_t j = 0; j < d.D; ++j) {
          cb[n * C + g * d.D + j] = static_cast<acc_t>(-r * r * r * s2 / M);
          ce[n * C + g * d.D + j] = static_cast<acc_t>(-r * s1 / M);
        }
      }
    for_chunks(d.N * d.HW, chunks, [&](int64_t, int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = (r / d.HW) * C;
        const T* xr = X + r * C;
        const T* dr = DY + r * C;
        T* out = DX + r * C;
        for (int64_t c = 0; c < C; ++c)
          out[c] = static_cast<T>(coef[o + c] * static_cast<acc_t>(dr[c]) +
                                  cb[o + c] * (static_cast<acc_t>(xr[c]) - meanc[o + c]) + ce[o + c]);
      }
    });
  }
  if (dW || dB) finish_params(A, Bs, rstd, d, dW, dB);
}

// ------------------------------------------------------------------------------------------------
// bindings
// ------------------------------------------------------------------------------------------------
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

void check_input(const at::Tensor& x, int64_t G) {
  TORCH_CHECK(x.dim() == 4 || x.dim() == 5, "normcheck groupnorm: x must be 4-D or 5-D");
  TORCH_CHECK(x.is_contiguous(format_of(x)), "normcheck groupnorm: x must be channels-last");
  TORCH_CHECK(G >= 1 && x.size(1) % G == 0, "normcheck groupnorm: C must be divisible by G");
}

template <typename F>
void dispatch(at::ScalarType xt, at::ScalarType pt, const F& f) {
  using at::ScalarType;
  if (xt == ScalarType::Float && pt == ScalarType::Float) return f(float(), float());
  if (xt == ScalarType::Double && pt == ScalarType::Double) return f(double(), double());
  if (xt == ScalarType::BFloat16 && pt == ScalarType::Float) return f(at::BFloat16(), float());
  if (xt == ScalarType::Half && pt == ScalarType::Float) return f(at::Half(), float());
  if (xt == ScalarType::BFloat16 && pt == ScalarType::BFloat16) return f(at::BFloat16(), at::BFloat16());
  if (xt == ScalarType::Half && pt == ScalarType::Half) return f(at::Half(), at::Half());
  TORCH_CHECK(false, "normcheck groupnorm: unsupported dtype combination ", xt, " / ", pt);
}

at::ScalarType scalar_type_named(const std::string& name) {
  if (name == "f32") return at::kFloat;
  if (name == "f64") return at::kDouble;
  if (name == "bf16") return at::kBFloat16;
  if (name == "f16") return at::kHalf;
  TORCH_CHECK(false, "normcheck groupnorm: unknown parameter dtype ", name);
}

template <typename P>
const P* opt_ptr(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr<P>() : nullptr;
}

// returns y, mean, rstd (mean/rstd float64, shape (N, G))
std::vector<at::Tensor> forward(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                const c10::optional<at::Tensor>& bias, int64_t G, double eps, int64_t strategy,
                                int64_t threads, const std::string& param_name) {
  const auto param_type = scalar_type_named(param_name);
  check_input(x, G);
  const Dims d = dims_of(x, G);
  auto y = at::empty_like(x, x.options(), format_of(x));
  auto mean = at::empty({d.N, G}, x.options().dtype(at::kDouble));
  auto rstd = at::empty({d.N, G}, x.options().dtype(at::kDouble));
  if (x.numel() == 0) return {y, mean, rstd};
  threads = std::max<int64_t>(1, threads);
  dispatch(x.scalar_type(), param_type, [&](auto xt, auto pt) {
    using T = decltype(xt);
    using PT = decltype(pt);
    auto fn = strategy == 1 ? forward_groups<T, PT> : forward_pixels<T, PT>;
    fn(x.data_ptr<T>(), opt_ptr<PT>(weight), opt_ptr<PT>(bias), y.data_ptr<T>(), mean.data_ptr<double>(),
       rstd.data_ptr<double>(), d, eps, threads);
  });
  return {y, mean, rstd};
}

// returns dx, dweight, dbias (undefined where not requested)
std::vector<at::Tensor> backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& mean,
                                 const at::Tensor& rstd, const c10::optional<at::Tensor>& weight, int64_t G,
                                 int64_t strategy, int64_t threads, bool need_dx, bool need_dw, bool need_db,
                                 const std::string& param_name) {
  const auto param_type = scalar_type_named(param_name);
  check_input(x, G);
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type() && dy.is_contiguous(format_of(x)),
              "normcheck groupnorm: dy must match x in shape, dtype and memory format");
  const Dims d = dims_of(x, G);
  auto mean64 = mean.to(at::kDouble).contiguous();
  auto rstd64 = rstd.to(at::kDouble).contiguous();
  at::Tensor dx, dw, db;
  auto popts = x.options().dtype(param_type);
  if (need_dx) dx = at::empty_like(x, x.options(), format_of(x));
  if (need_dw) dw = at::zeros({d.C}, popts);
  if (need_db) db = at::zeros({d.C}, popts);
  if (x.numel() == 0 || !(need_dx || need_dw || need_db)) return {dx, dw, db};
  threads = std::max<int64_t>(1, threads);
  dispatch(x.scalar_type(), param_type, [&](auto xt, auto pt) {
    using T = decltype(xt);
    using PT = decltype(pt);
    auto fn = strategy == 1 ? backward_groups<T, PT> : backward_pixels<T, PT>;
    fn(dy.data_ptr<T>(), x.data_ptr<T>(), mean64.data_ptr<double>(), rstd64.data_ptr<double>(),
       opt_ptr<PT>(weight), need_dx ? dx.data_ptr<T>() : nullptr, need_dw ? dw.data_ptr<PT>() : nullptr,
       need_db ? db.data_ptr<PT>() : nullptr, d, threads);
  });
  return {dx, dw, db};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "GroupNorm forward, channels-last CPU");
  m.def("backward", &backward, "GroupNorm backward, channels-last CPU");
}
