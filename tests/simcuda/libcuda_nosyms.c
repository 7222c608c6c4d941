/* A "libcuda.so.1" that exports none of the traced entry points: wedgeprobe must refuse it
 * with one clear line (exit code 7), not crash. */
int cuda_sim_placeholder(void) { return 0; }
