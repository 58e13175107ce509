/* A work pool for the matmuls of a decode step, where the caller never waits for a thread
 * that is not running.
 *
 * With OpenMP's parallel for, each call ends at a barrier that every thread must reach: on a
 * shared machine, where the second core is often given to another process, a matmul of 0.2 ms
 * took 8 ms (the time until the sleeping or descheduled thread ran), and two threads decoded
 * slower than one. Here the work is cut into chunks that any thread claims with one atomic
 * add; the caller claims chunks too, so when the helpers are not running it simply does all of
 * them, and it waits only for chunks a helper has claimed and is working on. Helpers spin
 * (yielding the CPU) for a short while after a job, since a decode step's matmuls come tens of
 * microseconds apart, then sleep on a condition variable; a helper preempted while it spins
 * (the machine is shared) sleeps at once for a while instead.
 *
 * One job at a time: a second caller (two models served at once) runs its job inline.
 * A job is named by its number in the high half of the claim ticket, so a helper that wakes
 * late can only claim chunks of the job it read the description of (its compare-and-swap
 * fails once that job is over, and no job ends before its chunks are claimed). */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#if defined(__linux__) && !defined(RUSAGE_THREAD)
#define RUSAGE_THREAD 1 /* Linux's value; the header shows it only under _GNU_SOURCE */
#endif

#define POOL_MAX_HELPERS 63
#define POOL_SPIN_NS_DEFAULT 60000
/* A helper whose spin was preempted (another process wanted its core) sleeps straight after
 * its jobs for this long before it spins again. bench/threads.py, SmolLM2 decode on 2 vCPUs of
 * an Intel Xeon: the spin gave 69.5 tok/s alone against 57.1 without it, and 42.8 against 56.4
 * beside a CPU-bound competitor (threads-20261129T042719Z). */
#define POOL_BACKOFF_NS 20000000LL

/* Which matmuls take the pool: MLXR_POOL=1 all, 0 none (OpenMP's team); unset, under
 * OMP_WAIT_POLICY=PASSIVE (what `mlxr` sets) those of up to POOL_MAX_ROWS activation rows
 * (decode and small batches), else none.
 * PASSIVE OpenMP wakes its sleeping threads for each of a decode step's ~150 matmuls:
 * bench/threads.py, TinyLlama-shape Q4_K_M decode, 2 threads, pool against OpenMP alone and beside
 * a competing process: Intel Xeon with AMX 15.6 / 14.1 and 9.2 / 9.1 tok/s
 * (threads-20261127T222729Z); AMD EPYC 54.3 / 44.4 and 34.5 / 36.1 (2026-11-25). Under libgomp's
 * default policy (the Python API without `mlxr`'s setting) the team spins awake and beats the
 * pool: Gemma 3 decode 35.6 / 34.2 against 31.0 / 33.6, batch 8 160.1 / 161.4 against 130.7 /
 * 126.3 (quant_cpu-20261127T2357*.json, Intel Xeon with AMX). Prompts take OpenMP's team. */
#define POOL_MAX_ROWS 8
static int omp_passive(void) {
    const char *env = getenv("OMP_WAIT_POLICY");
    return env && (env[0] == 'P' || env[0] == 'p');
}

static int pool_for_rows(int64_t m) {
    static int mode = -2; /* -1: by rows */
    if (mode == -2) {
        const char *env = getenv("MLXR_POOL");
        mode = env && env[0] == '1' ? 1 : env && env[0] == '0' ? 0 : omp_passive() ? -1 : 0;
    }
    return mode < 0 ? m <= POOL_MAX_ROWS : mode;
}

/* How long an idle helper polls for the next job before it sleeps: MLXR_POOL_SPIN_US. */
static int64_t pool_spin_ns(void) {
    static int64_t ns = -1;
    if (ns < 0) {
        const char *env = getenv("MLXR_POOL_SPIN_US");
        ns = env && *env ? (int64_t)(atof(env) * 1000.0) : POOL_SPIN_NS_DEFAULT;
        if (ns < 0) ns = 0;
    }
    return ns;
}

