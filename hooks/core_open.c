/*
 * core_open.c -- the core's raw file: its directory, the settings check, the
 * header, the open.  Above core_flush.c (core_internal.h has the stack).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "core_internal.h"

/* ------------------------------------------------------------------------ */
/* Raw file.                                                                  */

static int mkdir_p(const char *path, mode_t mode)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -1;
    return 0;
}

static int env_int(const char *const *names, int fallback)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v) return atoi(v);
    }
    return fallback;
}

/* A process without MPI_Init (NCCL only, horovodrun --gloo) takes its rank
 * from its launcher: MPI's and PMI's first, then Horovod's own (gloo_run.py
 * sets HOROVOD_RANK/SIZE/LOCAL_RANK), then torchrun's and Slurm's. */
static const char *const SIZE_VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE",
                                        "WORLD_SIZE", "SLURM_NTASKS", NULL};
static const char *const LOCAL_VARS[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                         "HOROVOD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID",
                                         NULL};

/* The default profile directory, one rule for every launcher:
 * horovod-profile-<12 hex digits naming the job>, the same on every rank.
 * An MPI job passes rank 0's id (broadcast at MPI_Init); a job without MPI
 * (horovodrun --gloo, elastic, torchrun, NCCL only) passes 0, and the id is
 * a hash of the launcher's job identity, which every rank computes alike
 * (Gloo: the rendezvous server's address and port, the same for every
 * worker the driver starts, replacements included). */
