/* actions.h - the action kinds (actions.def) as the runtime and the generated
 * programs name them: PR_F, PR_SEND, ..., PR_NKINDS, and the one table of
 * their names.  The compiler numbers the same list as ACT_* (schedule.h) and
 * TL_* (timeline.h), and names them through this table. */
#ifndef PIPERUN_ACTIONS_H
#define PIPERUN_ACTIONS_H

enum {
#define ACTION(name, legend, meaning) PR_##name,
#include "actions.def"
#undef ACTION
  PR_NKINDS
};

/* "F", "SEND_GRAD", ...; "?" for a kind out of range. */
static inline const char *pr_action_name(int kind) {
  static const char *const names[PR_NKINDS] = {
#define ACTION(name, legend, meaning) #name,
#include "actions.def"
#undef ACTION
  };
  return kind >= 0 && kind < PR_NKINDS ? names[kind] : "?";
}

/* A timeline legend's words for the kind ("forward", "send gradient", ...); "?" out of range. */
static inline const char *pr_action_legend(int kind) {
  static const char *const legends[PR_NKINDS] = {
#define ACTION(name, legend, meaning) legend,
#include "actions.def"
#undef ACTION
  };
  return kind >= 0 && kind < PR_NKINDS ? legends[kind] : "?";
}
#endif
