/* syscalls: a deterministic battery of common system calls, the shipped trigger for kernel sites
 * (relocverify confirm, triggers.py).  Every line it prints depends only on the kernel's answers,
 * never on PIDs or time, so two boots of the same guest print the same bytes.
 *
 *   syscalls [all | readdir | poll | clock | ptrace | sysctl | files] [ROUNDS]
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void list(const char *path) {
  DIR *d = opendir(path);
  if (!d) { printf("readdir %s: error %d\n", path, 0); return; }
  char *names[512];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 512)
    if (e->d_name[0] < '0' || e->d_name[0] > '9') names[n++] = strdup(e->d_name);  /* no PIDs */
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  printf("readdir %s: %d:", path, n);
  for (int i = 0; i < n; i++) { printf(" %s", names[i]); free(names[i]); }
  printf("\n");
}

static void do_readdir(void) {
  const char *paths[] = {"/", "/proc", "/proc/self", "/proc/self/ns", "/proc/sys", "/proc/sys/kernel",
                         "/sys", "/sys/kernel", "/dev", 0};
  for (int i = 0; paths[i]; i++) list(paths[i]);
}

static void do_poll(void) {
  int p[2];
  if (pipe(p)) { printf("pipe: failed\n"); return; }
  struct pollfd q[2] = {{p[0], POLLIN, 0}, {p[1], POLLOUT, 0}};
  int waited = poll(q, 1, 10);  /* a timeout: the pipe's wait queue is registered (pipe_poll's poll_wait) */
  printf("poll empty pipe, 10 ms: %d %#x\n", waited, q[0].revents);
  int before = poll(q, 2, 0);
  printf("poll empty pipe: %d %#x %#x\n", before, q[0].revents, q[1].revents);
  (void)!write(p[1], "x", 1);
  int after = poll(q, 2, 100);
  printf("poll full pipe: %d %#x %#x\n", after, q[0].revents, q[1].revents);
  fd_set r;
  FD_ZERO(&r);
  FD_SET(p[0], &r);
  struct timeval tv = {0, 0};
  printf("select: %d\n", select(p[0] + 1, &r, 0, 0, &tv));
  close(p[0]);
  close(p[1]);
}

static void do_clock(void) {
  for (int c = 0; c < 12; c++) {
    struct timespec ts = {0, 0};
    long r = syscall(SYS_clock_getres, c, &ts);
    long g = syscall(SYS_clock_gettime, c, &ts);
    printf("clock %d: getres %ld gettime %ld\n", c, r, g);
  }
}

static void do_ptrace(void) {
  pid_t child = fork();
  if (child == 0) {
    ptrace(PTRACE_TRACEME, 0, 0, 0);
    raise(SIGSTOP);
    _exit(7);
  }
  int status;
  waitpid(child, &status, 0);
  struct user_regs_struct regs;
  struct user_fpregs_struct fp;
  long r1 = ptrace(PTRACE_GETREGS, child, 0, &regs);
  long r2 = ptrace(PTRACE_GETFPREGS, child, 0, &fp);
  long r3 = ptrace(PTRACE_PEEKUSER, child, (void *)offsetof(struct user, regs.cs), 0);
  printf("ptrace: stopped %d getregs %ld getfpregs %ld cs %#lx\n", WIFSTOPPED(status), r1, r2, r3);
  ptrace(PTRACE_CONT, child, 0, 0);
  waitpid(child, &status, 0);
  printf("ptrace: child exit %d\n", WEXITSTATUS(status));
}

static void cat(const char *path) {
  char buf[256];
  int fd = open(path, O_RDONLY);
  int n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
  if (fd >= 0) close(fd);
  if (n < 0) { printf("read %s: error\n", path); return; }
  buf[n] = 0;
  buf[strcspn(buf, "\n")] = 0;
  printf("read %s: %s\n", path, buf);
}

static void do_sysctl(void) {
  /* not threads-max or file-max: the kernel sizes them from the memory left at boot, which the size of a
   * boot's initramfs changes */
  const char *paths[] = {"/proc/sys/kernel/ostype", "/proc/sys/kernel/pid_max", "/proc/sys/vm/swappiness",
                         "/proc/sys/vm/overcommit_memory", "/proc/sys/kernel/printk", "/proc/sys/kernel/randomize_va_space",
                         "/proc/sys/net/core/somaxconn", "/proc/sys/kernel/sched_child_runs_first", 0};
  for (int i = 0; paths[i]; i++) cat(paths[i]);
}

static void do_files(void) {
  struct utsname u;
  uname(&u);
  printf("uname: %s %s %s\n", u.sysname, u.release, u.machine);
  struct stat st;
  int s = stat("/init", &st);
  printf("stat /init: %d mode %o\n", s, s ? 0 : st.st_mode);
  int fd = open("/proc/self/stat", O_RDONLY);
  char buf[64];
  printf("read /proc/self/stat: %d\n", fd >= 0 && read(fd, buf, sizeof buf) > 0);
  if (fd >= 0) close(fd);
  cat("/proc/sys/kernel/osrelease");
  cat("/sys/kernel/mm/transparent_hugepage/enabled");
}

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "all";
  int rounds = argc > 2 ? atoi(argv[2]) : 1;
  setvbuf(stdout, 0, _IOLBF, 0);
  for (int k = 0; k < rounds; k++) {
    int all = !strcmp(what, "all");
    if (all || !strcmp(what, "readdir")) do_readdir();
    if (all || !strcmp(what, "poll")) do_poll();
    if (all || !strcmp(what, "clock")) do_clock();
    if (all || !strcmp(what, "ptrace")) do_ptrace();
    if (all || !strcmp(what, "sysctl")) do_sysctl();
    if (all || !strcmp(what, "files")) do_files();
  }
  return 0;
}
