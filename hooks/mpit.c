/* The interconnect this rank's MPI library actually set up, asked through
 * the MPI tool information interface (MPI_T), plus the TCP connections the
 * process holds, written next to the raw file as rank-R.mpit.json.
 *
 * What MPI_T can tell (measured on Open MPI 4.1 and MPICH 4.0, Debian):
 * - Open MPI: every MCA parameter is a control variable (cvar), and the
 *   variables of components that were closed at MPI_Init (not selected)
 *   become invalid (MPI_T_cvar_get_info fails for them).  So the components
 *   still open after MPI_Init are those whose "<framework>_<component>_
 *   major_version" cvar is still valid: the PML (ob1, ucx, cm), the BTLs
 *   (tcp, vader, self, ...) and MTLs.  The TCP BTL registers one
 *   "btl_tcp_bandwidth_<interface>" cvar per interface it made a module for.
 *   The performance variables (pvars, 46 here) hold no per-BTL byte counts
 *   (only ob1 queue lengths, psm2 counters, osc rdma retries): which BTL
 *   carried the bytes to which peer is not observable through MPI_T.
 * - MPICH: no pvars; the cvars MPIR_CVAR_CH4_NETMOD, MPIR_CVAR_CH4_SHM,
 *   MPIR_CVAR_NEMESIS_NETMOD, MPIR_CVAR_OFI_USE_PROVIDER hold the requested
 *   selection (empty = the library's default); the device it was built with
 *   ("ch4:ucx") is in MPI_Get_library_version's text.
 * - Independent evidence of TCP use: the established TCP sockets of this
 *   process (/proc/self/fd, the sockets among them: getsockname,
 *   getpeername), with their remote and local addresses; Open MPI's TCP BTL
 *   connects lazily, on the first message to a peer, so a socket to another
 *   host's address means TCP carried data.
 * - Per peer, what the kernel measured on each of those connections
 *   (getsockopt TCP_INFO): bytes acknowledged and received, the time it had
 *   data in flight (tcpi_busy_time, and of it the time limited by the peer's
 *   receive window or the send buffer), the last delivery-rate sample, RTT
 *   and retransmissions.  bytes_acked / busy time is the rate the path to
 *   that peer delivered while it had data to carry
 *   (profiler.formats.fabric.peer_rates).
 * - The host's NIC byte counters (/sys/class/net/<if>/statistics,
 *   /sys/class/infiniband/<dev>/ports/<p>/counters) at the raw file's open
 *   and here: every process's traffic on a shared host, the host's link.
 *
 * Runs from this backend's finish hook (hvprof_close), which the MPI_Finalize
 * wrapper calls before PMPI_Finalize; elsewhere (exit without MPI, MPI
 * already finalized) it writes nothing.  Never on a hot path. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <pthread.h>
#include <linux/tcp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hvprof_internal.h"

#define MPIT_BUF (256 * 1024)

typedef struct {
    char *buf;
    size_t n, k;
} jbuf;

__attribute__((format(printf, 2, 3))) static void jout(jbuf *j, const char *fmt, ...)
{
    if (j->k >= j->n) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(j->buf + j->k, j->n - j->k, fmt, ap);
    va_end(ap);
    if (w > 0) j->k += (size_t)w;
}

/* A JSON string (quotes and control characters escaped). */
static void jstr(jbuf *j, const char *s)
{
    jout(j, "\"");
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') jout(j, "\\%c", c);
        else if (c < 0x20) jout(j, "\\u%04x", c);
        else jout(j, "%c", c);
    }
    jout(j, "\"");
}

/* cvars whose string value is recorded (requested selections). */
static const char *const STRING_CVARS[] = {
    "pml", "btl", "mtl", "btl_tcp_if_include", "btl_tcp_if_exclude",
    "MPIR_CVAR_CH4_NETMOD", "MPIR_CVAR_CH4_SHM", "MPIR_CVAR_NEMESIS_NETMOD",
    "MPIR_CVAR_OFI_USE_PROVIDER", "MPIR_CVAR_CH3_NETWORK_IFACE",
};

static int wanted_string(const char *name)
{
    for (size_t i = 0; i < sizeof STRING_CVARS / sizeof *STRING_CVARS; i++)
        if (strcmp(name, STRING_CVARS[i]) == 0) return 1;
    return 0;
}

/* "btl_tcp_major_version" -> framework "btl", component "tcp". */
static int component_of(const char *name, char *fw, size_t nfw, char *comp, size_t ncomp)
{
    static const char *const FWS[] = {"btl_", "pml_", "mtl_"};
    const char *suffix = "_major_version";
    size_t n = strlen(name), s = strlen(suffix);
    if (n <= s || strcmp(name + n - s, suffix) != 0) return 0;
    for (size_t i = 0; i < 3; i++) {
        size_t f = strlen(FWS[i]);
        if (strncmp(name, FWS[i], f) == 0 && n - s > f) {
            snprintf(fw, nfw, "%.*s", (int)(f - 1), name);
            snprintf(comp, ncomp, "%.*s", (int)(n - s - f), name + f);
            return strcmp(comp, "base") != 0;
        }
    }
    return 0;
}

