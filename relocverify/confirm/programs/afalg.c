/* afalg: a digest through the kernel's AF_ALG hash interface, once per driver named (default: every
 * x86 SHA-256 driver and the generic one), the shipped trigger for kernel VEX sites in the crypto
 * modules (sha256_transform_avx, sha256_transform_rorx: vmovdqa stores, vpshufd, vpsrld/vpslld/vpsrlq
 * have opcode bytes 70-7f, which kprobes' prepare_emulation reads as jcc).  Needs af_alg, algif_hash
 * and sha256_ssse3 loaded.  Prints each driver's digest of a fixed 64 KiB buffer, or its errno.
 *
 *   afalg [DRIVER...]
 */
#include <errno.h>
#include <linux/if_alg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static unsigned char buffer[65536];

static void digest(const char *driver) {
  struct sockaddr_alg sa = {.salg_family = AF_ALG};
  strcpy((char *)sa.salg_type, "hash");
  strncpy((char *)sa.salg_name, driver, sizeof sa.salg_name - 1);
  int tfm = socket(AF_ALG, SOCK_SEQPACKET, 0);
  if (tfm < 0 || bind(tfm, (struct sockaddr *)&sa, sizeof sa) < 0) {
    printf("%s: unavailable (errno %d)\n", driver, errno);
    if (tfm >= 0) close(tfm);
    return;
  }
  int op = accept(tfm, 0, 0);
  unsigned char out[64];
  int n = -1;
  if (op >= 0 && write(op, buffer, sizeof buffer) == sizeof buffer) n = read(op, out, sizeof out);
  printf("%s:", driver);
  for (int i = 0; i < n; i++) printf("%02x", out[i]);
  printf(n > 0 ? "\n" : " failed (errno %d)\n", errno);
  if (op >= 0) close(op);
  close(tfm);
}

int main(int argc, char **argv) {
  for (unsigned i = 0; i < sizeof buffer; i++) buffer[i] = (unsigned char)(i * 7 + (i >> 8));
  const char *all[] = {"sha256-avx2", "sha256-avx", "sha256-ssse3", "sha256-generic", 0};
  if (argc > 1)
    for (int i = 1; i < argc; i++) digest(argv[i]);
  else
    for (int i = 0; all[i]; i++) digest(all[i]);
  return 0;
}
