// fd_import_probe.c -- our own measurement program (tegra-interop project).
//
// What it measures: for cuImportExternalMemory and cuImportExternalSemaphore on
// a real NVIDIA driver, which result code each kind of bad import gets, and
// whether the file descriptor handed in is still open afterwards and still the
// same file (st_dev/st_ino compared before and after) or was closed by the
// driver. It tries fds of several kinds (/dev/null, a memfd, a regular file, a
// pipe, a socket, a closed number) against valid and invalid descriptors (size
// 0, unknown flag bits, reserved words, type 0 / unknown types, OPAQUE_WIN32,
// DMABUF_FD, a huge size, no current context), and first checks that
// kcmp(KCMP_FILE) works on the machine. It needs no CUDA headers: the few
// descriptor layouts are declared below in our own words (from the project's
// fact sheet), and libcuda.so.1 is opened with dlopen. Build and run:
//   gcc -O1 -o fdprobe fd_import_probe.c -ldl && ./fdprobe
// The output on the H200 is fd_import_probe.h200.txt next to this file; the
// simulator (crates/sim) follows it row for row (tests/fd_import_probe.rs).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sys/socket.h>

typedef int res_t;
typedef struct { uint32_t type; uint32_t pad; union { int fd; struct { void *h; const void *n; } w; void *obj; } u; uint64_t size; uint32_t flags; uint32_t reserved[16]; } memdesc_t; // 104
typedef struct { uint32_t type; uint32_t pad; union { int fd; struct { void *h; const void *n; } w; void *obj; } u; uint32_t flags; uint32_t reserved[16]; } semdesc_t; // 96
static res_t (*cuInit)(unsigned);
static res_t (*cuDeviceGet)(int *, int);
static res_t (*cuCtxCreate)(void **, unsigned, int);
static res_t (*cuCtxSetCurrent)(void *);
static res_t (*cuImportExternalMemory)(void **, const memdesc_t *);
static res_t (*cuImportExternalSemaphore)(void **, const semdesc_t *);
static res_t (*cuDestroyExternalMemory)(void *);
static res_t (*cuDestroyExternalSemaphore)(void *);

static int open_kind(const char *k) {
  if (!strcmp(k, "devnull")) return open("/dev/null", O_RDWR | O_CLOEXEC);
  if (!strcmp(k, "memfd")) { int f = memfd_create("p", MFD_CLOEXEC); ftruncate(f, 1 << 20); return f; }
  if (!strcmp(k, "file")) { int f = open("/tmp/probe_file", O_RDWR | O_CREAT | O_CLOEXEC, 0600); ftruncate(f, 1 << 20); return f; }
  if (!strcmp(k, "pipe")) { int p[2]; pipe2(p, O_CLOEXEC); return p[0]; }
  if (!strcmp(k, "socket")) { int s[2]; socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s); return s[0]; }
  return -1;
}

static void report(const char *what, const char *kind, int fd, struct stat *before, res_t r) {
  struct stat after; int open_ = fcntl(fd, F_GETFD) != -1;
  int same = open_ && fstat(fd, &after) == 0 && after.st_dev == before->st_dev && after.st_ino == before->st_ino;
  printf("%-44s %-8s result=%4d fd_after=%s\n", what, kind, r, open_ ? (same ? "open-same" : "open-OTHER") : "closed");
}

static void mem_case(const char *what, const char *kind, uint32_t type, uint64_t size, uint32_t flags, int reserved, int fdoverride) {
  int fd = fdoverride >= 0 ? fdoverride : open_kind(kind);
  struct stat st = {0}; fstat(fd, &st);
  memdesc_t d; memset(&d, 0, sizeof d); d.type = type; d.u.fd = fd; d.size = size; d.flags = flags; if (reserved) d.reserved[3] = 1;
  void *m = 0; res_t r = cuImportExternalMemory(&m, &d);
  report(what, kind, fd, &st, r);
  if (r == 0) cuDestroyExternalMemory(m);
  if (fcntl(fd, F_GETFD) != -1) close(fd);
}
static void sem_case(const char *what, const char *kind, uint32_t type, uint32_t flags, int reserved) {
  int fd = open_kind(kind); struct stat st; fstat(fd, &st);
  semdesc_t d; memset(&d, 0, sizeof d); d.type = type; d.u.fd = fd; d.flags = flags; if (reserved) d.reserved[2] = 1;
  void *s = 0; res_t r = cuImportExternalSemaphore(&s, &d);
  report(what, kind, fd, &st, r);
  if (r == 0) cuDestroyExternalSemaphore(s);
  if (fcntl(fd, F_GETFD) != -1) close(fd);
}