static void read_string_cvar(int idx, char *out, size_t nout)
{
    MPI_T_cvar_handle h;
    int count = 0;
    out[0] = 0;
    if (MPI_T_cvar_handle_alloc(idx, NULL, &h, &count) != MPI_SUCCESS) return;
    if (count > 0) {
        char *tmp = calloc((size_t)count + 1, 1);
        if (tmp && MPI_T_cvar_read(h, tmp) == MPI_SUCCESS) snprintf(out, nout, "%s", tmp);
        free(tmp);
    }
    MPI_T_cvar_handle_free(&h);
}

static void mpit_section(jbuf *j)
{
    int prov = 0;
    if (MPI_T_init_thread(MPI_THREAD_SINGLE, &prov) != MPI_SUCCESS) {
        jout(j, "\"mpit\": {\"status\": \"MPI_T_init_thread failed\"}");
        return;
    }
    int ncv = 0, npv = 0;
    MPI_T_cvar_get_num(&ncv);
    MPI_T_pvar_get_num(&npv);
    jout(j, "\"mpit\": {\"status\": \"ok\", \"cvars\": %d, \"pvars\": %d, \"selected\": {", ncv,
         npv);
    int first = 1;
    for (int i = 0; i < ncv; i++) {
        char name[256], desc[8];
        int nl = sizeof name, dl = sizeof desc, verb, bind, scope;
        MPI_Datatype dt;
        MPI_T_enum en;
        if (MPI_T_cvar_get_info(i, name, &nl, &verb, &dt, &en, desc, &dl, &bind, &scope)
            != MPI_SUCCESS)
            continue;
        if (!wanted_string(name) || dt != MPI_CHAR || bind != MPI_T_BIND_NO_OBJECT) continue;
        char val[1024];
        read_string_cvar(i, val, sizeof val);
        jout(j, "%s", first ? "" : ", ");
        jstr(j, name);
        jout(j, ": ");
        jstr(j, val);
        first = 0;
    }
    jout(j, "}, \"open_components\": [");
    first = 1;
    for (int i = 0; i < ncv; i++) {
        char name[256], desc[8], fw[16], comp[64];
        int nl = sizeof name, dl = sizeof desc, verb, bind, scope;
        MPI_Datatype dt;
        MPI_T_enum en;
        if (MPI_T_cvar_get_info(i, name, &nl, &verb, &dt, &en, desc, &dl, &bind, &scope)
            != MPI_SUCCESS)
            continue;
        if (!component_of(name, fw, sizeof fw, comp, sizeof comp)) continue;
        jout(j, "%s\"%s/%s\"", first ? "" : ", ", fw, comp);
        first = 0;
    }
    jout(j, "], \"tcp_interfaces\": [");
    first = 1;
    const char *bw = "btl_tcp_bandwidth_";
    for (int i = 0; i < ncv; i++) {
        char name[256], desc[8];
        int nl = sizeof name, dl = sizeof desc, verb, bind, scope;
        MPI_Datatype dt;
        MPI_T_enum en;
        if (MPI_T_cvar_get_info(i, name, &nl, &verb, &dt, &en, desc, &dl, &bind, &scope)
            != MPI_SUCCESS)
            continue;
        if (strncmp(name, bw, strlen(bw)) != 0 || !name[strlen(bw)]) continue;
        jout(j, "%s", first ? "" : ", ");
        jstr(j, name + strlen(bw));
        first = 0;
    }
    jout(j, "], \"pvar_names\": [");
    first = 1;
    for (int i = 0; i < npv; i++) {
        char name[256], desc[8];
        int nl = sizeof name, dl = sizeof desc, verb, vc, bind, ro, cont, atom;
        MPI_Datatype dt;
        MPI_T_enum en;
        if (MPI_T_pvar_get_info(i, name, &nl, &verb, &vc, &dt, &en, desc, &dl, &bind, &ro, &cont,
                                &atom) != MPI_SUCCESS)
            continue;
        jout(j, "%s", first ? "" : ", ");
        jstr(j, name);
        first = 0;
    }
    jout(j, "]}");
    MPI_T_finalize();
}

/* ------------------------------------------------------------------------ */
/* The job's own TCP connections, and what the kernel measured on each.        */

/* Set out to "a.b.c.d" and *port for an IPv4 or v4-mapped IPv6 address; 0
 * for any other family. */
static int v4_of(const struct sockaddr_storage *ss, char *out, size_t nout, unsigned *port)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)ss;
        *port = ntohs(a->sin_port);
        return inet_ntop(AF_INET, &a->sin_addr, out, (socklen_t)nout) != NULL;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)(const void *)ss;
        if (!IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) return 0;
        *port = ntohs(a->sin6_port);
        return inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], out, (socklen_t)nout) != NULL;
    }
    return 0;
}

static const char *iface_of(struct ifaddrs *ifs, const char *ip)
{
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        char a[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, a, sizeof a);
        if (strcmp(a, ip) == 0) return i->ifa_name;
    }
    return "";
}

