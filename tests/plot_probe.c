/* plot_probe.c - runtime/plot.c from the command line, for tests/test_progress.py: logs a run
 * could not write quickly (thousands of rows, a resumed run's repeated steps, stray lines),
 * hostile names and targets.
 *
 *   plot_probe draw LOG VAL|- SVG     plot_log: exit 0, or the message on stderr and exit 1
 *   plot_probe name LOG               plot_name: the picture's name for --log LOG
 *
 * Bad usage: exit 2. */
#include <stdio.h>
#include <string.h>

#include "run.h"

int main(int argc, char **argv) {
  char msg[4400] = "", svg[4200];
  if (argc == 5 && !strcmp(argv[1], "draw")) {
    if (plot_log(argv[2], strcmp(argv[3], "-") ? argv[3] : NULL, argv[4], msg, sizeof msg) == 0) return 0;
    fprintf(stderr, "%s\n", msg);
    return 1;
  }
  if (argc == 3 && !strcmp(argv[1], "name")) {
    if (plot_name(argv[2], svg, sizeof svg)) return 1;
    printf("%s\n", svg);
    return 0;
  }
  fprintf(stderr, "usage: plot_probe draw LOG VAL|- SVG | plot_probe name LOG\n");
  return 2;
}
