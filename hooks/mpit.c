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
 *   process (/proc/self/fd -> /proc/self/net/tcp), with their remote and
 *   local addresses; Open MPI's TCP BTL connects lazily, on the first message
 *   to a peer, so a socket to another host's address means TCP carried data.
 *
 * Runs from this backend's finish hook (hvprof_close), which the MPI_Finalize
 * wrapper calls before PMPI_Finalize; elsewhere (exit without MPI, MPI
 * already finalized) it writes nothing.  Never on a hot path. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "hvprof_internal.h"

#define MPIT_BUF 32768

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

/* The process's socket inodes (/proc/self/fd -> "socket:[N]"). */
static size_t socket_inodes(unsigned long *ino, size_t max)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char p[300], t[64];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(p, t, sizeof t - 1);
        if (k <= 0) continue;
        t[k] = 0;
        unsigned long v;
        if (sscanf(t, "socket:[%lu]", &v) == 1) ino[n++] = v;
    }
    closedir(d);
    return n;
}

/* "0B004D0A" (network order as a little-endian hex word) -> dotted quad.
 * v6: 32 hex digits; only v4-mapped addresses are kept. */
static int hex_ip(const char *hex, char *out, size_t nout)
{
    size_t n = strlen(hex);
    unsigned int v = 0;
    if (n == 32) {
        if (strncmp(hex, "0000000000000000FFFF0000", 24) != 0) return 0;
        hex += 24;
    } else if (n != 8) {
        return 0;
    }
    if (sscanf(hex, "%8x", &v) != 1) return 0;
    struct in_addr a = {.s_addr = v};
    return inet_ntop(AF_INET, &a, out, (socklen_t)nout) != NULL;
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

static void sockets_section(jbuf *j)
{
    enum { MAXI = 4096 };
    static unsigned long ino[MAXI];
    size_t ni = socket_inodes(ino, MAXI);
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
    first = 1;
    static const char *const FILES[] = {"/proc/self/net/tcp", "/proc/self/net/tcp6"};
    for (size_t f = 0; f < 2; f++) {
        FILE *fp = fopen(FILES[f], "r");
        if (!fp) continue;
        char line[512];
        if (!fgets(line, sizeof line, fp)) { fclose(fp); continue; }
        while (fgets(line, sizeof line, fp)) {
            char loc[64], rem[64];
            unsigned int lport, rport, st;
            unsigned long inode;
            /* sl local rem st tx:rx tr:tm retrnsmt uid timeout inode */
            if (sscanf(line, " %*s %63[0-9A-Fa-f]:%x %63[0-9A-Fa-f]:%x %x %*s %*s %*s %*s %*s %lu",
                       loc, &lport, rem, &rport, &st, &inode) != 6)
                continue;
            if (st != 1) continue; /* TCP_ESTABLISHED */
            int mine = 0;
            for (size_t i = 0; i < ni && !mine; i++) mine = ino[i] == inode;
            if (!mine) continue;
            char lip[INET_ADDRSTRLEN], rip[INET_ADDRSTRLEN];
            if (!hex_ip(loc, lip, sizeof lip) || !hex_ip(rem, rip, sizeof rip)) continue;
            jout(j, "%s{\"local\": \"%s\", \"local_port\": %u, \"remote\": \"%s\", "
                 "\"remote_port\": %u, \"interface\": ", first ? "" : ", ", lip, lport, rip,
                 rport);
            jstr(j, iface_of(ifs, lip));
            jout(j, "}");
            first = 0;
        }
        fclose(fp);
    }
    jout(j, "]");
    if (ifs) freeifaddrs(ifs);
}

static void write_mpit_sidecar(void)
{
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
    jout(&j, "}");
    if (j.k >= j.n) snprintf(buf, MPIT_BUF, "{\"error\": \"mpit json too long\"}");
    hvprof_write_text(path, buf);
    free(buf);
}

static const hvprof_backend mpit_backend = {
    .name = "mpit",
    .library = NULL,
    .finish = write_mpit_sidecar,
    .atfork_child = NULL,
};

__attribute__((constructor)) static void mpit_ctor(void)
{
    hvprof_register_backend(&mpit_backend);
}
