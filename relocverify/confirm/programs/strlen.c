/* strlen: glibc's strlen over strings of every length from 0 to 300 and every alignment in a page,
 * the shipped uprobes trigger for VEX sites.  Statically linked, its strlen is chosen by glibc's
 * ifunc at startup: __strlen_avx2 on a CPU with AVX2 (QEMU's -cpu max), whose vpcmpeqb (VEX 0f 74)
 * uprobes emulates as a je.  Prints the lengths' sum per alignment and the first few lengths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
  static char page[8192] __attribute__((aligned(4096)));
  int rounds = argc > 1 ? atoi(argv[1]) : 1;
  unsigned long total = 0;
  for (int k = 0; k < rounds; k++)
    for (int align = 0; align < 64; align++) {
      unsigned long sum = 0;
      for (int n = 0; n <= 300; n++) {
        char *s = page + align + 64;
        memset(s, 'a', n);
        s[n] = 0;
        sum += strlen(s);
      }
      total += sum;
      if (k == 0 && align < 4) printf("align %d: sum of strlen(0..300) = %lu\n", align, sum);
    }
  printf("strlen(\"hello, world\") = %zu\n", strlen("hello, world"));
  printf("total %lu\n", total);
  return 0;
}