/* A field of struct tcp_info the kernel filled (len: what getsockopt returned;
 * an older kernel fills a prefix). */
#define TI_HAS(len, f) (offsetof(struct tcp_info, f) + sizeof(((struct tcp_info *)0)->f) <= (len))

/* The kernel's figures for one connection (tcp(7), linux/tcp.h): what it
 * sent and received, how long it had data in flight (busy: total, of which
 * limited by the peer's receive window or by this socket's send buffer),
 * its last delivery-rate sample, round-trip time and retransmissions.
 * Fields a kernel does not have are left out. */
static void tcp_info_json(jbuf *j, const struct tcp_info *t, socklen_t len)
{
    jout(j, "{\"state\": %u, \"rtt_us\": %u, \"rttvar_us\": %u, \"snd_cwnd\": %u, "
         "\"snd_mss\": %u, \"total_retrans\": %u", (unsigned)t->tcpi_state, t->tcpi_rtt,
         t->tcpi_rttvar, t->tcpi_snd_cwnd, t->tcpi_snd_mss, t->tcpi_total_retrans);
    if (TI_HAS(len, tcpi_bytes_acked))
        jout(j, ", \"bytes_acked\": %llu", (unsigned long long)t->tcpi_bytes_acked);
    if (TI_HAS(len, tcpi_bytes_received))
        jout(j, ", \"bytes_received\": %llu", (unsigned long long)t->tcpi_bytes_received);
    if (TI_HAS(len, tcpi_segs_out))
        jout(j, ", \"segs_out\": %u, \"segs_in\": %u", t->tcpi_segs_out, t->tcpi_segs_in);
    if (TI_HAS(len, tcpi_min_rtt)) jout(j, ", \"min_rtt_us\": %u", t->tcpi_min_rtt);
    if (TI_HAS(len, tcpi_delivery_rate))
        jout(j, ", \"delivery_rate\": %llu, \"delivery_rate_app_limited\": %s",
             (unsigned long long)t->tcpi_delivery_rate,
             t->tcpi_delivery_rate_app_limited ? "true" : "false");
    if (TI_HAS(len, tcpi_sndbuf_limited))
        jout(j, ", \"busy_us\": %llu, \"rwnd_limited_us\": %llu, \"sndbuf_limited_us\": %llu",
             (unsigned long long)t->tcpi_busy_time, (unsigned long long)t->tcpi_rwnd_limited,
             (unsigned long long)t->tcpi_sndbuf_limited);
    if (TI_HAS(len, tcpi_bytes_sent))
        jout(j, ", \"bytes_sent\": %llu, \"bytes_retrans\": %llu",
             (unsigned long long)t->tcpi_bytes_sent, (unsigned long long)t->tcpi_bytes_retrans);
    jout(j, "}");
}

/* ------------------------------------------------------------------------ */
/* The sampler: a thread of its own ("hvprof-net") that reads tcp_info of the  */
/* rank's connections to other hosts every HOROVOD_PROFILE_NET_MS.            */
/*
 * Why sampled, not only read at MPI_Finalize: a connection's totals mix its
 * bulk transfers with the control messages around them (Horovod's cycle sends
 * a few bytes every millisecond, and a message the peer answers late keeps
 * the connection "busy" for the kernel until the delayed ACK), so bytes over
 * busy time at the end says little about the link.  Each read keeps, per
 * connection: the kernel's delivery-rate sample when new data was ACKed and
 * the sample was not limited by the application (the rate the path delivered
 * under load: a histogram), and the bytes each way since the previous read
 * (a read interval that moved NET_ACTIVE_BYTES or more is active: the
 * interval's throughput goes into a histogram; the best one is the
 * connection's peak).  Per rank, the time its connections to other hosts
 * were carrying bulk data: each interval counts in proportion to the busiest
 * connection's bytes against its typical bulk rate (net_typical; at most the
 * whole interval), so
 * transfers that run in parallel count once and transfers in turn add up;
 * its running total is stored at every step record (net_step), so that the
 * analysis takes the steady steps' share.
 *
 * Cost: one getsockopt per connection a read, and a scan of /proc/self/fd
 * every NET_RESCAN reads (new connections: Open MPI connects on the first
 * message to a peer).  The period grows (never shrinks below the setting) so
 * that the reads take at most NET_MAX_SHARE of a core: the thread's own CPU
 * clock, measured. */

#define NET_MAX 128                 /* connections followed */
/* Rate histograms, bytes/s: bin b holds [2^(10 + b/4), 2^(10 + (b+1)/4)), a
 * quarter octave (19%) each, from 1 KiB/s (bin 0 also holds less) to 1 TiB/s
 * (the last bin also holds more). */
#define NET_BIN_LOG2_MIN 10
#define NET_BINS_PER_OCTAVE 4
#define NET_BINS (30 * NET_BINS_PER_OCTAVE)
#define NET_ACTIVE_BYTES (64 * 1024)
#define NET_RESCAN 50
#define NET_MAX_SHARE 0.005
#define NET_STEPS 512               /* step marks kept at most (net_step) */
#define NET_STEPS_ALL 64            /* every step's mark up to this one */

