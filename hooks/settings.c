/*
 * settings.c -- the one way the library reads a HOROVOD_PROFILE* variable,
 * and its one-line diagnostics.
 *
 * The table is hvprof_settings.h, generated from profiler._env.SETTINGS (the
 * Python side reads the same table): each setting's kind, default, range
 * and choices.  A value the library cannot use is said once per process in
 * the table's words (hvprof_settings_check, at rank 0's open) and the
 * default is used: a setting never stops a job.  HOROVOD_PROFILE is the
 * exception: a value that is none of its words turns profiling off and is
 * said at once (hvprof_profile_mode).  Other variables (LD_PRELOAD, the
 * launchers' rank variables, NCCL's and Horovod's own) are read with getenv
 * directly.
 *
 * A leaf: this file calls nothing else of the library, so that every file,
 * the core included, may call it.  Reads are getenv plus parsing: callable
 * wherever getenv is, and nowhere else (never in a signal handler).
 * Nothing is cached: each caller reads when it did before.
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hvprof_internal.h"

typedef struct {
    const char *name;
    int kind;
    double dflt, lo, hi;
    const char *choices; /* "a|b|c" */
    const char *takes;   /* the warning's words */
    const char *shown;   /* the default, as the warning says it is used */
} spec;

#define HVS_SPEC_(id, name, kind, dflt, lo, hi, choices, takes, shown) \
    [id] = {name, kind, dflt, lo, hi, choices, takes, shown},
static const spec SPECS[HVS_COUNT] = {HVPROF_SETTINGS(HVS_SPEC_)};
#undef HVS_SPEC_

static const char *const ON_WORDS[] = {HVS_ON_WORDS, NULL};
static const char *const OFF_WORDS[] = {HVS_OFF_WORDS, NULL};
static const char *const FULL_WORDS[] = {HVS_FULL_WORDS, NULL};

void hvprof_warn(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "horovod-profiler: %s\n", buf);
}

/* v without its surrounding blanks: [*b, *e). */
static void trim(const char *v, const char **b, const char **e)
{
    while (*v && isspace((unsigned char)*v)) v++;
    const char *end = v + strlen(v);
    while (end > v && isspace((unsigned char)end[-1])) end--;
    *b = v;
    *e = end;
}

/* The word [b, e) is w, in any case. */
static int word_is(const char *b, const char *e, const char *w)
{
    size_t n = (size_t)(e - b);
    return strlen(w) == n && strncasecmp(b, w, n) == 0;
}

static int in_words(const char *b, const char *e, const char *const *words)
{
    for (; *words; words++)
        if (word_is(b, e, *words)) return 1;
    return 0;
}

/* HOROVOD_PROFILE_WINDOW: "A:B" or "A:" seconds after start, 0 <= A < B. */
int hvprof_parse_window(const char *w, double *a, double *b)
{
    char *end = NULL;
    *a = strtod(w, &end);
    if (end == w || !(*a >= 0) || *a > 1e9) return -1;
    *b = -1;
    if (*end == 0) return 0;
    if (*end != ':') return -1;
    const char *rest = end + 1;
    if (*rest == 0) return 0;
    *b = strtod(rest, &end);
    return end != rest && *end == 0 && *b > *a && *b <= 1e9 ? 0 : -1;
}

/* The value of a set, non-blank variable as the table parses it: 0 and *out
 * set, or -1 (unusable).  A choice's value is its index. */
static int parse(hvprof_setting_id id, const char *v, double *out)
{
    const spec *s = &SPECS[id];
    const char *b, *e;
    trim(v, &b, &e);
    char buf[128];
    size_t n = (size_t)(e - b);
    switch (s->kind) {
    case HVS_SWITCH:
        if (in_words(b, e, ON_WORDS)) return *out = 1, 0;
        if (in_words(b, e, OFF_WORDS)) return *out = 0, 0;
        return -1;
    case HVS_CHOICE: {
        const char *c = s->choices;
        for (int i = 0; *c; i++) {
            const char *bar = strchr(c, '|');
            size_t len = bar ? (size_t)(bar - c) : strlen(c);
            if (len == n && strncasecmp(b, c, n) == 0) return *out = i, 0;
            c += len + (bar ? 1 : 0);
        }
        return -1;
    }
    case HVS_INT:
    case HVS_NUM: {
        if (n == 0 || n >= sizeof buf) return -1;
        memcpy(buf, b, n);
        buf[n] = 0;
        char *end = NULL;
        double x = s->kind == HVS_INT ? (double)strtol(buf, &end, 10) : strtod(buf, &end);
        if (end == buf || *end || !isfinite(x) || x < s->lo || x > s->hi) return -1;
        return *out = x, 0;
    }
    case HVS_TEXT:
        if (id == HVS_WINDOW) {
            double a, w;
            return hvprof_parse_window(v, &a, &w);
        }
        return *out = 0, 0;
    default:
        return -1;
    }
}

