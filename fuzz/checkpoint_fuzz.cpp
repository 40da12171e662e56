// libFuzzer target: a checkpoint's trainer_state.json as a resume reads it (docs/TESTING.md, "Fuzzing"): every
// field the run continues from, read and checked. Anything but a state or a trl::Error is a finding.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "train/saved_state.h"
#include "trl/core/error.h"

TRL_FUZZ_TARGET(checkpoint) {
  try {
    const trl::SavedTrainerState s = trl::read_trainer_state(trl::fuzz::write("checkpoint-1/trainer_state.json", data, size));
    (void)s.trl_cpp.dump();
  } catch (const trl::Error&) {
  }
  return 0;
}
