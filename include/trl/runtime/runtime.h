// Process-wide runtime settings read from the environment: visible cores, threads, cache folder. (Devices are the
// backend registry's: trl/backend/registry.h.)
#pragma once

#include <string>
#include <vector>

namespace trl {

// Parses a core list such as "0-3", "0,1" or "2,4-5" (like NEURON_RT_VISIBLE_CORES). Throws on a malformed list,
// a duplicate, or a core that this machine does not have (`num_cores`).
std::vector<int> parse_core_list(const std::string& text, int num_cores);
// The inverse: sorted cores as the shortest such list ({0, 1, 2, 5} -> "0-2,5").
std::string format_core_list(const std::vector<int>& cores);
// This rank's cores in a distributed run (set_rank_cores), else TRL_VISIBLE_CORES, else every core of the machine.
std::vector<int> visible_cores();
// The cores a distributed run gave this rank (dist::pin_local_cores): visible_cores() and num_threads() follow them.
void set_rank_cores(std::vector<int> cores);
// TRL_NUM_THREADS, else the number of visible cores.
int num_threads();
// Makes num_threads() OpenMP's thread count for the calling thread's parallel loops outside programs (the trainer's
// host loops, conversions). OpenMP fixes its default when the library loads, from the cores the process had then:
// a rank pinned later to 1 of 2 cores would run 2 threads on one core, each spinning while the other works
// (measured 70x slower steps). set_rank_cores calls it; the CLI calls it at start.
void apply_num_threads();
// TRL_CACHE_DIR, else $XDG_CACHE_HOME/trl.cpp, else ~/.cache/trl.cpp.
std::string cache_dir();

}  // namespace trl