typedef struct {
    int fd;
    ino_t ino;
    int live;
    char lip[INET_ADDRSTRLEN], rip[INET_ADDRSTRLEN];
    unsigned lport, rport;
    uint64_t acked, recv, t;        /* the previous read */
    uint64_t reads, rate_samples;
    double peak_out, peak_in;       /* bytes/s: the best active interval */
    uint64_t active_out_ns, active_in_ns, active_out_bytes, active_in_bytes;
    uint32_t hist_rate[NET_BINS], hist_out[NET_BINS], hist_in[NET_BINS];
} net_conn;

typedef struct {
    uint32_t seq;
    uint64_t ticks, active_ns, bytes;
} net_mark;

static net_conn net_conns[NET_MAX];
static int n_net;
static pthread_t net_thread;
static int net_running;
static pthread_mutex_t net_lock = PTHREAD_MUTEX_INITIALIZER; /* the table, the thread's wait */
/* the marks: the stepping thread never waits for a read of the connections */
static pthread_mutex_t mark_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t net_cond = PTHREAD_COND_INITIALIZER;
static int net_stop;
static long net_period_ms, net_setting_ms;
static uint64_t net_reads, net_cpu_ns, net_active_ns, net_bytes, net_dropped_marks;
static net_mark net_marks[NET_STEPS];
static uint32_t n_marks, net_stride = 16;
static char net_reason[128];

static int net_bin(double rate)
{
    /* the octave, then the quarter (2^(1/4), 2^(1/2), 2^(3/4)): no libm */
    static const double Q[3] = {1.189207115, 1.414213562, 1.681792831};
    if (!(rate >= (double)(1ULL << NET_BIN_LOG2_MIN))) return 0;
    int oct = 0;
    double m = rate / (double)(1ULL << NET_BIN_LOG2_MIN);
    while (m >= 2.0 && oct < 64) {
        m /= 2.0;
        oct++;
    }
    int q = 0;
    while (q < 3 && m >= Q[q]) q++;
    int b = oct * NET_BINS_PER_OCTAVE + q;
    return b >= NET_BINS ? NET_BINS - 1 : b;
}

/* The rate a direction moves at when it carries bulk data: the median of its
 * active intervals' throughput so far (the bin's middle), not the best one (a
 * rate limiter's burst, or an interval that caught two transfers' bytes,
 * would make every full interval look part-busy).  An interval at or above
 * it counts whole; one below, the share it moved (a transfer that began or
 * ended in it). */
static double net_typical(const uint32_t *h)
{
    static const double Q[4] = {1.090507733, 1.296839555, 1.542210825, 1.834008086};
    uint64_t tot = 0, acc = 0;
    for (int b = 0; b < NET_BINS; b++) tot += h[b];
    for (int b = 0; b < NET_BINS; b++) {
        acc += h[b];
        if (2 * acc >= tot) { /* 2^(log2_min + (b + 1/2) / per_octave), without libm */
            double v = (double)(1ULL << NET_BIN_LOG2_MIN);
            for (int k = 0; k < b / NET_BINS_PER_OCTAVE; k++) v *= 2.0;
            return v * Q[b % NET_BINS_PER_OCTAVE];
        }
    }
    return 1.0;
}

static int64_t net_thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Is ip one of this host's addresses (a connection within the host)? */
static int net_is_local(struct ifaddrs *ifs, const char *ip)
{
    if (strncmp(ip, "127.", 4) == 0) return 1;
    return iface_of(ifs, ip)[0] != 0;
}

/* /proc/self/fd: the TCP connections to other hosts not followed yet
 * (net_lock held).  A followed descriptor whose socket changed is dropped. */