int main(void) {
  printf("sizeof memdesc=%zu semdesc=%zu\n", sizeof(memdesc_t), sizeof(semdesc_t));
  // kcmp availability
  int a = open("/dev/null", O_RDONLY), b = dup(a), c = open("/dev/null", O_RDONLY);
  long k1 = syscall(SYS_kcmp, getpid(), getpid(), 0 /*KCMP_FILE*/, a, b); int e1 = errno;
  long k2 = syscall(SYS_kcmp, getpid(), getpid(), 0, a, c); int e2 = errno;
  printf("kcmp(dup)=%ld errno=%d  kcmp(other open)=%ld errno=%d\n", k1, k1 < 0 ? e1 : 0, k2, k2 < 0 ? e2 : 0);
  close(a); close(b); close(c);
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) { printf("dlopen: %s\n", dlerror()); return 1; }
#define L(n, s) *(void **)&n = dlsym(lib, s)
  L(cuInit, "cuInit"); L(cuDeviceGet, "cuDeviceGet"); L(cuCtxCreate, "cuCtxCreate_v2"); L(cuCtxSetCurrent, "cuCtxSetCurrent");
  L(cuImportExternalMemory, "cuImportExternalMemory"); L(cuImportExternalSemaphore, "cuImportExternalSemaphore");
  L(cuDestroyExternalMemory, "cuDestroyExternalMemory"); L(cuDestroyExternalSemaphore, "cuDestroyExternalSemaphore");
  int dev; void *ctx;
  printf("init=%d\n", cuInit(0)); cuDeviceGet(&dev, 0); printf("ctx=%d\n", cuCtxCreate(&ctx, 0, dev));
  const char *kinds[] = {"devnull", "memfd", "file", "pipe", "socket"};
  for (int i = 0; i < 5; i++) mem_case("mem OPAQUE_FD size 4096", kinds[i], 1, 4096, 0, 0, -1);
  mem_case("mem OPAQUE_FD size 0", "devnull", 1, 0, 0, 0, -1);
  mem_case("mem OPAQUE_FD size 0", "memfd", 1, 0, 0, 0, -1);
  mem_case("mem OPAQUE_FD flags=2 (unknown)", "devnull", 1, 4096, 2, 0, -1);
  mem_case("mem OPAQUE_FD flags=2 (unknown)", "memfd", 1, 4096, 2, 0, -1);
  mem_case("mem OPAQUE_FD flags=DEDICATED", "devnull", 1, 4096, 1, 0, -1);
  mem_case("mem OPAQUE_FD reserved!=0", "devnull", 1, 4096, 0, 1, -1);
  mem_case("mem OPAQUE_FD reserved!=0", "memfd", 1, 4096, 0, 1, -1);
  mem_case("mem type 0 (invalid kind)", "devnull", 0, 4096, 0, 0, -1);
  mem_case("mem type 42 (unknown kind)", "devnull", 42, 4096, 0, 0, -1);
  mem_case("mem OPAQUE_WIN32 with fd in union", "devnull", 2, 4096, 0, 0, -1);
  mem_case("mem DMABUF_FD size 4096", "memfd", 9, 4096, 0, 0, -1);
  mem_case("mem DMABUF_FD size 0", "memfd", 9, 0, 0, 0, -1);
  mem_case("mem DMABUF_FD reserved!=0", "memfd", 9, 4096, 0, 1, -1);
  mem_case("mem OPAQUE_FD huge size 1<<50", "memfd", 1, 1ull << 50, 0, 0, -1);
  // no current context
  cuCtxSetCurrent(NULL);
  mem_case("mem OPAQUE_FD no current context", "devnull", 1, 4096, 0, 0, -1);
  mem_case("mem OPAQUE_FD no current context", "memfd", 1, 4096, 0, 0, -1);
  sem_case("sem OPAQUE_FD no current context", "devnull", 1, 0, 0);
  cuCtxSetCurrent(ctx);
  for (int i = 0; i < 5; i++) sem_case("sem OPAQUE_FD", kinds[i], 1, 0, 0);
  for (int i = 0; i < 5; i++) sem_case("sem TIMELINE_FD", kinds[i], 9, 0, 0);
  sem_case("sem OPAQUE_FD flags=1", "devnull", 1, 1, 0);
  sem_case("sem OPAQUE_FD reserved!=0", "devnull", 1, 0, 1);
  sem_case("sem type 0", "devnull", 0, 0, 0);
  sem_case("sem type 42", "devnull", 42, 0, 0);
  // closed fd number
  mem_case("mem OPAQUE_FD closed fd 900", "none", 1, 4096, 0, 0, 900);
  return 0;
}
