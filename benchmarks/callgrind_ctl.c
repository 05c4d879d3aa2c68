/* Valgrind client requests for benchmarks/callgrind_count.py: a Python process running under
 * `valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no` calls these through ctypes to
 * count exactly the code it brackets. Outside valgrind each is a no-op (a few instructions). */
#include <valgrind/callgrind.h>

void cg_toggle_collect(void) { CALLGRIND_TOGGLE_COLLECT; }
void cg_start_instrumentation(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_stop_instrumentation(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void cg_zero_stats(void) { CALLGRIND_ZERO_STATS; }
void cg_dump_stats_at(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
int cg_running_on_valgrind(void) { return RUNNING_ON_VALGRIND; }
