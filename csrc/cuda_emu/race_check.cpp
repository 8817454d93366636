// Data-race check of the CUDA kernels: runs every kernel (forward and backward, float and
// double) once on small random inputs through the emulation, to be built with
// -fsanitize=thread. Within a block, threads of the emulation only synchronise at
// __syncthreads(), so a missing barrier between a write and a read of shared or global memory
// by different threads is reported by ThreadSanitizer (exit code 66) whether or not the race
// changes the result on this run. Usage: race_check [T B H d threads]. Use at least two warps
// (threads > 32): a warp's lanes meet at every shuffle, so only barriers between warps are
// checked. Built with -DRFWP_RACE_ONLY_LT_DELTA it runs only lt and delta (lt_delta.cu alone), with
// -DRFWP_RACE_ONLY_MAMBA only mamba (selective_scan.cu and lt_delta.cu, whose smem_request it uses).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../cuda/fastweight_cuda.h"

#if defined(RFWP_RACE_ONLY_LT_DELTA) || defined(RFWP_RACE_ONLY_MAMBA)
#define RFWP_RACE_SUBSET 1
// lt_delta.cu's smem_request names every op's sizes; this build has only some of the ops
namespace rfwp::cuda {
std::size_t delta_rnn_smem_bytes(const Dims&, std::size_t, bool, bool) { return 0; }
std::size_t rdn_smem_bytes(const Dims&, std::size_t, bool, bool) { return 0; }
std::size_t product_smem_bytes(const Dims&, std::size_t, bool, bool) { return 0; }
std::size_t srwm_smem_bytes(const Dims&, std::size_t, bool, bool) { return 0; }
#ifndef RFWP_RACE_ONLY_MAMBA
std::size_t mamba_smem_bytes(const Dims&, std::size_t, bool, bool) { return 0; }
#endif
}  // namespace rfwp::cuda
#endif

