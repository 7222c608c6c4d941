/* Maps the symbol-less "libcuda.so.1" and sleeps: a target for the no-symbols error path. */
#include <unistd.h>
int cuda_sim_placeholder(void);
int main(void) { cuda_sim_placeholder(); sleep(30); return 0; }