typedef void (*chunk_fn)(void *ctx, int64_t c0, int64_t c1);

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    uint64_t ticket;    /* job << 32 | next chunk */
    int64_t done;       /* chunks finished in the current job */
    int busy;           /* a caller holds the pool */
    int sleepers;       /* helpers waiting on `wake` */
    int started;        /* helpers created */
    /* the current job, written before its ticket is published */
    chunk_fn fn;
    void *ctx;
    int64_t n, chunk, nchunks;
    int helpers; /* how many helpers may take part */
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Claim and run chunks of the job whose ticket reads `t` until none is left. */
static void pool_work(uint64_t t) {
    for (;;) {
        uint64_t job = t >> 32, i = t & 0xffffffffu;
        chunk_fn fn = __atomic_load_n(&pool.fn, __ATOMIC_RELAXED);
        void *ctx = __atomic_load_n(&pool.ctx, __ATOMIC_RELAXED);
        int64_t n = __atomic_load_n(&pool.n, __ATOMIC_RELAXED), chunk = __atomic_load_n(&pool.chunk, __ATOMIC_RELAXED);
        int64_t nchunks = __atomic_load_n(&pool.nchunks, __ATOMIC_RELAXED);
        if ((int64_t)i >= nchunks) return;
        if (!__atomic_compare_exchange_n(&pool.ticket, &t, (job << 32) | (i + 1), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            if ((t >> 32) != job) return; /* that job is over; t is the next one's ticket */
            continue;                     /* another thread took chunk i: t now holds the next */
        }
        int64_t c0 = (int64_t)i * chunk, c1 = c0 + chunk < n ? c0 + chunk : n;
        fn(ctx, c0, c1);
        __atomic_add_fetch(&pool.done, 1, __ATOMIC_RELEASE);
        t = __atomic_load_n(&pool.ticket, __ATOMIC_ACQUIRE);
        if ((t >> 32) != job) return;
    }
}

/* How often this thread was preempted (its sched_yield handed the core to another runnable
 * thread counts too); -1 where the OS does not say. */
static long thread_preemptions(void) {
#ifdef RUSAGE_THREAD
    struct rusage ru;
    return getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_nivcsw : -1;
#else
    return -1;
#endif
}

static int64_t pool_backoffs; /* times a helper stopped spinning for POOL_BACKOFF_NS (tests) */

static void *pool_helper(void *arg) {
    const int index = (int)(intptr_t)arg;
    uint64_t seen = 0;       /* job number last seen */
    int64_t spin_from = 0;   /* no spinning before this time (backing off) */
    for (;;) {
        int64_t now = now_ns();
        int64_t spin_until = now >= spin_from ? now + pool_spin_ns() : now;
        long preempted = spin_until > now ? thread_preemptions() : -1;
        uint64_t t;
        for (;;) {
            t = __atomic_load_n(&pool.ticket, __ATOMIC_ACQUIRE);
            if ((t >> 32) != seen || now_ns() > spin_until) break;
            sched_yield(); /* a caller sharing this core runs first */
        }
        if (preempted >= 0 && thread_preemptions() > preempted) { /* the core is wanted elsewhere */
            spin_from = now_ns() + POOL_BACKOFF_NS;
            __atomic_add_fetch(&pool_backoffs, 1, __ATOMIC_RELAXED);
        }
        if ((t >> 32) == seen) {
            pthread_mutex_lock(&pool.lock);
            __atomic_add_fetch(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
            while (((t = __atomic_load_n(&pool.ticket, __ATOMIC_SEQ_CST)) >> 32) == seen)
                pthread_cond_wait(&pool.wake, &pool.lock);
            __atomic_sub_fetch(&pool.sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = t >> 32;
        if (index < __atomic_load_n(&pool.helpers, __ATOMIC_RELAXED)) pool_work(t);
    }
    return NULL;
}

static void pool_start_helpers(int want) {
    while (pool.started < want) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&th, &attr, pool_helper, (void *)(intptr_t)pool.started);
        pthread_attr_destroy(&attr);
        if (failed) return;
        pool.started++;
    }
}

/* fn(ctx, c0, c1) over [0, n) in chunks, on the caller and up to nthreads - 1 helpers. */
static void pool_run(int nthreads, int64_t n, int64_t chunk, chunk_fn fn, void *ctx) {
    int64_t nchunks = (n + chunk - 1) / chunk;
    int helpers = nthreads - 1 < POOL_MAX_HELPERS ? nthreads - 1 : POOL_MAX_HELPERS;
    if (helpers < 1 || nchunks < 2 || __atomic_exchange_n(&pool.busy, 1, __ATOMIC_ACQUIRE)) {
        fn(ctx, 0, n);
        return;
    }
    pool_start_helpers(helpers);
    uint64_t job = (__atomic_load_n(&pool.ticket, __ATOMIC_RELAXED) >> 32) + 1;
    __atomic_store_n(&pool.fn, fn, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.ctx, ctx, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.n, n, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.chunk, chunk, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.nchunks, nchunks, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.helpers, helpers, __ATOMIC_RELAXED);
    __atomic_store_n(&pool.done, 0, __ATOMIC_RELAXED);
    uint64_t t = (job & 0xffffffffu) << 32;
    __atomic_store_n(&pool.ticket, t, __ATOMIC_SEQ_CST); /* publish */
    if (__atomic_load_n(&pool.sleepers, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    pool_work(t);
    while (__atomic_load_n(&pool.done, __ATOMIC_ACQUIRE) < nchunks) sched_yield(); /* chunks in flight */
    __atomic_store_n(&pool.busy, 0, __ATOMIC_RELEASE);
}