static void net_rescan(void)
{
    for (int i = 0; i < n_net; i++) {
        struct stat st;
        if (net_conns[i].live && (fstat(net_conns[i].fd, &st) != 0 || st.st_ino != net_conns[i].ino))
            net_conns[i].live = 0;
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    while (d && (e = readdir(d)) && n_net < NET_MAX) {
        char *endp;
        long fd = strtol(e->d_name, &endp, 10);
        if (endp == e->d_name || *endp || fd < 0 || fd == dirfd(d)) continue;
        struct stat st;
        if (fstat((int)fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        int known = 0;
        for (int i = 0; i < n_net && !known; i++) known = net_conns[i].ino == st.st_ino;
        if (known) continue;
        struct tcp_info ti;
        socklen_t tl = sizeof ti;
        memset(&ti, 0, sizeof ti);
        if (getsockopt((int)fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0 || ti.tcpi_state != 1
            || !TI_HAS(tl, tcpi_bytes_received))
            continue;
        struct sockaddr_storage loc, rem;
        socklen_t ll = sizeof loc, rl = sizeof rem;
        net_conn c;
        memset(&c, 0, sizeof c);
        if (getsockname((int)fd, (struct sockaddr *)&loc, &ll) != 0
            || getpeername((int)fd, (struct sockaddr *)&rem, &rl) != 0
            || !v4_of(&loc, c.lip, sizeof c.lip, &c.lport)
            || !v4_of(&rem, c.rip, sizeof c.rip, &c.rport) || net_is_local(ifs, c.rip))
            continue;
        c.fd = (int)fd;
        c.ino = st.st_ino;
        c.live = 1;
        c.acked = ti.tcpi_bytes_acked;
        c.recv = ti.tcpi_bytes_received;
        c.t = hvprof_ticks();
        net_conns[n_net++] = c;
    }
    if (d) closedir(d);
    freeifaddrs(ifs);
}

/* One read of every followed connection (net_lock held). */
static void net_read(double tpn)
{
    double busiest = 0.0; /* the largest share of an interval a connection was busy */
    uint64_t span = 0, moved = 0;
    for (int i = 0; i < n_net; i++) {
        net_conn *c = &net_conns[i];
        if (!c->live) continue;
        struct tcp_info ti;
        socklen_t tl = sizeof ti;
        memset(&ti, 0, sizeof ti);
        if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0 || ti.tcpi_state != 1) {
            c->live = 0;
            continue;
        }
        if (ti.tcpi_bytes_acked < c->acked || ti.tcpi_bytes_received < c->recv) {
            c->live = 0; /* the descriptor names another socket now: the next scan */
            continue;
        }
        uint64_t now = hvprof_ticks();
        double dt_ns = (double)(now - c->t) / tpn;
        uint64_t dout = ti.tcpi_bytes_acked - c->acked, din = ti.tcpi_bytes_received - c->recv;
        c->reads++;
        if (dout > 0 && TI_HAS(tl, tcpi_delivery_rate) && !ti.tcpi_delivery_rate_app_limited
            && ti.tcpi_delivery_rate > 0) {
            c->hist_rate[net_bin((double)ti.tcpi_delivery_rate)]++;
            c->rate_samples++;
        }
        if (dt_ns > 0) {
            double share = 0.0;
            if (dout >= NET_ACTIVE_BYTES) {
                double r = (double)dout / (dt_ns / 1e9);
                if (r > c->peak_out) c->peak_out = r;
                c->hist_out[net_bin(r)]++;
                c->active_out_ns += (uint64_t)dt_ns;
                c->active_out_bytes += dout;
                share = r / net_typical(c->hist_out);
            }
            if (din >= NET_ACTIVE_BYTES) {
                double r = (double)din / (dt_ns / 1e9);
                if (r > c->peak_in) c->peak_in = r;
                c->hist_in[net_bin(r)]++;
                c->active_in_ns += (uint64_t)dt_ns;
                c->active_in_bytes += din;
                double sh = r / net_typical(c->hist_in);
                if (sh > share) share = sh;
            }
            if (share > busiest) busiest = share;
            if ((uint64_t)dt_ns > span) span = (uint64_t)dt_ns;
            moved += dout + din;
        }
        c->acked = ti.tcpi_bytes_acked;
        c->recv = ti.tcpi_bytes_received;
        c->t = now;
    }
    if (busiest > 1.0) busiest = 1.0;
    __atomic_add_fetch(&net_active_ns, (uint64_t)(busiest * (double)span), __ATOMIC_RELAXED);
    __atomic_add_fetch(&net_bytes, moved, __ATOMIC_RELAXED);
}

static void *net_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "hvprof-net");
    hvprof_file_header *h = hvprof_header();
    double tpn = h && h->ticks_per_ns > 0 ? h->ticks_per_ns : 1.0;
    pthread_mutex_lock(&net_lock);
    while (!net_stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (net_period_ms % 1000) * 1000000L;
        until.tv_sec += net_period_ms / 1000 + until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&net_cond, &net_lock, &until);
        if (net_stop) break;
        int64_t c0 = net_thread_cpu_ns();
        if (net_reads % NET_RESCAN == 0) net_rescan();
        net_read(tpn);
        net_reads++;
        int64_t c1 = net_thread_cpu_ns();
        if (c1 > c0) net_cpu_ns += (uint64_t)(c1 - c0);
        /* at most NET_MAX_SHARE of a core: the period follows the reads' mean
         * cost (the first reads, which scan /proc, weigh less as reads add up) */
        long need = (long)((double)net_cpu_ns / (double)net_reads / NET_MAX_SHARE / 1e6) + 1;
        net_period_ms = need > net_setting_ms ? (need < 60000 ? need : 60000) : net_setting_ms;
    }
    pthread_mutex_unlock(&net_lock);
    return NULL;
}

static void net_start(void)
{
    net_setting_ms = hvprof_setting_int(HVS_NET_MS);
    net_period_ms = net_setting_ms;
    if (net_period_ms <= 0) {
        snprintf(net_reason, sizeof net_reason, "HOROVOD_PROFILE_NET_MS=0: not sampled");
        return;
    }
    net_stop = 0;
    if (pthread_create(&net_thread, NULL, net_main, NULL) != 0) {
        snprintf(net_reason, sizeof net_reason, "the sampling thread did not start");
        return;
    }
    net_running = 1;
}

