/* Diagnostic behind MpiComm's 4 MiB allreduce calls (docs/DESIGN.md, docs/DEFAULTS.md "Allreduce
 * chunks, async mode, openib"): time to allreduce 214 MB of float32 (the large MLP's gradients) in calls of
 * CHUNK_MIB, four ways: blocking / non-blocking, in place / separate send buffer. Not part of the CMake build:
 *   mpicc -O2 tools/bench/mpi_allreduce_chunks.c -o /tmp/arc
 *   for c in 4 16 64; do mpirun --oversubscribe -np 2 /tmp/arc $c; done
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  int provided, rank, size;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const size_t chunk_mib = argc > 1 ? (size_t)atoi(argv[1]) : 4;
  const size_t n = (214u << 20) / 4, chunk = (chunk_mib << 20) / 4, calls = (n + chunk - 1) / chunk;
  float* a = malloc(n * 4);
  float* b = malloc(n * 4);
  MPI_Request* reqs = malloc(calls * sizeof(MPI_Request));
  for (size_t i = 0; i < n; ++i) a[i] = b[i] = 1.0f;
  const char* names[] = {"allreduce-inplace", "allreduce-separate", "iallreduce-inplace", "iallreduce-separate"};
  for (int rep = 0; rep < 3; ++rep) {
    for (int mode = 0; mode < 4; ++mode) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (size_t k = 0; k < calls; ++k) {
        const size_t off = k * chunk;
        const int count = (int)(off + chunk > n ? n - off : chunk);
        const void* send = (mode % 2 == 0) ? MPI_IN_PLACE : (const void*)(b + off);
        if (mode < 2)
          MPI_Allreduce(send, a + off, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else
          MPI_Iallreduce(send, a + off, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &reqs[k]);
      }
      if (mode >= 2) MPI_Waitall((int)calls, reqs, MPI_STATUSES_IGNORE);
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0)
        printf("ranks=%d chunk_mib=%zu rep=%d %s %.3f s\n", size, chunk_mib, rep, names[mode], MPI_Wtime() - t0);
    }
  }
  free(a);
  free(b);
  free(reqs);
  MPI_Finalize();
  return 0;
}
