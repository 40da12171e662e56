#include "core/cpu_features.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace trl {

namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Linux (5.16+) hands out the 8 KiB tile data state only to processes that ask: ARCH_REQ_XCOMP_PERM (0x1023) for
// XFEATURE_XTILEDATA (18). The grant covers every thread of the process, present and future.
bool request_amx_permission() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return f;
  unsigned max_leaf = eax;
  char vendor[13] = {};
  std::memcpy(vendor + 0, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  f.vendor = vendor;

  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const bool osxsave = (ecx >> 27) & 1u;
  const bool has_fma = (ecx >> 12) & 1u;
  // The OS must save the vector state we use: XMM|YMM (bits 1,2) for AVX2, plus opmask|ZMM (bits 5,6,7) for AVX-512.
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool os_avx = (xcr0 & 0x6u) == 0x6u;
  const bool os_avx512 = os_avx && (xcr0 & 0xe0u) == 0xe0u;

  if (max_leaf >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    f.avx2 = os_avx && ((ebx >> 5) & 1u);
    f.fma = os_avx && has_fma;
    f.avx512f = os_avx512 && ((ebx >> 16) & 1u);
    f.avx512bw = os_avx512 && ((ebx >> 30) & 1u);
    f.avx512vl = os_avx512 && ((ebx >> 31) & 1u);
    const bool amx_tile = (edx >> 24) & 1u, amx_bf16 = (edx >> 22) & 1u;
    const bool os_amx = (xcr0 & 0x60000u) == 0x60000u;  // XTILECFG, XTILEDATA
    f.amx_bf16 = amx_tile && amx_bf16 && os_amx && !std::getenv("TRL_NO_AMX") && request_amx_permission();
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    f.avx512bf16 = f.avx512f && ((eax >> 5) & 1u);
    // TRL_NO_AVX512=1: the kernels this project dispatches itself run as on a CPU with AVX2 only (the AVX2 test pass
    // on an AVX-512 machine; oneDNN follows ONEDNN_MAX_CPU_ISA, GCC's target_clones the CPU itself).
    if (std::getenv("TRL_NO_AVX512")) f.avx512f = f.avx512bw = f.avx512vl = f.avx512bf16 = f.amx_bf16 = false;
  }

  unsigned ext = __get_cpuid_max(0x80000000u, nullptr);
  if (ext >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002u + i, &eax, &ebx, &ecx, &edx);
      std::memcpy(brand + 16 * i + 0, &eax, 4);
      std::memcpy(brand + 16 * i + 4, &ebx, 4);
      std::memcpy(brand + 16 * i + 8, &ecx, 4);
      std::memcpy(brand + 16 * i + 12, &edx, 4);
    }
    std::string b = brand;
    while (!b.empty() && b.back() == ' ') b.pop_back();
    f.brand = b;
  }
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string best_isa() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512bf16 && f.avx512bw && f.avx512vl) return "avx512bf16";
  if (f.avx512f && f.avx512bw && f.avx512vl) return "avx512";
  if (f.avx2 && f.fma) return "avx2";
  return "scalar";
}

}  // namespace trl
