/* rvctl: the guest side of `relocverify confirm`, statically linked into the initramfs.
 *
 *   rvctl peek ADDR LEN          the live bytes at a kernel address, read from /proc/kcore:
 *                                "RVC:live ADDR HEX" (or "RVC:live ADDR unreadable WHY")
 *   rvctl peeksym SYM OFF LEN    the same at SYM+OFF, SYM's address read from /proc/kallsyms (a
 *                                module's function: where the module loader put it)
 *   rvctl write FILE TEXT        write TEXT to FILE in one write(2):
 *                                "RVC:write FILE 0" or "RVC:write FILE ERRNO NAME: MESSAGE"
 *   rvctl run SECONDS PROG ARGS  run a trigger with its stdout and stderr on a pipe, for at most
 *                                SECONDS: its first lines as "RVC:out LINE", then one line
 *                                "RVC:trigger exit N|signal N|timeout digest HEX bytes N lines N"
 *
 * Every report is one write(2) to stdout (the console), so a kernel message cannot split it.
 * The digest is FNV-1a 64 over everything the trigger wrote: two runs are compared by it.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OUT_LINES 400     /* lines of the trigger's output shown on the console: two boots are compared line by line */
#define OUT_WIDTH 160     /* characters of each */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > (int)sizeof buf - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  (void)!write(1, buf, n);
}

static int peek(const char *addr_text, const char *len_text) {
  unsigned long addr = strtoul(addr_text, 0, 0);
  int len = atoi(len_text);
  if (len <= 0 || len > 64) len = 16;
  int fd = open("/proc/kcore", O_RDONLY);
  if (fd < 0) { say("RVC:live %#lx unreadable /proc/kcore: %s", addr, strerror(errno)); return 1; }
  Elf64_Ehdr eh;
  if (pread(fd, &eh, sizeof eh, 0) != sizeof eh) { say("RVC:live %#lx unreadable no ELF header", addr); return 1; }
  for (int i = 0; i < eh.e_phnum; i++) {
    Elf64_Phdr ph;
    if (pread(fd, &ph, sizeof ph, eh.e_phoff + (off_t)i * sizeof ph) != sizeof ph) break;
    if (ph.p_type != PT_LOAD || addr < ph.p_vaddr || addr + len > ph.p_vaddr + ph.p_memsz) continue;
    unsigned char b[64];
    int n = pread(fd, b, len, ph.p_offset + (addr - ph.p_vaddr));
    if (n != len) { say("RVC:live %#lx unreadable read %d of %d bytes", addr, n, len); return 1; }
    char hex[129];
    for (int j = 0; j < n; j++) sprintf(hex + 2 * j, "%02x", b[j]);
    say("RVC:live %#lx %s", addr, hex);
    return 0;
  }
  say("RVC:live %#lx unreadable not in /proc/kcore", addr);
  return 1;
}

static int peeksym(const char *symbol, const char *offset_text, const char *len_text) {
  FILE *f = fopen("/proc/kallsyms", "r");
  char line[512], name[256], kind;
  unsigned long addr;
  if (!f) { say("RVC:live 0 unreadable /proc/kallsyms: %s", strerror(errno)); return 1; }
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%lx %c %255s", &addr, &kind, name) == 3 && !strcmp(name, symbol)) {
      fclose(f);
      char text[32];
      snprintf(text, sizeof text, "%#lx", addr + strtoul(offset_text, 0, 0));
      return peek(text, len_text);
    }
  }
  fclose(f);
  say("RVC:live 0 unreadable %s is not in /proc/kallsyms", symbol);
  return 1;
}

static int write_file(const char *file, const char *text) {
  int fd = open(file, O_WRONLY | O_APPEND);
  if (fd < 0) { say("RVC:write %s %d %s: %s", file, errno, strerrorname_np(errno), strerror(errno)); return 1; }
  ssize_t n = write(fd, text, strlen(text));
  int e = errno;
  close(fd);
  if (n < 0) { say("RVC:write %s %d %s: %s", file, e, strerrorname_np(e), strerror(e)); return 1; }
  say("RVC:write %s 0", file);
  return 0;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static int run(int seconds, char **argv) {
  int p[2];
  if (pipe(p)) { say("RVC:trigger error pipe: %s", strerror(errno)); return 1; }
  double start = now();
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(p[1], 1); dup2(p[1], 2); close(p[0]); close(p[1]);
    execv(argv[0], argv);
    fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(p[1]);
  unsigned long long digest = 0xcbf29ce484222325ULL, bytes = 0, lines = 0;
  char line[OUT_WIDTH + 1];
  int used = 0, shown = 0, timed_out = 0, open_pipe = 1;
  while (open_pipe) {
    int left = (int)((start + seconds - now()) * 1000);
    if (left <= 0) { timed_out = 1; break; }
    struct pollfd q = {p[0], POLLIN, 0};
    if (poll(&q, 1, left) <= 0) continue;
    char buf[4096];
    ssize_t n = read(p[0], buf, sizeof buf);
    if (n <= 0) { open_pipe = 0; break; }
    for (ssize_t i = 0; i < n; i++) {
      unsigned char c = buf[i];
      digest = (digest ^ c) * 0x100000001b3ULL;
      bytes++;
      if (c == '\n') {
        lines++;
        if (shown < OUT_LINES) { line[used] = 0; say("RVC:out %s", line); shown++; }
        used = 0;
      } else if (used < OUT_WIDTH) {
        line[used++] = (c >= 0x20 && c < 0x7f) ? c : '?';
      }
    }
  }
  if (used && shown < OUT_LINES) { line[used] = 0; say("RVC:out %s", line); lines++; }
  int status = 0;
  if (timed_out) {
    kill(-pid, SIGKILL); kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    say("RVC:trigger timeout digest %016llx bytes %llu lines %llu seconds %d", digest, bytes, lines, seconds);
    return 0;
  }
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status))
    say("RVC:trigger signal %d digest %016llx bytes %llu lines %llu", WTERMSIG(status), digest, bytes, lines);
  else
    say("RVC:trigger exit %d digest %016llx bytes %llu lines %llu", WEXITSTATUS(status), digest, bytes, lines);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "peek")) return peek(argv[2], argv[3]);
  if (argc == 5 && !strcmp(argv[1], "peeksym")) return peeksym(argv[2], argv[3], argv[4]);
  if (argc == 4 && !strcmp(argv[1], "write")) return write_file(argv[2], argv[3]);
  if (argc >= 4 && !strcmp(argv[1], "run")) return run(atoi(argv[2]), argv + 3);
  say("RVC:usage rvctl peek ADDR LEN | peeksym SYM OFF LEN | write FILE TEXT | run SECONDS PROG [ARGS]");
  return 2;
}
