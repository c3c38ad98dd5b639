/* relaxc's parallel launcher: TVM's parallel loops with tasks claimed, not assigned.
 *
 * Compiled into each exported CPU library (compiler/runtime/launcher.py); the loader points the
 * library's __TVMBackendParallelLaunch at relaxc_parallel_launch. TVM's own pool gives each of its
 * N threads one N-th of a parallel loop and waits for all of them, so a thread whose core is busy
 * (another process, a VM's descheduled vCPU) delays every kernel by its whole share. Here a loop is
 * cut into several tasks per thread, every thread (the caller included) claims the next unclaimed
 * task from one counter, and the caller returns when every task is done: a thread that has not
 * woken up claims nothing and is not waited for.
 *
 * One job at a time: a launch while another is running (a second thread calling the model) or
 * from inside a task runs its loop in the calling thread, as one task. TVM's compiled lambdas take
 * any task count: task i of n runs iterations [i * ceil(E / n), (i + 1) * ceil(E / n)).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;

typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

typedef void (*ErrorMove)(void** result);  /* TVMFFIErrorMoveFromRaised */
typedef void (*ErrorSet)(void* error);      /* TVMFFIErrorSetRaised */
typedef int (*ObjectDecRef)(void* object);  /* TVMFFIObjectDecRef */

#define SPIN_NS 2000000L /* how long an idle worker spins before it sleeps */
#define MAX_WORKERS 255