void hvprof_default_dir(char *out, size_t n, uint64_t job_id)
{
    if (job_id) {
        snprintf(out, n, "horovod-profile-%012llx",
                 (unsigned long long)(job_id & 0xffffffffffffull));
        return;
    }
    static const char *const ids[] = {"TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "PMI_KVSNAME",
                                      "OMPI_MCA_orte_hnp_uri", "SLURM_JOB_ID", "SLURM_STEP_ID",
                                      "MASTER_PORT",
                                      "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                                      "HOROVOD_GLOO_RENDEZVOUS_PORT", NULL};
    uint64_t h = 0;
    int found = 0;
    for (const char *const *v = ids; *v; v++) {
        const char *s = getenv(*v);
        if (!s) continue;
        found = 1;
        for (; *s; s++) h = hvprof_mix(h, (unsigned char)*s);
    }
    if (!found) h = hvprof_mix((uint64_t)getppid(), (uint64_t)time(NULL) / 3600);
    snprintf(out, n, "horovod-profile-%012llx", (unsigned long long)(h & 0xffffffffffffull));
}

static size_t meta_region_bytes(void)
{
    return HVPROF_HEADER_BYTES + (size_t)64 * HVPROF_COMM_TABLE_CAPACITY +
           (size_t)64 * HVPROF_TRACK_TABLE_CAPACITY;
}

/* hvprof_open's way out when the file cannot be made (hvprof_core.lock held): keep the
 * reason (hvprof_open_error); an MPI job reports for every rank at once (mpi.c:
 * rank 0, one line); otherwise (NCCL-only jobs) rank 0 says it for itself, the
 * others stay quiet (their ranks show as missing in the merge).  Clears the
 * paths, releases the lock. */
__attribute__((format(printf, 2, 3))) static int open_failed(int rank, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(hvprof_core.open_error, sizeof hvprof_core.open_error, fmt, ap);
    va_end(ap);
    if (!hvprof_core.quiet && rank == 0) hvprof_warn("%s: profiling is off for rank 0", hvprof_core.open_error);
    hvprof_core.dir[0] = 0;
    hvprof_core.raw_path[0] = 0;
    pthread_mutex_unlock(&hvprof_core.lock);
    return -1;
}

/* The profile directory: the caller's (MPI: rank 0's choice), else
 * HOROVOD_PROFILE_DIR, else a name derived from the launcher's environment. */
static void choose_dir(const char *dir)
{
    if (dir && *dir) {
        snprintf(hvprof_core.dir, sizeof hvprof_core.dir, "%s", dir);
    } else {
        const char *d = hvprof_setting_text(HVS_DIR);
        if (d) snprintf(hvprof_core.dir, sizeof hvprof_core.dir, "%s", d);
        else hvprof_default_dir(hvprof_core.dir, sizeof hvprof_core.dir, 0);
    }
}

/* Create <dir>/raw/rank-R.hvprof, reserve and map its metadata region
 * (header + tables).  The header, or NULL after open_failed (hvprof_core.lock
 * released); *fd_out: the file. */
static hvprof_file_header *create_raw_file(int rank, size_t meta, int *fd_out)
{
    char rawdir[1100];
    snprintf(rawdir, sizeof rawdir, "%s/raw", hvprof_core.dir);
    mode_t old = umask(022);
    if (mkdir_p(rawdir, 0755) != 0) {
        umask(old);
        open_failed(rank, "cannot create %s (%s)", rawdir, strerror(errno));
        return NULL;
    }
    snprintf(hvprof_core.raw_path, sizeof hvprof_core.raw_path, "%s/rank-%05d.hvprof", rawdir, rank);
    int fd = open(hvprof_core.raw_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    umask(old);
    int ferr = fd < 0 ? errno : posix_fallocate(fd, 0, (off_t)meta); /* returns the error */
    if (ferr != 0) {
        if (fd >= 0) close(fd);
        open_failed(rank, "cannot write %s (%s)", hvprof_core.raw_path, strerror(ferr));
        return NULL;
    }
    void *m = mmap(NULL, meta, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        open_failed(rank, "cannot map %s (%s)", hvprof_core.raw_path, strerror(e));
        return NULL;
    }
    *fd_out = fd;
    return (hvprof_file_header *)m;
}

/* Bytes per chunk (= per-thread buffer): HOROVOD_PROFILE_CHUNK_KB when
 * usable, else the default; whole pages. */
static uint32_t chunk_bytes_setting(void)
{
    uint32_t chunk = (uint32_t)hvprof_setting_int(HVS_CHUNK_KB) * 1024u;
    long page = sysconf(_SC_PAGESIZE);
    return (uint32_t)((chunk + page - 1) / page * page);
}

/* Fill a fresh header (the clock is calibrated here: ~2 ms with the TSC).
 * The magic is stored last: a reader sees a whole header or none. */
static void header_init(hvprof_file_header *h, int rank, int world_size, int local_rank,
                        uint32_t chunk, size_t meta)
{
    memset(h, 0, HVPROF_HEADER_BYTES);
    h->mode = hvprof_profile_mode() == (int)HVPROF_MODE_SUMMARY ? HVPROF_MODE_SUMMARY
                                                                 : HVPROF_MODE_FULL;
    h->sampling = 1;
    h->version = HVPROF_FORMAT_VERSION;
    h->header_bytes = HVPROF_HEADER_BYTES;
    h->record_bytes = HVPROF_RECORD_BYTES;
    h->chunk_bytes = chunk;
    h->comm_table_offset = HVPROF_HEADER_BYTES;
    h->comm_table_capacity = HVPROF_COMM_TABLE_CAPACITY;
    h->track_table_offset = HVPROF_HEADER_BYTES + 64 * HVPROF_COMM_TABLE_CAPACITY;
    h->track_table_capacity = HVPROF_TRACK_TABLE_CAPACITY;
    h->inflight_offset = HVPROF_INFLIGHT_OFFSET;
    h->inflight_capacity = HVPROF_INFLIGHT_CAPACITY;
    h->first_chunk_offset = meta;
    h->rank = rank;
    h->world_size = world_size;
    h->local_rank = local_rank;
    h->pid = (int32_t)getpid();
    h->self_converts = hvprof_core.python ? 1u : 0u;
    h->thread_level = -1;
    h->clock_kind = (uint32_t)hvprof_clock_kind;
    h->ticks_per_ns = hvprof_clock_init(&h->cal0_ticks, &h->cal0_mono_ns, &h->cal0_realtime_ns);
    h->clock_kind = (uint32_t)hvprof_clock_kind;
    h->cal1_ticks = h->cal0_ticks;
    h->cal1_mono_ns = h->cal0_mono_ns;
    gethostname(h->hostname, sizeof h->hostname - 1);
    memcpy(h->magic, HVPROF_MAGIC, 8); /* last: a reader sees a whole header */
    __atomic_store_n(&h->state, HVPROF_STATE_OPEN, __ATOMIC_RELEASE);
}

/* The file is ready: adopt it, forget the previous file's tables (stale TLS
 * chunks and cached handles are dropped through the generation and epoch),
 * switch recording on, start the helper thread (hvprof_core.lock held). */
static void start_recording(int fd, hvprof_file_header *h, size_t meta, uint32_t chunk, int rank)
{
    hvprof_core.fd = fd;
    hvprof_core.hdr = h;
    atomic_store(&hvprof_inflight_table,
                 (hvprof_inflight_entry *)((char *)h + HVPROF_INFLIGHT_OFFSET));
    hvprof_core.meta_bytes = meta;
    hvprof_core.chunk_bytes = chunk;
    hvprof_core.first_chunk_offset = meta;
    hvprof_core.broken = 0;
    hvprof_core.write_errno = 0;
    flush_reset();
    hvprof_core.pid = getpid();
    hvprof_core.open = 1;
    tables_reset();
    atomic_fetch_add(&hvprof_handle_epoch, 1);
    atomic_fetch_add(&hvprof_generation, 1);
    FOR_EACH_BACKEND(b)
        if (b->reset) b->reset();
    window_init();
    if (rank == 0) hvprof_settings_check();
    atomic_store(&hvprof_divert, !h->sampling ? HVPROF_DIVERT_PAUSED
                                 : h->mode == HVPROF_MODE_SUMMARY ? HVPROF_DIVERT_SUMMARY : 0);
    atomic_store(&hvprof_active, 1);
    atomic_store(&app_active, 1);
    helper_start();
    signals_install();
    FOR_EACH_BACKEND(b) /* every thread's CPU figures at start, the cpu sidecar */
        if (b->opened) b->opened();
}

int hvprof_open(int rank, int world_size, int local_rank, const char *dir)
{
    pthread_mutex_lock(&hvprof_core.lock);
    if (hvprof_core.open && hvprof_core.pid == getpid()) {
        /* Already open (NCCL first, MPI later): fill in what is now known. */
        if (rank >= 0) hvprof_core.hdr->rank = rank;
        if (world_size > 0) hvprof_core.hdr->world_size = world_size;
        if (local_rank >= 0) hvprof_core.hdr->local_rank = local_rank;
        pthread_mutex_unlock(&hvprof_core.lock);
        return 0;
    }
    if (rank < 0) rank = hvprof_launcher_rank();
    if (world_size < 0) world_size = env_int(SIZE_VARS, -1);
    if (local_rank < 0) local_rank = env_int(LOCAL_VARS, -1);
    if (rank < 0) rank = 0;

    choose_dir(dir);
    hvprof_core.open_error[0] = 0;
    size_t meta = meta_region_bytes();
    int fd = -1;
    hvprof_file_header *h = create_raw_file(rank, meta, &fd);
    if (!h) return -1; /* open_failed said why and released the lock */
    uint32_t chunk = chunk_bytes_setting();
    header_init(h, rank, world_size, local_rank, chunk, meta);
    start_recording(fd, h, meta, chunk, rank);
    pthread_mutex_unlock(&hvprof_core.lock);
    return 0;
}
