/*
 * core_layout.c -- the layout of the on-disk structs and enum tables, as
 * JSON, for the Python view's tests.  Calls nothing (core_internal.h has
 * the core's stack).
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>

#include "core_internal.h"

/* The layout of every on-disk struct and every enum table, generated from
 * the same definitions the writer uses, for the Python view's tests. */
HVPROF_EXPORT const char *hvprof_layout_json(void)
{
    static char buf[32768];
    static int done;
    if (done) return buf;
    size_t n = 0;
#define OUT(...) n += (size_t)snprintf(buf + n, sizeof buf - n, __VA_ARGS__)
#define FIELD(T, f) OUT("\"%s\": [%zu, %zu], ", #f, offsetof(T, f), sizeof(((T *)0)->f))
#define STRUCT_BEGIN(T, name) OUT("\"%s\": {\"size\": %zu, \"fields\": {", name, sizeof(T))
#define STRUCT_END() n -= 2, OUT("}}, ")
    OUT("{\"version\": %u, \"magic\": \"HVPROF\", \"chunk_magic\": %u, ", HVPROF_FORMAT_VERSION,
        HVPROF_CHUNK_MAGIC);
    STRUCT_BEGIN(hvprof_record, "record");
    FIELD(hvprof_record, t_start); FIELD(hvprof_record, t_end); FIELD(hvprof_record, bytes);
    FIELD(hvprof_record, count); FIELD(hvprof_record, seq); FIELD(hvprof_record, comm);
    FIELD(hvprof_record, track); FIELD(hvprof_record, root); FIELD(hvprof_record, op);
    FIELD(hvprof_record, dtype); FIELD(hvprof_record, redop); FIELD(hvprof_record, flags);
    FIELD(hvprof_record, rc); FIELD(hvprof_record, dtype_size); FIELD(hvprof_record, aux);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_chunk_header, "chunk_header");
    FIELD(hvprof_chunk_header, magic); FIELD(hvprof_chunk_header, track);
    FIELD(hvprof_chunk_header, nrec); FIELD(hvprof_chunk_header, index);
    FIELD(hvprof_chunk_header, reserved);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_comm_entry, "comm_entry");
    FIELD(hvprof_comm_entry, handle); FIELD(hvprof_comm_entry, id); FIELD(hvprof_comm_entry, size);
    FIELD(hvprof_comm_entry, rank); FIELD(hvprof_comm_entry, world_rank0);
    FIELD(hvprof_comm_entry, backend); FIELD(hvprof_comm_entry, valid);
    FIELD(hvprof_comm_entry, name);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_track_entry, "track_entry");
    FIELD(hvprof_track_entry, handle); FIELD(hvprof_track_entry, tid);
    FIELD(hvprof_track_entry, kind); FIELD(hvprof_track_entry, valid);
    FIELD(hvprof_track_entry, is_main); FIELD(hvprof_track_entry, device);
    FIELD(hvprof_track_entry, name); FIELD(hvprof_track_entry, caller);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_file_header, "file_header");
    FIELD(hvprof_file_header, magic); FIELD(hvprof_file_header, version);
    FIELD(hvprof_file_header, header_bytes); FIELD(hvprof_file_header, record_bytes);
    FIELD(hvprof_file_header, chunk_bytes); FIELD(hvprof_file_header, comm_table_offset);
    FIELD(hvprof_file_header, comm_table_capacity); FIELD(hvprof_file_header, track_table_offset);
    FIELD(hvprof_file_header, track_table_capacity); FIELD(hvprof_file_header, first_chunk_offset);
    FIELD(hvprof_file_header, rank); FIELD(hvprof_file_header, world_size);
    FIELD(hvprof_file_header, local_rank); FIELD(hvprof_file_header, pid);
    FIELD(hvprof_file_header, state); FIELD(hvprof_file_header, n_comms);
    FIELD(hvprof_file_header, n_tracks); FIELD(hvprof_file_header, thread_level);
    FIELD(hvprof_file_header, n_chunks); FIELD(hvprof_file_header, dropped_records);
    FIELD(hvprof_file_header, clock_kind); FIELD(hvprof_file_header, offset_method);
    FIELD(hvprof_file_header, ticks_per_ns); FIELD(hvprof_file_header, cal0_ticks);
    FIELD(hvprof_file_header, cal0_mono_ns); FIELD(hvprof_file_header, cal1_ticks);
    FIELD(hvprof_file_header, cal1_mono_ns); FIELD(hvprof_file_header, cal0_realtime_ns);
    FIELD(hvprof_file_header, offset_ns); FIELD(hvprof_file_header, offset_err_ns);
    FIELD(hvprof_file_header, init_start_ticks); FIELD(hvprof_file_header, init_end_ticks);
    FIELD(hvprof_file_header, finalize_ticks); FIELD(hvprof_file_header, job_id);
    FIELD(hvprof_file_header, hostname); FIELD(hvprof_file_header, mpi_version);
    FIELD(hvprof_file_header, job_t0_ns); FIELD(hvprof_file_header, mode);
    FIELD(hvprof_file_header, sampling); FIELD(hvprof_file_header, unsampled_calls);
    FIELD(hvprof_file_header, aggregated_calls); FIELD(hvprof_file_header, offset_at_ns);
    FIELD(hvprof_file_header, offset_end_ns); FIELD(hvprof_file_header, offset_end_err_ns);
    FIELD(hvprof_file_header, offset_end_at_ns); FIELD(hvprof_file_header, inflight_offset);
    FIELD(hvprof_file_header, inflight_capacity); FIELD(hvprof_file_header, call_cost_ns);
    FIELD(hvprof_file_header, helper_cpu_ns); FIELD(hvprof_file_header, self_converts);
    FIELD(hvprof_file_header, reserved);
    FIELD(hvprof_file_header, inflight);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_inflight_entry, "inflight_entry");
    FIELD(hvprof_inflight_entry, state); FIELD(hvprof_inflight_entry, op);
    FIELD(hvprof_inflight_entry, pad0); FIELD(hvprof_inflight_entry, comm);
    FIELD(hvprof_inflight_entry, t_start); FIELD(hvprof_inflight_entry, reserved);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_agg_header, "agg_header");
    FIELD(hvprof_agg_header, magic); FIELD(hvprof_agg_header, version);
    FIELD(hvprof_agg_header, entry_bytes); FIELD(hvprof_agg_header, n_entries);
    FIELD(hvprof_agg_header, rank); FIELD(hvprof_agg_header, buckets);
    FIELD(hvprof_agg_header, snapshot_ticks); FIELD(hvprof_agg_header, overflow_calls);
    FIELD(hvprof_agg_header, reserved);
    STRUCT_END();
    STRUCT_BEGIN(hvprof_agg_entry, "agg_entry");
    FIELD(hvprof_agg_entry, bytes); FIELD(hvprof_agg_entry, calls); FIELD(hvprof_agg_entry, sum_ticks);
    FIELD(hvprof_agg_entry, min_ticks); FIELD(hvprof_agg_entry, max_ticks);
    FIELD(hvprof_agg_entry, first_ticks); FIELD(hvprof_agg_entry, comm); FIELD(hvprof_agg_entry, track);
    FIELD(hvprof_agg_entry, op); FIELD(hvprof_agg_entry, dtype); FIELD(hvprof_agg_entry, redop);
    FIELD(hvprof_agg_entry, flags_or); FIELD(hvprof_agg_entry, errors); FIELD(hvprof_agg_entry, hist);
    STRUCT_END();