namespace {

template <typename S>
struct Pool {
  std::mt19937 gen{1234};
  std::vector<std::vector<S>> bufs;
  S* rnd(std::size_t n, S lo = S(0.05), S hi = S(0.5)) {
    std::uniform_real_distribution<double> u(lo, hi);
    bufs.emplace_back(n);
    for (auto& x : bufs.back()) x = static_cast<S>(u(gen));
    return bufs.back().data();
  }
  S* out(std::size_t n) {
    bufs.emplace_back(n, S(0));
    return bufs.back().data();
  }
};

template <typename S>
int run(int T, int B, int H, int d, int threads) {
  using namespace rfwp;
  const int chunk = 2;
  const Dims n{T, B, H, d, d, chunk};
  const std::size_t vec = static_cast<std::size_t>(T) * B * H * d, sc = static_cast<std::size_t>(T) * B * H;
  const std::size_t mat = static_cast<std::size_t>(B) * H * d * d, st = static_cast<std::size_t>(B) * H * d;
  const std::size_t ck = static_cast<std::size_t>(num_chunks(T, chunk)) * mat, hm = static_cast<std::size_t>(H) * d * d;
  std::vector<uint8_t> reset(static_cast<std::size_t>(T) * B, 0);
  reset[static_cast<std::size_t>(T / 2) * B] = 1;   // entry 0 resets mid-sequence
  Pool<S> p;
  int err = 0;
#if !defined(RFWP_RACE_SUBSET) || defined(RFWP_RACE_ONLY_LT_DELTA)
  for (int lt = 0; lt < 2; ++lt) {
    DeltaFwdArgs<S> f{p.rnd(vec), p.rnd(vec), p.rnd(vec), lt ? nullptr : p.rnd(sc), p.rnd(mat),
                      reset.data(), p.out(vec), p.out(mat),
                      p.out(static_cast<std::size_t>(cuda_lt_delta_saved(n, !lt))), n};
    err |= lt ? cuda::lt_forward(f, threads, nullptr) : cuda::delta_forward(f, threads, nullptr);
    DeltaBwdArgs<S> b{f.q, f.k, f.v, f.beta, reset.data(), f.ckpt, p.rnd(vec), p.rnd(mat),
                      p.out(vec), p.out(vec), p.out(vec), lt ? nullptr : p.out(sc), p.out(mat), n};
    S* work = p.out(cuda::lt_delta_workspace_elems(n));
    err |= lt ? cuda::lt_backward(b, work, threads, nullptr) : cuda::delta_backward(b, work, threads, nullptr);
  }
#endif
#ifndef RFWP_RACE_SUBSET
  DeltaRnnFwdArgs<S> rf{p.rnd(vec), p.rnd(vec), p.rnd(vec), p.rnd(sc), p.rnd(vec), p.rnd(vec),
                        p.rnd(sc), p.rnd(mat), p.rnd(mat), p.rnd(st), reset.data(), p.out(vec),
                        p.out(mat), p.out(mat), p.out(ck), p.out(ck), p.out(vec), n};
  err |= cuda::delta_rnn_forward(rf, threads, nullptr);
  DeltaRnnBwdArgs<S> rb{rf.q, rf.k, rf.v, rf.beta, rf.kr, rf.vr, rf.beta_r, rf.s,
                        reset.data(), rf.ckptW, rf.ckptR, p.rnd(vec), p.rnd(mat), p.rnd(mat),
                        p.out(vec), p.out(vec), p.out(vec), p.out(sc), p.out(vec), p.out(vec),
                        p.out(sc), p.out(mat), p.out(mat), p.out(st), n};
  err |= cuda::delta_rnn_backward(rb, p.out(cuda::delta_rnn_workspace_elems(n)), threads, nullptr);
  RdnFwdArgs<S> df{p.rnd(vec), p.rnd(vec), p.rnd(vec), p.rnd(sc), p.rnd(hm), p.rnd(hm), p.rnd(hm),
                   p.rnd(static_cast<std::size_t>(H) * d), p.rnd(mat), p.rnd(st), reset.data(),
                   p.out(vec), p.out(mat), p.out(ck), p.out(vec), p.out(vec), p.out(vec),
                   p.out(sc), p.out(vec), n};
  err |= cuda::rdn_forward(df, threads, nullptr);
  RdnBwdArgs<S> db{df.Rq, df.Rk, df.Rv, df.rb, df.h, df.q, df.k, df.v, df.beta,
                   reset.data(), df.ckpt, p.rnd(vec), p.rnd(mat), p.out(vec), p.out(vec),
                   p.out(vec), p.out(sc), p.out(mat), p.out(mat), p.out(mat), p.out(st),
                   p.out(hm), p.out(hm), p.out(hm), p.out(static_cast<std::size_t>(H) * d),
                   p.out(mat), p.out(st), n};
  err |= cuda::rdn_backward(db, p.out(cuda::rdn_workspace_elems(n)), threads, nullptr);
  // gated_delta (alpha, nh = 1) and delta_product (nh = 2)
  for (int nh = 1; nh <= 2; ++nh) {
    const std::size_t vn = vec * nh, sn = sc * nh;
    ProductFwdArgs<S> pf{p.rnd(vec), p.rnd(vn), p.rnd(vn), nh == 1 ? p.rnd(sc) : nullptr, p.rnd(sn),
                         p.rnd(mat), reset.data(), p.out(vec), p.out(mat), p.out(ck), n, nh};
    err |= cuda::product_forward(pf, threads, nullptr);
    ProductBwdArgs<S> pb{pf.q, pf.k, pf.v, pf.alpha, pf.beta, reset.data(), pf.ckpt, p.rnd(vec),
                         p.rnd(mat), p.out(vec), p.out(vn), p.out(vn), nh == 1 ? p.out(sc) : nullptr,
                         p.out(sn), p.out(mat), n, nh};
    err |= cuda::product_backward(pb, p.out(cuda::product_workspace_elems(n, nh)), threads, nullptr);
  }
  // srwm: W_init [H, 3d + 4, d], dW [B, H, 3d + 4, d]
  const std::size_t R = 3 * static_cast<std::size_t>(d) + 4, wm = static_cast<std::size_t>(B) * H * R * d;
  SrwmFwdArgs<S> sf{p.rnd(vec), p.rnd(static_cast<std::size_t>(H) * R * d), p.rnd(wm), reset.data(),
                    p.out(vec), p.out(wm), p.out(static_cast<std::size_t>(num_chunks(T, chunk)) * wm), n};
  err |= cuda::srwm_forward(sf, threads, nullptr);
  SrwmBwdArgs<S> sb{sf.x, sf.Winit, reset.data(), sf.ckpt, p.rnd(vec), p.rnd(wm), p.out(vec),
                    p.out(wm), p.out(static_cast<std::size_t>(H) * R * d), p.out(wm), n};
  err |= cuda::srwm_backward(sb, p.out(cuda::srwm_workspace_elems(n)), threads, nullptr);
#endif
#if !defined(RFWP_RACE_SUBSET) || defined(RFWP_RACE_ONLY_MAMBA)
  // mamba: D = H d channels of N = d state values per batch entry, both layouts (the state in
  // shared memory, and in global memory on a device without room for it)
  const int D = H * d;
  const Dims m{T, B, 1, d, D, chunk};
  const std::size_t m_vec = static_cast<std::size_t>(T) * B * D, m_bc = static_cast<std::size_t>(T) * B * d;
  const std::size_t m_state = static_cast<std::size_t>(B) * D * d, m_A = static_cast<std::size_t>(D) * d;
  for (int staged = 1; staged >= 0; --staged) {
    cuda_emu::reported_smem_optin = staged ? cuda_emu::kMaxSharedBytesOptin : 1;
    MambaFwdArgs<S> mf{p.rnd(m_vec), p.rnd(m_vec), p.rnd(m_A, S(-1), S(-0.1)), p.rnd(m_bc), p.rnd(m_bc),
                       p.rnd(m_state), reset.data(), p.out(m_vec), p.out(m_state),
                       p.out(static_cast<std::size_t>(num_chunks(T, chunk)) * m_state), m};
    err |= cuda::mamba_forward(mf, threads, nullptr);
    MambaBwdArgs<S> mb{mf.u, mf.delta, mf.A, mf.Bm, mf.C, reset.data(), mf.ckpt, p.rnd(m_vec), p.rnd(m_state),
                       p.out(m_vec), p.out(m_vec), p.out(m_state), p.out(m_A), p.out(m_bc), p.out(m_bc),
                       p.out(m_state), m};
    err |= cuda::mamba_backward(mb, p.out(cuda::mamba_workspace_elems(m)), threads, nullptr);
  }
  cuda_emu::reported_smem_optin = cuda_emu::kMaxSharedBytesOptin;
#endif
  return err;
}

}  // namespace

int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 4, B = argc > 2 ? std::atoi(argv[2]) : 1,
            H = argc > 3 ? std::atoi(argv[3]) : 2, d = argc > 4 ? std::atoi(argv[4]) : 5,
            threads = argc > 5 ? std::atoi(argv[5]) : 64;
  const int err = run<float>(T, B, H, d, threads) | run<double>(T, B, H, d, threads);
  std::printf("race_check T=%d B=%d H=%d d=%d threads=%d: launch errors %d\n", T, B, H, d, threads, err);
  return err == 0 ? 0 : 1;
}