static void net_end(void)
{
    if (!net_running) return;
    pthread_mutex_lock(&net_lock);
    net_stop = 1;
    pthread_cond_signal(&net_cond);
    pthread_mutex_unlock(&net_lock);
    pthread_join(net_thread, NULL);
    net_running = 0;
}

/* A step record was written (the stepping thread): the running total of the
 * time the rank's links carried bulk data, for the steps' share.  Marks are
 * kept for every step of the first NET_STEPS_ALL, then one in `net_stride`
 * (16 at first); when NET_STEPS are held, every other one is dropped and the
 * stride doubles: bounded, and spread over the whole run. */
static void net_step(uint32_t seq)
{
    if (!net_running) return;
    pthread_mutex_lock(&mark_lock);
    if (seq >= NET_STEPS_ALL && seq % net_stride != 0) {
        pthread_mutex_unlock(&mark_lock);
        return;
    }
    if (n_marks >= NET_STEPS) {
        uint32_t k = 0;
        for (uint32_t i = 0; i < n_marks; i += 2) net_marks[k++] = net_marks[i];
        net_dropped_marks += n_marks - k;
        n_marks = k;
        net_stride *= 2;
    }
    net_marks[n_marks++] = (net_mark){seq, hvprof_ticks(),
                                      __atomic_load_n(&net_active_ns, __ATOMIC_RELAXED),
                                      __atomic_load_n(&net_bytes, __ATOMIC_RELAXED)};
    pthread_mutex_unlock(&mark_lock);
}

static void hist_json(jbuf *j, const char *key, const uint32_t *h)
{
    jout(j, "\"%s\": [", key);
    const char *sep = "";
    for (int b = 0; b < NET_BINS; b++)
        if (h[b]) {
            jout(j, "%s[%d, %u]", sep, b, h[b]);
            sep = ", ";
        }
    jout(j, "]");
}

static const net_conn *net_find(ino_t ino)
{
    for (int i = 0; i < n_net; i++)
        if (net_conns[i].ino == ino) return &net_conns[i];
    return NULL;
}

static void net_conn_json(jbuf *j, const net_conn *c)
{
    jout(j, "{\"reads\": %llu, \"rate_samples\": %llu, \"peak_out\": %.0f, \"peak_in\": %.0f, "
         "\"active_out_ns\": %llu, \"active_in_ns\": %llu, \"active_out_bytes\": %llu, "
         "\"active_in_bytes\": %llu, ", (unsigned long long)c->reads,
         (unsigned long long)c->rate_samples, c->peak_out, c->peak_in,
         (unsigned long long)c->active_out_ns, (unsigned long long)c->active_in_ns,
         (unsigned long long)c->active_out_bytes, (unsigned long long)c->active_in_bytes);
    hist_json(j, "rate_hist", c->hist_rate);
    jout(j, ", ");
    hist_json(j, "out_hist", c->hist_out);
    jout(j, ", ");
    hist_json(j, "in_hist", c->hist_in);
    jout(j, "}");
}

static void net_json(jbuf *j)
{
    jout(j, "\"net_sampler\": {\"setting_ms\": %ld, \"period_ms\": %ld, \"reads\": %llu, "
         "\"cpu_ns\": %llu, \"connections\": %d, \"active_ns\": %llu, \"bytes\": %llu, "
         "\"active_bytes_min\": %d, \"bin_log2_min\": %d, \"bins_per_octave\": %d, "
         "\"marks_dropped\": %llu, \"reason\": ", net_setting_ms,
         net_period_ms, (unsigned long long)net_reads, (unsigned long long)net_cpu_ns, n_net,
         (unsigned long long)net_active_ns, (unsigned long long)net_bytes, NET_ACTIVE_BYTES,
         NET_BIN_LOG2_MIN, NET_BINS_PER_OCTAVE, (unsigned long long)net_dropped_marks);
    jstr(j, net_reason);
    jout(j, ", \"steps\": [");
    for (uint32_t i = 0; i < n_marks; i++)
        jout(j, "%s[%u, %llu, %llu, %llu]", i ? ", " : "", net_marks[i].seq,
             (unsigned long long)net_marks[i].ticks, (unsigned long long)net_marks[i].active_ns,
             (unsigned long long)net_marks[i].bytes);
    jout(j, "]}");
}

/* Every established TCP connection of this process (/proc/self/fd, the
 * sockets among them, each once), with its addresses, the local interface
 * and the kernel's tcp_info.  Other processes' connections are not read. */
