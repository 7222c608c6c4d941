/* sched_yield in a loop: ROUNDS runs of N yields, after DELAY_S seconds (time to attach);
 * prints ns per yield for each run (scripts/watch_yield_cost.sh). */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  int rounds=atoi(argv[1]); long n=atol(argv[2]);
  sleep(atoi(argv[3])); /* time to attach */
  for(int r=0;r<rounds;r++){double t0=now();for(long i=0;i<n;i++)sched_yield();printf("%.1f\n",(now()-t0)/n*1e9);fflush(stdout);}
  return 0;}
