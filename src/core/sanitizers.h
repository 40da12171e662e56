// TRL_ASAN: 1 when this file is compiled with AddressSanitizer, by GCC (__SANITIZE_ADDRESS__) or clang
// (__has_feature(address_sanitizer)), else 0. The sanitizer build compiles the small hot loops once (no target_clones:
// their ifunc resolvers run before the sanitizer's runtime is ready) and the tests skip the long learning runs there.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define TRL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRL_ASAN 1
#endif
#endif
#ifndef TRL_ASAN
#define TRL_ASAN 0
#endif