static void connections_json(jbuf *j, struct ifaddrs *ifs)
{
    enum { MAXS = 4096 };
    static ino_t seen[MAXS];
    size_t nseen = 0;
    int first = 1;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    int dfd = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        char *endp;
        long fd = strtol(e->d_name, &endp, 10);
        if (endp == e->d_name || *endp || fd < 0 || fd == dfd) continue;
        struct stat st;
        if (fstat((int)fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
        int dup = 0;
        for (size_t i = 0; i < nseen && !dup; i++) dup = seen[i] == st.st_ino;
        if (dup) continue;
        if (nseen < MAXS) seen[nseen++] = st.st_ino;
        struct tcp_info ti;
        memset(&ti, 0, sizeof ti);
        socklen_t tl = sizeof ti;
        if (getsockopt((int)fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0) continue; /* not TCP */
        if (ti.tcpi_state != 1) continue; /* TCP_ESTABLISHED (netinet/tcp.h, which clashes with linux/tcp.h) */
        struct sockaddr_storage loc, rem;
        socklen_t ll = sizeof loc, rl = sizeof rem;
        if (getsockname((int)fd, (struct sockaddr *)&loc, &ll) != 0
            || getpeername((int)fd, (struct sockaddr *)&rem, &rl) != 0)
            continue;
        char lip[INET_ADDRSTRLEN], rip[INET_ADDRSTRLEN];
        unsigned lport = 0, rport = 0;
        if (!v4_of(&loc, lip, sizeof lip, &lport) || !v4_of(&rem, rip, sizeof rip, &rport))
            continue;
        jout(j, "%s{\"local\": \"%s\", \"local_port\": %u, \"remote\": \"%s\", "
             "\"remote_port\": %u, \"interface\": ", first ? "" : ", ", lip, lport, rip, rport);
        jstr(j, iface_of(ifs, lip));
        jout(j, ", \"tcp_info\": ");
        tcp_info_json(j, &ti, tl);
        const net_conn *nc = net_find(st.st_ino);
        if (nc) {
            jout(j, ", \"sampled\": ");
            net_conn_json(j, nc);
        }
        jout(j, "}");
        first = 0;
    }
    closedir(d);
}

/* ------------------------------------------------------------------------ */
/* The host's network interfaces: their byte counters at the raw file's open */
/* and at MPI_Finalize (on a shared host, every process's traffic).           */

#define NIC_MAX 32
typedef struct {
    char name[64]; /* "eth0", or "mlx5_0/1" for an InfiniBand port */
    int ib;
    long long speed; /* Mb/s from /sys/class/net/<if>/speed; -1 unknown */
    unsigned long long v[4]; /* rx_bytes, tx_bytes, rx_packets, tx_packets */
    uint64_t ticks;
} nic_reading;

static nic_reading nic_start[NIC_MAX], nic_end[NIC_MAX];
static int n_nic_start, n_nic_end;

static int read_ull(const char *path, unsigned long long *out)
{
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    int ok = fscanf(f, "%llu", out) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

/* /sys/class/net/<if>/statistics and /sys/class/infiniband/<dev>/ports/<p>/
 * counters (port_rcv_data and port_xmit_data count 4-byte words). */
static int read_nics(nic_reading *out, int max)
{
    int n = 0;
    uint64_t now = hvprof_ticks();
    DIR *d = opendir("/sys/class/net");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < max) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "lo") == 0) continue;
        static const char *const K[4] = {"rx_bytes", "tx_bytes", "rx_packets", "tx_packets"};
        nic_reading *r = &out[n];
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "%.63s", e->d_name);
        int ok = 1;
        for (int k = 0; k < 4 && ok; k++) {
            char p[512];
            snprintf(p, sizeof p, "/sys/class/net/%s/statistics/%s", e->d_name, K[k]);
            ok = read_ull(p, &r->v[k]) == 0;
        }
        if (!ok) continue;
        char p[512];
        unsigned long long sp;
        snprintf(p, sizeof p, "/sys/class/net/%s/speed", e->d_name);
        /* "speed" fails (EINVAL) on a link that is down or has none */
        r->speed = read_ull(p, &sp) == 0 && sp < 100000000ULL ? (long long)sp : -1;
        r->ticks = now;
        n++;
    }
    if (d) closedir(d);
    d = opendir("/sys/class/infiniband");
    while (d && (e = readdir(d)) && n < max) {
        if (e->d_name[0] == '.') continue;
        char pp[512];
        snprintf(pp, sizeof pp, "/sys/class/infiniband/%s/ports", e->d_name);
        DIR *pd = opendir(pp);
        struct dirent *pe;
        while (pd && (pe = readdir(pd)) && n < max) {
            if (pe->d_name[0] == '.') continue;
            static const char *const K[4] = {"port_rcv_data", "port_xmit_data",
                                             "port_rcv_packets", "port_xmit_packets"};
            nic_reading *r = &out[n];
            memset(r, 0, sizeof *r);
            snprintf(r->name, sizeof r->name, "%.30s/%.30s", e->d_name, pe->d_name);
            r->ib = 1;
            r->speed = -1;
            int ok = 1;
            for (int k = 0; k < 4 && ok; k++) {
                char p[1024];
                snprintf(p, sizeof p, "%s/%s/counters/%s", pp, pe->d_name, K[k]);
                ok = read_ull(p, &r->v[k]) == 0;
            }
            if (!ok) continue;
            r->v[0] *= 4; /* words of 4 bytes */
            r->v[1] *= 4;
            r->ticks = now;
            n++;
        }
        if (pd) closedir(pd);
    }
    if (d) closedir(d);
    return n;
}

