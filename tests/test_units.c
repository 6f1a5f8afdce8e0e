/* test_units.c - small pieces: sizes, the devices file, schedule orders and
 * their timing against the closed forms. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "schedule.h"

#include "check.h"

/* An "ok" summary line is printed only when every check since `since` held. */
#define OK_IF_NONE_FAILED(since, ...) \
  do {                                \
    if (failed == (since)) printf("ok - " __VA_ARGS__); \
  } while (0)

static void test_sizes(void) {
  int f0 = failed;
  CHECK(parse_size("4G") == 4.0 * (1 << 30), "4G\n");
  CHECK(parse_size("512M") == 512.0 * (1 << 20), "512M\n");
  CHECK(parse_size("1.5GiB") == 1.5 * (1 << 30), "1.5GiB\n");
  CHECK(parse_size("100000") == 100000, "plain bytes\n");
  CHECK(parse_size("12X") < 0 && parse_size("") < 0 && parse_size("-1G") < 0 && parse_size("G") < 0, "bad sizes rejected\n");
  OK_IF_NONE_FAILED(f0, "sizes\n");
}

static void test_devices(void) {
  int f0 = failed;
  Machine m;
  err_clear();
  int rc = machine_parse(&m, 3, "# two speeds\nrank * flops=10G mem=1G\nrank 2 flops=20G\nlink * bandwidth=1G latency=5us\n"
                                "link 1 bandwidth=2G\nmemcpy bandwidth=8G\n", "d.txt");
  CHECK(rc == 0, "valid devices file: %s\n", err_msg());
  CHECK(m.dev[0].flops == 10e9 && m.dev[1].flops == 10e9 && m.dev[2].flops == 20e9, "rank rates\n");
  CHECK(m.dev[0].mem_bytes == 1.0 * (1 << 30) && m.dev[2].mem_bytes == 0, "rank memory\n");
  CHECK(m.link[0].bandwidth == 1e9 && fabs(m.link[0].latency - 5e-6) < 1e-12 && m.link[1].bandwidth == 2e9, "links\n");
  CHECK(m.memcpy_bw == 8e9, "memcpy\n");
  const char *bad[][2] = {
      {"rank * flops=abc\nlink * bandwidth=1G\n", "d.txt:1"},
      {"rank * flops=1G\nlinky * bandwidth=1G\n", "d.txt:2: unknown entry 'linky'"},
      {"rank * flops=1G speed=3\n", "unknown key 'speed'"},
      {"rank 0 flops=1G\nlink * bandwidth=1G\n", "rank 1 has no figures"},
      {"rank * flops=1G\n", "link 0"},
      {"rank * mem=1G\n", "needs flops"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err_clear();
    rc = machine_parse(&m, 2, bad[i][0], "d.txt");
    CHECK(rc == -1 && strstr(err_msg(), bad[i][1]), "devices error %zu: got '%s', want '%s'\n", i, rc ? err_msg() : "ok",
          bad[i][1]);
  }
  OK_IF_NONE_FAILED(f0, "devices files\n");
}

static void orders(int kind, int p, int m) {
  Pool pool = {0};
  StageCost unit[16];
  memset(unit, 0, sizeof unit);
  for (int s = 0; s < p; s++) unit[s].fwd = unit[s].bwd = 1;
  Schedule sc;
  schedule_build(&sc, kind, p, m, 0, unit, &pool);
  for (int s = 0; s < p; s++) {
    /* Every micro-batch once forward and once backward, its forward first. */
    int fseen[64] = {0}, bseen[64] = {0}, ok = 1, inflight = 0, peak = 0;
    for (int k = 0; k < sc.nact[s]; k++) {
      Action *a = &sc.act[s][k];
      if (a->kind == ACT_F) fseen[a->mb]++, inflight++;
      else if (a->kind == ACT_B) ok &= fseen[a->mb] == 1, bseen[a->mb]++, inflight--;
      if (inflight > peak) peak = inflight;
    }
    for (int i = 0; i < m; i++) ok &= fseen[i] == 1 && bseen[i] == 1;
    CHECK(ok, "%s p=%d m=%d stage %d: bad action order\n", schedule_name(kind), p, m, s);
    int want = stage_inflight(kind, s, p, m);
    CHECK(peak == want, "%s p=%d m=%d stage %d: peak in flight %d, expected %d\n", schedule_name(kind), p, m, s, peak, want);
  }
  /* Equal unit stages: the makespan is 2(m + p - 1) slots and the bubble (p-1)/(m+p-1). */
  CHECK(fabs(sc.step_time - 2.0 * (m + p - 1)) < 1e-9, "%s p=%d m=%d: step %g, expected %d\n", schedule_name(kind), p, m,
        sc.step_time, 2 * (m + p - 1));
  CHECK(fabs(sc.bubble - schedule_ideal_bubble(p, m)) < 1e-9, "%s p=%d m=%d: bubble %g, expected %g\n", schedule_name(kind),
        p, m, sc.bubble, schedule_ideal_bubble(p, m));
  pool_free(&pool);
}

static void test_schedules(void) {
  int f0 = failed;
  for (int kind = 0; kind < 2; kind++)
    for (int p = 1; p <= 8; p++)
      for (int m = 1; m <= 12; m++) orders(kind, p, m);
  OK_IF_NONE_FAILED(f0, "gpipe and 1f1b orders, in-flight counts and bubbles for p <= 8, m <= 12\n");
}

int main(void) {
  test_sizes();
  test_devices();
  test_schedules();
  return check_finish();
}
