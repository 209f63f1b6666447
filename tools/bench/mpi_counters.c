// What a save or a load asks of MPI, counted per rank (issue 42): wrappers of the MPI calls h5ddp, HDF5 and the
// benchmark make (the MPI profiling interface: each forwards to its PMPI_ twin). Linked into
// h5ddp-bench-checkpoint with its symbols exported, so calls from h5ddp's and HDF5's shared libraries reach them.
// Counted: collective calls and the bytes each rank contributes to them, point-to-point messages and bytes,
// MPI-IO calls (metadata and independent data I/O: HDF5 reads and writes its metadata through them), and the
// bytes of collective MPI-IO transfers. O_DIRECT writes (pwrite) bypass MPI and are not counted.
#include "mpi_counters.h"

#include <mpi.h>

static struct mpi_counters g_counts;

void mpi_counters_read(struct mpi_counters* out) {
  *out = g_counts;
}

static uint64_t bytes_of(int count, MPI_Datatype type) {
  int size = 0;
  if (type == MPI_DATATYPE_NULL || PMPI_Type_size(type, &size) != MPI_SUCCESS) return 0;
  return (uint64_t)count * (uint64_t)size;
}
static void coll(uint64_t bytes) {
  ++g_counts.collectives;
  g_counts.collective_bytes += bytes;
}
static void p2p(uint64_t bytes) {
  ++g_counts.p2p_messages;
  g_counts.p2p_bytes += bytes;
}

