/* The price of one read of a thread's schedstat (what the shim's CPU sampler does once a second per
 * CUDA thread): gcc -O2 scripts/schedstat_read_cost.c -o /tmp/ss && /tmp/ss */
#include <stdio.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <sys/syscall.h>
int main(){char p[64];snprintf(p,64,"/proc/self/task/%ld/schedstat",(long)syscall(SYS_gettid));
struct timespec a,b;char buf[96];clock_gettime(CLOCK_MONOTONIC,&a);
for(int i=0;i<200000;i++){int fd=open(p,O_RDONLY|O_CLOEXEC);read(fd,buf,96);close(fd);}
clock_gettime(CLOCK_MONOTONIC,&b);printf("%.2f us per read\n",((b.tv_sec-a.tv_sec)*1e9+(b.tv_nsec-a.tv_nsec))/200000/1e3);}
