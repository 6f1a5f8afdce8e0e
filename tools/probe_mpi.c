/* probe_mpi.c - pipecc-probe: measures the MPI link between two ranks.
 *
 *   mpirun -n 2 bin/pipecc-probe
 *
 * Ping-pong of 8-byte messages gives the latency (half a round trip), of
 * 4 MiB messages the bandwidth.  Rank 0 prints one devices-file line,
 * "link * bandwidth=...G latency=...us", which pipecc stores in its machine
 * cache.  Run across two nodes (a hostfile) to measure the real network.
 *
 *   bin/pipecc-probe --kernels MODEL.onnx [--batch B --microbatches M ...]
 *
 * times pipecc's kernels at MODEL's shapes into the kernel cache
 * (probe_kernels.c, docs/cost.md). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double pingpong(int rank, char *buf, int bytes, int reps) {
  MPI_Barrier(MPI_COMM_WORLD);
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t0 = MPI_Wtime();
    if (rank == 0) {
      MPI_Send(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
      MPI_Recv(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
    double t = (MPI_Wtime() - t0) / 2;
    if (t < best) best = t;
  }
  return best;
}

int probe_kernels(int argc, char **argv); /* probe_kernels.c */

int main(int argc, char **argv) {
  /* pipecc-probe --kernels MODEL ...: fills pipecc's kernel-time cache (no MPI here; mpirun is its child). */
  if (argc > 1 && !strcmp(argv[1], "--kernels")) return probe_kernels(argc, argv);
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) {
    if (!rank) fprintf(stderr, "pipecc-probe: run it with two ranks: mpirun -n 2 %s\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  enum { BIG = 4 << 20 };
  char *buf = malloc(BIG);
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
  memset(buf, 1, BIG);
  double lat = pingpong(rank, buf, 8, 200);
  double big = pingpong(rank, buf, BIG, 20);
  double bw = BIG / (big - lat > 0 ? big - lat : big);
  if (!rank) printf("link * bandwidth=%.4gG latency=%.3gus\n", bw / 1e9, lat * 1e6);
  free(buf);
  MPI_Finalize();
  return 0;
}
