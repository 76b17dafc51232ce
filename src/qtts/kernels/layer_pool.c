/* qtts kernels: the DecoderLayer's own threads: the caller plus n - 1 persistent workers.
 *
 * A layer runs four GEMVs back to back with a little serial work between them (norms, attention,
 * the rotation). onnxruntime would hand each GEMV to its thread pool (~30-40 us a hand-off on a
 * small VM); here the workers stay hot across the layer:
 *
 * - a job is fn(ctx, u) for u < units; every thread (the caller included) takes the next unit
 *   until none is left, so a worker that wakes late or that the VM stalls costs at most one unit,
 *   and which thread ran a unit never changes a result (units write disjoint outputs);
 * - the unit counter carries the job's generation in its high 32 bits and is taken by CAS, so a
 *   worker still holding an old generation can never take a unit of the next job;
 * - waiting (for work, or the caller for the last unit) spins ~g_spin_ns, then blocks on a
 *   condition variable: consecutive GEMVs pay no wake-up, an idle process burns no CPU. The flag
 *   "I am about to block" and the counter are both sequentially consistent, so a waker either
 *   sees the flag (and signals under the mutex) or the waiter sees the new value (Dekker);
 * - workers start lazily, detached, with every signal blocked (Python's handlers stay on the main
 *   thread); they are never joined (process lifetime), and the library first pins itself in
 *   memory (pin_library) so that no unload pulls their code away. After fork() the child has no
 *   workers: the caller then runs every unit itself, nothing waits for one that does not exist.
 *
 * qtts_layer_threads(n) sets n (default 2, or 1 on a one-CPU machine; 1: no workers). Workers
 * beyond n - 1 stay blocked. One job at a time: layer.c serialises its callers with a mutex.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "layer.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

#define MAX_THREADS 16
#define CLOSED 0xFFFFFFFFu /* a ticket's unit while publish() replaces the job: never < units */
/* how long a waiting thread spins before it blocks: ~ the serial gaps inside a layer by default;
 * qtts_layer_spin_us() sets it (0: block at once) */
static _Atomic uint64_t g_spin_ns = 50000;

typedef struct {
  pthread_cond_t cv;
  atomic_int sleeping;
} Worker;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_done_cv = PTHREAD_COND_INITIALIZER;
static Worker g_workers[MAX_THREADS];
static int g_started;                /* workers created (under g_mu) */
static atomic_int g_threads;         /* the caller + workers wanted; 0: not chosen yet */
static atomic_int g_caller_sleeping;
static _Atomic uint64_t g_ticket;    /* generation << 32 | the next unit (CLOSED: being replaced) */
static atomic_size_t g_done;         /* units of the current job finished */
static _Atomic(TaskFn) g_fn;         /* the current job, stored before its ticket */
static _Atomic(void *) g_ctx;
static atomic_size_t g_units;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int qtts_pool_size(void) {
  int n = atomic_load(&g_threads);
  if (n == 0) { /* the default, chosen once: two threads where there are two CPUs */
    int zero = 0, def = sysconf(_SC_NPROCESSORS_ONLN) >= 2 ? 2 : 1;
    atomic_compare_exchange_strong(&g_threads, &zero, def);
    n = atomic_load(&g_threads);
  }
  return n;
}

/* Set the DecoderLayer's thread count (the caller included; 1: no workers), capped at 16; n <= 0
 * only asks. Returns the count now in force. */
int qtts_layer_threads(int n) {
  if (n > 0) atomic_store(&g_threads, n < MAX_THREADS ? n : MAX_THREADS);
  return qtts_pool_size();
}

/* Set how long (us) the op's waiting threads spin before they block, capped at 1 s; us < 0 only
 * asks. Returns the bound now in force. Results never depend on it. */
int qtts_layer_spin_us(int us) {
  if (us >= 0) atomic_store(&g_spin_ns, (uint64_t)(us < 1000000 ? us : 1000000) * 1000u);
  return (int)(atomic_load(&g_spin_ns) / 1000u);
}

/* Take and run units of generation gen until there are none left (or the job is another's). */
static void run_units(uint32_t gen) {
  for (;;) {
    uint64_t t = atomic_load(&g_ticket);
    if ((uint32_t)(t >> 32) != gen) return;
    size_t units = atomic_load_explicit(&g_units, memory_order_acquire), u = (uint32_t)t;
    TaskFn fn = atomic_load_explicit(&g_fn, memory_order_acquire);
    void *ctx = atomic_load_explicit(&g_ctx, memory_order_acquire);
    if (u >= units) return;
    if (!atomic_compare_exchange_weak(&g_ticket, &t, t + 1)) continue;
    fn(ctx, u); /* the CAS proved no publish began since t was read (it closes the ticket first):
                 * fn, ctx and units are this job's */
    if (atomic_fetch_add(&g_done, 1) + 1 == units && atomic_load(&g_caller_sleeping)) {
      pthread_mutex_lock(&g_mu);
      pthread_cond_signal(&g_done_cv);
      pthread_mutex_unlock(&g_mu);
    }
  }
}

static int active(int index) { return index < qtts_pool_size() - 1; }

