// Per-rank counts of MPI calls (tools/bench/mpi_counters.c): what a checkpoint save or load costs in
// coordination, counted rather than guessed (issue 42, docs/SCALING.md).
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mpi_counters {
  uint64_t collectives;       // collective calls entered (MPI-IO's collective calls included)
  uint64_t collective_bytes;  // bytes this rank contributed to them (send side)
  uint64_t p2p_messages;      // point-to-point sends
  uint64_t p2p_bytes;
  uint64_t file_calls;  // MPI-IO calls (HDF5's metadata reads and writes go through these)
  uint64_t file_bytes;  // bytes read or written by those calls
};
// This process's counts since it started.
void mpi_counters_read(struct mpi_counters* out);

#ifdef __cplusplus
}
#endif