const char *hvprof_setting_text(hvprof_setting_id id)
{
    const char *v = getenv(SPECS[id].name);
    return v && *v ? v : NULL;
}

double hvprof_setting_num(hvprof_setting_id id)
{
    const char *v = hvprof_setting_text(id);
    double x;
    return v && parse(id, v, &x) == 0 ? x : SPECS[id].dflt;
}

long hvprof_setting_int(hvprof_setting_id id) { return (long)hvprof_setting_num(id); }

int hvprof_launcher_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                       "HOROVOD_RANK", "RANK", "SLURM_PROCID", NULL};
    for (const char *const *p = vars; *p; p++) {
        const char *v = getenv(*p);
        if (v && *v) return atoi(v);
    }
    return -1;
}

static int profile_mode(int speak)
{
    const char *v = getenv(SPECS[HVS_PROFILE].name);
    const char *b, *e;
    if (!v) return HVPROF_PROFILE_OFF; /* only where asked for, however the library came */
    trim(v, &b, &e);
    if (b == e || in_words(b, e, OFF_WORDS)) return HVPROF_PROFILE_OFF;
    if (in_words(b, e, FULL_WORDS)) return (int)HVPROF_MODE_FULL;
    if (word_is(b, e, HVS_SUMMARY_WORD)) return (int)HVPROF_MODE_SUMMARY;
    static _Atomic int said;
    if (speak && hvprof_launcher_rank() <= 0 && !atomic_exchange(&said, 1))
        hvprof_warn("warning: HOROVOD_PROFILE='%.64s' " HVS_UNKNOWN_MODE, v);
    return HVPROF_PROFILE_OFF;
}

int hvprof_profile_mode(void) { return profile_mode(1); }
int hvprof_profile_mode_quiet(void) { return profile_mode(0); }

void hvprof_settings_check(void)
{
    static _Atomic int done;
    if (atomic_exchange(&done, 1)) return;
    for (int id = 0; id < HVS_COUNT; id++) {
        const spec *s = &SPECS[id];
        const char *v = hvprof_setting_text((hvprof_setting_id)id);
        double x;
        if (!v || s->kind == HVS_MODE || parse((hvprof_setting_id)id, v, &x) == 0) continue;
        if (s->shown[0])
            hvprof_warn("warning: ignoring %s='%.64s' (%s): using %s", s->name, v, s->takes,
                        s->shown);
        else
            hvprof_warn("warning: ignoring %s='%.64s' (%s)", s->name, v, s->takes);
    }
}

/* What the library makes of every setting, for tests/test_settings.py to
 * compare with Python's reading of the same table: {"NAME": value, ...}
 * (a switch 0/1, a choice its index, a number, a text its string or null;
 * HOROVOD_PROFILE: -1 off, 0 full, 1 summary).  Into a caller's buffer. */
size_t hvprof_settings_json(char *buf, size_t n)
{
    size_t used = 0;
#define PUT(...)                                                                  \
    do {                                                                          \
        int k_ = snprintf(buf + used, used < n ? n - used : 0, __VA_ARGS__);      \
        if (k_ > 0) used += (size_t)k_;                                           \
    } while (0)
    PUT("{");
    for (int id = 0; id < HVS_COUNT; id++) {
        const spec *s = &SPECS[id];
        PUT("%s\"%s\": ", id ? ", " : "", s->name);
        if (s->kind == HVS_MODE) {
            PUT("%d", hvprof_profile_mode_quiet());
        } else if (s->kind == HVS_TEXT) {
            const char *v = hvprof_setting_text((hvprof_setting_id)id);
            double x;
            if (!v || parse((hvprof_setting_id)id, v, &x) != 0) {
                PUT("null");
            } else {
                PUT("\"");
                for (const char *c = v; *c; c++) {
                    char ch = (unsigned char)*c < 32 ? '?' : *c;
                    if (ch == '"' || ch == '\\') PUT("\\%c", ch);
                    else PUT("%c", ch);
                }
                PUT("\"");
            }
        } else {
            PUT("%.17g", hvprof_setting_num((hvprof_setting_id)id));
        }
    }
    PUT("}");
#undef PUT
    return used;
}