/* Worker index: wait for a generation other than seen (spinning first while it is active). */
static uint32_t wait_job(int index, uint32_t seen) {
  Worker *w = &g_workers[index];
  if (active(index)) {
    uint64_t deadline = now_ns() + atomic_load_explicit(&g_spin_ns, memory_order_relaxed);
    for (unsigned i = 1;; ++i) {
      uint32_t gen = (uint32_t)(atomic_load(&g_ticket) >> 32);
      if (gen != seen) return gen;
      if (i % 64 == 0 && now_ns() > deadline) break;
      CPU_RELAX();
    }
  }
  pthread_mutex_lock(&g_mu);
  atomic_store(&w->sleeping, 1);
  uint32_t gen;
  while ((gen = (uint32_t)(atomic_load(&g_ticket) >> 32)) == seen || !active(index)) {
    seen = gen; /* a job that passed while this worker was inactive is not its to join */
    pthread_cond_wait(&w->cv, &g_mu);
  }
  atomic_store(&w->sleeping, 0);
  pthread_mutex_unlock(&g_mu);
  return gen;
}

typedef struct {
  int index;
  uint32_t seen;
} Start;

static void *worker_main(void *arg) {
  Start s = *(Start *)arg;
  free(arg);
  for (;;) {
    s.seen = wait_job(s.index, s.seen);
    run_units(s.seen);
  }
  return NULL;
}

/* Keep this library mapped for good: onnxruntime unloads a custom-op library when the session
 * options that registered it go, and a worker still spinning in (or returning to) its code would
 * then crash. A second dlopen with RTLD_NODELETE makes the unload a no-op. */
static int pin_library(void) {
  Dl_info info;
  if (!dladdr((void *)&qtts_pool_run, &info) || !info.dli_fname) return 0;
  return dlopen(info.dli_fname, RTLD_NOW | RTLD_NODELETE) != NULL;
}

/* Start workers up to want (under g_mu); fewer if the system refuses threads, none if the
 * library cannot be pinned (then the caller runs every unit). */
static void start_workers(int want) {
  static int pinned;
  if (!pinned && !(pinned = pin_library())) return;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  for (; g_started < want; ++g_started) {
    Start *s = malloc(sizeof *s);
    pthread_t id;
    pthread_attr_t attr;
    if (!s) break;
    s->index = g_started;
    s->seen = (uint32_t)(atomic_load(&g_ticket) >> 32);
    pthread_cond_init(&g_workers[g_started].cv, NULL);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&id, &attr, worker_main, s);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
      free(s);
      break;
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Publish a job and wake the active workers that sleep. */
static uint32_t publish(TaskFn fn, void *ctx, size_t units, int workers) {
  /* Close the finished job first: a worker that read its ticket (every unit taken) and then this
   * job's units, fn or ctx must fail its CAS, or it would run a unit past the old job's end with
   * the new job's function (and count it done twice). The acquire loads in run_units that see a
   * value stored below also see this store, and a CAS always reads the latest ticket. */
  uint32_t gen = (uint32_t)(atomic_load(&g_ticket) >> 32);
  atomic_store(&g_ticket, (uint64_t)gen << 32 | CLOSED);
  atomic_store_explicit(&g_fn, fn, memory_order_release);
  atomic_store_explicit(&g_ctx, ctx, memory_order_release);
  atomic_store_explicit(&g_units, units, memory_order_release);
  atomic_store(&g_done, 0);
  gen += 1;
  atomic_store(&g_ticket, (uint64_t)gen << 32);
  int locked = 0;
  for (int i = 0; i < workers; ++i)
    if (atomic_load(&g_workers[i].sleeping)) {
      if (!locked) pthread_mutex_lock(&g_mu), locked = 1;
      pthread_cond_signal(&g_workers[i].cv);
    }
  if (locked) pthread_mutex_unlock(&g_mu);
  return gen;
}

static void wait_done(size_t units) {
  uint64_t deadline = now_ns() + atomic_load_explicit(&g_spin_ns, memory_order_relaxed);
  for (unsigned i = 1; atomic_load(&g_done) < units; ++i) {
    if (i % 64 == 0 && now_ns() > deadline) {
      pthread_mutex_lock(&g_mu);
      atomic_store(&g_caller_sleeping, 1);
      while (atomic_load(&g_done) < units) pthread_cond_wait(&g_done_cv, &g_mu);
      atomic_store(&g_caller_sleeping, 0);
      pthread_mutex_unlock(&g_mu);
      return;
    }
    CPU_RELAX();
  }
}

void qtts_pool_run(TaskFn fn, void *ctx, size_t units) {
  int workers = qtts_pool_size() - 1;
  if (workers > 0 && units > 1) {
    pthread_mutex_lock(&g_mu);
    if (g_started < workers) start_workers(workers);
    if (workers > g_started) workers = g_started;
    pthread_mutex_unlock(&g_mu);
  }
  if (workers <= 0 || units <= 1) {
    for (size_t u = 0; u < units; ++u) fn(ctx, u);
    return;
  }
  run_units(publish(fn, ctx, units, workers));
  wait_done(units);
}