static void nics_json(jbuf *j, const char *key, const nic_reading *r, int n)
{
    jout(j, "\"%s\": [", key);
    for (int i = 0; i < n; i++) {
        jout(j, "%s{\"name\": ", i ? ", " : "");
        jstr(j, r[i].name);
        jout(j, ", \"kind\": \"%s\", \"speed_mbps\": %lld, \"rx_bytes\": %llu, \"tx_bytes\": %llu, "
             "\"rx_packets\": %llu, \"tx_packets\": %llu, \"ticks\": %llu}",
             r[i].ib ? "infiniband" : "net", r[i].speed, r[i].v[0], r[i].v[1], r[i].v[2],
             r[i].v[3], (unsigned long long)r[i].ticks);
    }
    jout(j, "]");
}

static void sockets_section(jbuf *j)
{
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) ifs = NULL;
    jout(j, "\"addresses\": [");
    int first = 1;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        char a[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, a, sizeof a);
        jout(j, "%s{\"interface\": ", first ? "" : ", ");
        jstr(j, i->ifa_name);
        jout(j, ", \"ip\": \"%s\"}", a);
        first = 0;
    }
    jout(j, "], \"tcp_connections\": [");
    connections_json(j, ifs);
    jout(j, "], \"nics\": {");
    n_nic_end = read_nics(nic_end, NIC_MAX);
    nics_json(j, "start", nic_start, n_nic_start);
    jout(j, ", ");
    nics_json(j, "end", nic_end, n_nic_end);
    jout(j, "}");
    if (ifs) freeifaddrs(ifs);
}

/* The raw file opened (MPI_Init, or a process without MPI): the NICs'
 * counters at the start of the run, and the sampler of an MPI rank. */
static void mpit_opened(void)
{
    n_nic_start = read_nics(nic_start, NIC_MAX);
    int init = 0;
    if (PMPI_Initialized(&init) == MPI_SUCCESS && init) net_start();
    else snprintf(net_reason, sizeof net_reason, "no MPI: not sampled");
}

static void mpit_reset(void)
{
    net_end();
    n_nic_start = n_nic_end = 0;
    n_net = 0;
    n_marks = 0;
    net_stride = 16;
    net_reads = net_cpu_ns = net_active_ns = net_bytes = net_dropped_marks = 0;
    net_reason[0] = 0;
    net_setting_ms = net_period_ms = 0;
}

/* A forked child: the sampling thread is the parent's. */
static void mpit_atfork_child(void)
{
    pthread_mutex_init(&net_lock, NULL);
    pthread_mutex_init(&mark_lock, NULL);
    pthread_cond_init(&net_cond, NULL);
    net_running = 0;
    n_net = 0;
    n_marks = 0;
}

static void write_mpit_sidecar(void)
{
    net_end(); /* the last read is the sidecar's own */
    int init = 0, fin = 0;
    if (PMPI_Initialized(&init) != MPI_SUCCESS || !init) return;
    if (PMPI_Finalized(&fin) != MPI_SUCCESS || fin) return;
    char path[4096];
    if (hvprof_sidecar_path(path, sizeof path, ".mpit.json") != 0) return;
    char *buf = malloc(MPIT_BUF);
    if (!buf) return;
    jbuf j = {buf, MPIT_BUF, 0};
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int vl = 0;
    if (MPI_Get_library_version(version, &vl) != MPI_SUCCESS) version[0] = 0;
    /* MPICH's version string names its device ("MPICH Device:\tch4:ucx") */
    char device[128] = "";
    const char *dv = strstr(version, "Device:");
    if (dv) {
        dv += strlen("Device:");
        while (*dv == ' ' || *dv == '\t') dv++;
        snprintf(device, sizeof device, "%.*s", (int)strcspn(dv, "\r\n"), dv);
    }
    char *nl = strchr(version, '\n');
    if (nl) *nl = 0;
    jout(&j, "{\"library\": ");
    jstr(&j, version);
    jout(&j, ", \"device\": ");
    jstr(&j, device);
    jout(&j, ", ");
    mpit_section(&j);
    jout(&j, ", ");
    sockets_section(&j);
    jout(&j, ", ");
    net_json(&j);
    jout(&j, "}");
    if (j.k >= j.n) snprintf(buf, MPIT_BUF, "{\"error\": \"mpit json too long\"}");
    hvprof_write_text(path, buf);
    free(buf);
}

static const hvprof_backend mpit_backend = {
    .name = "mpit",
    .library = NULL,
    .reset = mpit_reset,
    .opened = mpit_opened,
    .app_step = net_step,
    .finish = write_mpit_sidecar,
    .atfork_child = mpit_atfork_child,
};

__attribute__((constructor)) static void mpit_ctor(void)
{
    hvprof_register_backend(&mpit_backend);
}