static struct {
  _Atomic uint64_t state; /* generation << 32 | next task to claim */
  _Atomic(FTVMParallelLambda) lambda;
  _Atomic(void*) cdata;
  _Atomic int32_t tasks;
  _Atomic int32_t done;
  _Atomic(void*) error; /* the first failed task's error object */
  _Atomic uint32_t published; /* generation of the last job */
  atomic_flag busy;
  _Atomic int sleepers;
  pthread_mutex_t mutex;
  pthread_cond_t wake;
  int threads; /* 0 until started */
  int tasks_per_launch;
  int forked; /* in a forked child, whose copy has no workers yet */
  _Atomic int stopping;
  int workers; /* started, in `started` */
  pthread_t started[MAX_WORKERS];
  ErrorMove error_move;
  ErrorSet error_set;
  ObjectDecRef decref;
} pool = {.busy = ATOMIC_FLAG_INIT, .mutex = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static _Thread_local int in_task;

static inline void relax_cpu(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void keep_error(void) {
  void* error = NULL;
  pool.error_move(&error);
  void* none = NULL;
  if (error != NULL && !atomic_compare_exchange_strong(&pool.error, &none, error)) pool.decref(error);
}

/* Claim and run tasks of job `generation` until none is left. */
static void run_tasks(uint32_t generation) {
  for (;;) {
    uint64_t state = atomic_load_explicit(&pool.state, memory_order_acquire);
    if ((uint32_t)(state >> 32) != generation) return;
    FTVMParallelLambda lambda = atomic_load_explicit(&pool.lambda, memory_order_relaxed);
    void* cdata = atomic_load_explicit(&pool.cdata, memory_order_relaxed);
    int32_t tasks = atomic_load_explicit(&pool.tasks, memory_order_relaxed);
    uint32_t task = (uint32_t)state;
    if (task >= (uint32_t)tasks) return;
    /* a successful claim means the job is still the current one and unfinished (task `task` is
       not done), so what was read above belongs to it */
    if (!atomic_compare_exchange_weak_explicit(&pool.state, &state, state + 1, memory_order_acq_rel,
                                               memory_order_relaxed))
      continue;
    TVMParallelGroupEnv env = {NULL, tasks};
    in_task = 1;
    if (lambda((int)task, &env, cdata) != 0) keep_error();
    in_task = 0;
    atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
  }
}

static void* worker(void* unused) {
  (void)unused;
  uint32_t seen = atomic_load(&pool.published);
  for (;;) {
    uint32_t generation;
    long since = now_ns();
    unsigned spins = 0;
    while ((generation = atomic_load_explicit(&pool.published, memory_order_acquire)) == seen) {
      if (atomic_load_explicit(&pool.stopping, memory_order_relaxed)) return NULL;
      relax_cpu();
      if ((++spins & 63) == 0) sched_yield(); /* a caller sharing this core runs */
      if ((spins & 1023) == 0 && now_ns() - since > SPIN_NS) {
        pthread_mutex_lock(&pool.mutex);
        atomic_fetch_add(&pool.sleepers, 1);
        while (atomic_load(&pool.published) == seen && !atomic_load(&pool.stopping))
          pthread_cond_wait(&pool.wake, &pool.mutex);
        atomic_fetch_sub(&pool.sleepers, 1);
        pthread_mutex_unlock(&pool.mutex);
      }
    }
    seen = generation;
    run_tasks(generation);
  }
  return NULL;
}

static int run_inline(FTVMParallelLambda lambda, void* cdata) {
  TVMParallelGroupEnv env = {NULL, 1};
  int outer = in_task;
  in_task = 1;
  int status = lambda(0, &env, cdata);
  in_task = outer;
  return status;
}

static int start_workers(void) {
  int status = 0;
  pool.workers = 0;
  while (pool.workers < pool.threads - 1 && pool.workers < MAX_WORKERS && status == 0) {
    status = pthread_create(&pool.started[pool.workers], NULL, worker, NULL);
    pool.workers += status == 0;
  }
  return status;
}

/* fork copies no thread but the forking one: the child starts workers of its own at its first
   launch, and a lock or job some parent thread held is dropped */
static void after_fork_in_child(void) {
  pthread_mutex_init(&pool.mutex, NULL);
  pthread_cond_init(&pool.wake, NULL);
  atomic_store(&pool.sleepers, 0);
  atomic_flag_clear(&pool.busy);
  pool.workers = 0;
  pool.forked = 1;
}

int relaxc_parallel_launch(FTVMParallelLambda lambda, void* cdata, int num_task) {
  if (in_task || pool.threads < 2 || atomic_flag_test_and_set_explicit(&pool.busy, memory_order_acquire))
    return run_inline(lambda, cdata);
  if (pool.forked) {
    pool.forked = 0;
    start_workers(); /* without workers the caller runs every task */
  }
  int32_t tasks = num_task > 0 ? num_task : pool.tasks_per_launch;
  atomic_store_explicit(&pool.lambda, lambda, memory_order_relaxed);
  atomic_store_explicit(&pool.cdata, cdata, memory_order_relaxed);
  atomic_store_explicit(&pool.tasks, tasks, memory_order_relaxed);
  atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
  atomic_store_explicit(&pool.error, NULL, memory_order_relaxed);
  uint32_t generation = atomic_load_explicit(&pool.published, memory_order_relaxed) + 1;
  atomic_store_explicit(&pool.state, (uint64_t)generation << 32, memory_order_release);
  atomic_store(&pool.published, generation);
  if (atomic_load(&pool.sleepers) > 0) {
    pthread_mutex_lock(&pool.mutex);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mutex);
  }
  run_tasks(generation);
  /* every task is claimed: wait only for those other threads are running */
  for (unsigned spins = 1; atomic_load_explicit(&pool.done, memory_order_acquire) < tasks; ++spins) {
    relax_cpu();
    if ((spins & 15) == 0) sched_yield();
  }
  void* error = atomic_load_explicit(&pool.error, memory_order_relaxed);
  atomic_flag_clear_explicit(&pool.busy, memory_order_release);
  if (error == NULL) return 0;
  pool.error_set(error);
  pool.decref(error);
  return -1;
}

/* Start `threads - 1` workers (the caller is the last thread) and take the error functions of the
   process's tvm-ffi; `tasks_per_thread` tasks per thread in each launch. Returns 0 or the error of
   pthread_create (the threads started still work; with none, each launch runs in its caller). A
   second call changes nothing until relaxc_launcher_stop. */
int relaxc_launcher_start(int threads, int tasks_per_thread, ErrorMove error_move, ErrorSet error_set,
                          ObjectDecRef decref) {
  if (pool.threads != 0) return 0;
  pool.error_move = error_move;
  pool.error_set = error_set;
  pool.decref = decref;
  pool.tasks_per_launch = threads * tasks_per_thread;
  pool.threads = threads;
  static int fork_handled;
  if (!fork_handled) fork_handled = pthread_atfork(NULL, NULL, after_fork_in_child) == 0;
  return start_workers();
}

/* Stop and join the workers (no launch may be running): afterwards the library can be unloaded,
   and until the next start launches run in their callers. */
void relaxc_launcher_stop(void) {
  atomic_store(&pool.stopping, 1);
  pthread_mutex_lock(&pool.mutex);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.mutex);
  for (int i = 0; i < pool.workers; ++i) pthread_join(pool.started[i], NULL);
  pool.workers = 0;
  pool.threads = 0; /* a later start starts workers again */
  atomic_store(&pool.stopping, 0);
}