int MPI_Barrier(MPI_Comm comm) {
  coll(0);
  return PMPI_Barrier(comm);
}
int MPI_Bcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  coll(bytes_of(count, type));
  return PMPI_Bcast(buf, count, type, root, comm);
}
int MPI_Allreduce(const void* s, void* r, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  coll(bytes_of(count, type));
  return PMPI_Allreduce(s, r, count, type, op, comm);
}
int MPI_Reduce(const void* s, void* r, int count, MPI_Datatype type, MPI_Op op, int root, MPI_Comm comm) {
  coll(bytes_of(count, type));
  return PMPI_Reduce(s, r, count, type, op, root, comm);
}
int MPI_Allgather(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, MPI_Comm comm) {
  coll(bytes_of(sc, st));
  return PMPI_Allgather(s, sc, st, r, rc, rt, comm);
}
int MPI_Allgatherv(const void* s, int sc, MPI_Datatype st, void* r, const int rc[], const int displs[], MPI_Datatype rt,
                   MPI_Comm comm) {
  coll(bytes_of(sc, st));
  return PMPI_Allgatherv(s, sc, st, r, rc, displs, rt, comm);
}
int MPI_Gather(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, int root, MPI_Comm comm) {
  coll(bytes_of(sc, st));
  return PMPI_Gather(s, sc, st, r, rc, rt, root, comm);
}
int MPI_Gatherv(const void* s, int sc, MPI_Datatype st, void* r, const int rc[], const int displs[], MPI_Datatype rt,
                int root, MPI_Comm comm) {
  coll(bytes_of(sc, st));
  return PMPI_Gatherv(s, sc, st, r, rc, displs, rt, root, comm);
}
int MPI_Scatter(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, int root, MPI_Comm comm) {
  coll(bytes_of(rc, rt));
  return PMPI_Scatter(s, sc, st, r, rc, rt, root, comm);
}
int MPI_Alltoall(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, MPI_Comm comm) {
  int n = 1;
  PMPI_Comm_size(comm, &n);
  coll(bytes_of(sc, st) * (uint64_t)n);
  return PMPI_Alltoall(s, sc, st, r, rc, rt, comm);
}
int MPI_Alltoallv(const void* s, const int sc[], const int sd[], MPI_Datatype st, void* r, const int rc[],
                  const int rd[], MPI_Datatype rt, MPI_Comm comm) {
  int n = 1;
  PMPI_Comm_size(comm, &n);
  uint64_t b = 0;
  for (int i = 0; i < n; ++i) b += bytes_of(sc[i], st);
  coll(b);
  return PMPI_Alltoallv(s, sc, sd, st, r, rc, rd, rt, comm);
}
int MPI_Reduce_scatter(const void* s, void* r, const int rc[], MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  int n = 1;
  PMPI_Comm_size(comm, &n);
  uint64_t b = 0;
  for (int i = 0; i < n; ++i) b += bytes_of(rc[i], type);
  coll(b);
  return PMPI_Reduce_scatter(s, r, rc, type, op, comm);
}
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* out) {
  coll(0);
  return PMPI_Comm_dup(comm, out);
}
int MPI_Send(const void* b, int c, MPI_Datatype t, int dest, int tag, MPI_Comm comm) {
  p2p(bytes_of(c, t));
  return PMPI_Send(b, c, t, dest, tag, comm);
}
int MPI_Isend(const void* b, int c, MPI_Datatype t, int dest, int tag, MPI_Comm comm, MPI_Request* req) {
  p2p(bytes_of(c, t));
  return PMPI_Isend(b, c, t, dest, tag, comm, req);
}
int MPI_Sendrecv(const void* sb, int sc, MPI_Datatype st, int dest, int stag, void* rb, int rc, MPI_Datatype rt,
                 int src, int rtag, MPI_Comm comm, MPI_Status* status) {
  p2p(bytes_of(sc, st));
  return PMPI_Sendrecv(sb, sc, st, dest, stag, rb, rc, rt, src, rtag, comm, status);
}
// MPI-IO: open, close, set_size and sync are collective; the _at calls independent, the _at_all ones collective.
int MPI_File_open(MPI_Comm comm, const char* name, int mode, MPI_Info info, MPI_File* fh) {
  coll(0);
  ++g_counts.file_calls;
  return PMPI_File_open(comm, name, mode, info, fh);
}
int MPI_File_close(MPI_File* fh) {
  coll(0);
  ++g_counts.file_calls;
  return PMPI_File_close(fh);
}
int MPI_File_set_size(MPI_File fh, MPI_Offset size) {
  coll(0);
  ++g_counts.file_calls;
  return PMPI_File_set_size(fh, size);
}
int MPI_File_sync(MPI_File fh) {
  coll(0);
  ++g_counts.file_calls;
  return PMPI_File_sync(fh);
}
int MPI_File_read_at(MPI_File fh, MPI_Offset off, void* buf, int count, MPI_Datatype type, MPI_Status* st) {
  ++g_counts.file_calls;
  g_counts.file_bytes += bytes_of(count, type);
  return PMPI_File_read_at(fh, off, buf, count, type, st);
}
int MPI_File_write_at(MPI_File fh, MPI_Offset off, const void* buf, int count, MPI_Datatype type, MPI_Status* st) {
  ++g_counts.file_calls;
  g_counts.file_bytes += bytes_of(count, type);
  return PMPI_File_write_at(fh, off, buf, count, type, st);
}
int MPI_File_read_at_all(MPI_File fh, MPI_Offset off, void* buf, int count, MPI_Datatype type, MPI_Status* st) {
  coll(0);
  ++g_counts.file_calls;
  g_counts.file_bytes += bytes_of(count, type);
  return PMPI_File_read_at_all(fh, off, buf, count, type, st);
}
int MPI_File_write_at_all(MPI_File fh, MPI_Offset off, const void* buf, int count, MPI_Datatype type, MPI_Status* st) {
  coll(0);
  ++g_counts.file_calls;
  g_counts.file_bytes += bytes_of(count, type);
  return PMPI_File_write_at_all(fh, off, buf, count, type, st);
}
int MPI_File_write_all(MPI_File fh, const void* buf, int count, MPI_Datatype type, MPI_Status* st) {
  coll(0);
  ++g_counts.file_calls;
  g_counts.file_bytes += bytes_of(count, type);
  return PMPI_File_write_all(fh, buf, count, type, st);
}
int MPI_File_read_all(MPI_File fh, void* buf, int count, MPI_Datatype type, MPI_Status* st) {
  coll(0);
  ++g_counts.file_calls;
  g_counts.file_bytes += bytes_of(count, type);
  return PMPI_File_read_all(fh, buf, count, type, st);
}
int MPI_File_set_view(MPI_File fh, MPI_Offset disp, MPI_Datatype et, MPI_Datatype ft, const char* rep, MPI_Info info) {
  coll(0);
  ++g_counts.file_calls;
  return PMPI_File_set_view(fh, disp, et, ft, rep, info);
}
int MPI_File_get_size(MPI_File fh, MPI_Offset* size) {
  ++g_counts.file_calls;
  return PMPI_File_get_size(fh, size);
}