#define ENUM3(v, N, s, b) OUT("\"%d\": [\"%s\", \"%s\"], ", v, s, b);
#define ENUM2(v, N, s) OUT("\"%d\": \"%s\", ", (int)(v), s);
    OUT("\"ops\": {"); HVPROF_OPS(ENUM3) n -= 2; OUT("}, ");
    OUT("\"dtypes\": {"); HVPROF_DTYPES(ENUM2) n -= 2; OUT("}, ");
    OUT("\"redops\": {"); HVPROF_REDOPS(ENUM2) n -= 2; OUT("}, ");
    OUT("\"flags\": {"); HVPROF_FLAGS(ENUM2) n -= 2; OUT("}, ");
    OUT("\"modes\": {\"full\": %u, \"summary\": %u}, ", HVPROF_MODE_FULL, HVPROF_MODE_SUMMARY);
    OUT("\"states\": {\"open\": %u, \"mpi_init\": %u, \"finalized\": %u, \"closed\": %u, "
        "\"truncated\": %u}}",
        HVPROF_STATE_OPEN, HVPROF_STATE_MPI_INIT, HVPROF_STATE_FINALIZED, HVPROF_STATE_CLOSED,
        HVPROF_STATE_TRUNCATED);
#undef OUT
    done = 1;
    return buf;
}

