/*
 * hvprof_format.h -- the on-disk raw format of horovod-profiler, defined once.
 *
 * Every profiled process (one per MPI rank, or per launcher rank for NCCL-only
 * jobs) writes one raw file, <profile dir>/raw/rank-<RRRRR>.hvprof, while it
 * runs.  Its header, tables and in-flight table are memory-mapped
 * (MAP_SHARED): they are in the kernel's page cache the moment they are
 * stored.  Records are written into per-thread buffers and copied into their
 * chunks by the helper thread every HOROVOD_PROFILE_FLUSH_MS (core.c), so a
 * rank killed with SIGKILL loses at most that period's records; fatal
 * signals flush first.  Python reads it with profiler/_format.py, which is
 * checked against this header by tests/test_format.py (through the layout the
 * library itself reports with hvprof_layout_json()).
 *
 * File layout (all integers little-endian, native x86-64 / aarch64 layout):
 *
 *   [0, 4096)                       hvprof_file_header, whose last 2048 bytes
 *                                   are the in-flight table (inflight_offset):
 *                                   hvprof_inflight_entry x inflight_capacity
 *   [comm_table_offset, +64*N)      hvprof_comm_entry  x comm_table_capacity
 *   [track_table_offset, +64*N)     hvprof_track_entry x track_table_capacity
 *   [first_chunk_offset, ...)       chunks of chunk_bytes each
 *
 * A chunk belongs to one track (one thread): its first 64 bytes are an
 * hvprof_chunk_header, the rest are hvprof_record slots.  The records of a
 * chunk are written before its header's nrec, so a reader trusts the first
 * nrec slots; a chunk whose magic is 0 was never written (a hole).  Chunk
 * numbers come from an atomic counter in the file header.  A write that
 * fails (disk full, file gone) turns into counted drops
 * (header.dropped_records), never into an error for the application.
 *
 * Version history:
 *   1  first version.  (Compatible additions since: op APP_TENSOR, MPI
 *      records' aux = folded receive buffer; header call_cost_ns and
 *      helper_cpu_ns, from the reserved area; files written before carry 0;
 *      op NCCL_NET, an auxiliary record of the profiler-plugin path: one
 *      NCCL call's proxy (network) activity, see hvprof_record;
 *      point-to-point ops 16..23, flag FROM_STATUS, in-flight peer and tag;
      op APP_CPU, a thread's CPU and run-queue time per step, with the
      sidecar raw/rank-R.cpu.json; op APP_JOIN, the time in hvd.join;
      header self_converts, from the reserved area; ops 80..95, Horovod's
      Gloo collectives and controller (gloo.c), dtypes INT16 and UINT16, comm
      backend 2 = Gloo.)
 */
#ifndef HVPROF_FORMAT_H
#define HVPROF_FORMAT_H

#include <stdint.h>

#define HVPROF_MAGIC "HVPROF\0\0"          /* 8 bytes, NULs included */
#define HVPROF_CHUNK_MAGIC 0x4b434f52u      /* "ROCK" little-endian: a chunk */
#define HVPROF_FORMAT_VERSION 1u
#define HVPROF_HEADER_BYTES 4096u
#define HVPROF_RECORD_BYTES 64u
#define HVPROF_COMM_TABLE_CAPACITY 1024u
#define HVPROF_TRACK_TABLE_CAPACITY 1024u
#define HVPROF_DEFAULT_CHUNK_BYTES (1u << 18) /* 4095 records per chunk */

/* ---------------------------------------------------------------------------
 * Collectives.  X(value, NAME, "name", "backend")
 * Values are part of the format: append only, never renumber.
 * 16..23 are MPI point-to-point calls (see hvprof_record for their fields):
 * SEND/ISEND/SENDRECV carry what this rank sends, RECV/IRECV/SENDRECV_RECV
 * what it receives (MPI_Sendrecv and MPI_Sendrecv_replace make two records
 * with the same times: SENDRECV, the send half, then SENDRECV_RECV), PROBE
 * and IPROBE (only an MPI_Iprobe that found a message is recorded) the
 * message found; none of them takes a per-communicator sequence number.
 * 80..84 are the collectives Horovod's Gloo ops run (gloo.c: one record per
 * gloo collective, bytes as MPI's allreduce, bcast, allgatherv, alltoallv and
 * reduce_scatter count them); 88..95 Horovod's Gloo controller (its
 * negotiation and set-up: kind control): bitand/bitor = the response-cache
 * bit vector (count = words), ctl_bcast = a control broadcast, splits =
 * the alltoall splits exchange, allgather_ints = process-set bookkeeping,
 * ready = the gather of requests to the coordinator (Recv/SendReadyTensors),
 * final = its broadcast of responses (Recv/SendFinalTensors): root 0, one
 * op on both sides, so that (comm, seq) matches; they move serialized lists
 * whose bytes are not seen: 0.
 * ------------------------------------------------------------------------- */
#define HVPROF_OPS(X)                                                      \
    X(0,  NONE,                 "none",                 "none")            \
    X(1,  MPI_ALLREDUCE,        "allreduce",            "mpi")             \
    X(2,  MPI_IALLREDUCE,       "iallreduce",           "mpi")             \
    X(3,  MPI_REDUCE,           "reduce",               "mpi")             \
    X(4,  MPI_BCAST,            "bcast",                "mpi")             \
    X(5,  MPI_ALLGATHER,        "allgather",            "mpi")             \
    X(6,  MPI_ALLGATHERV,       "allgatherv",           "mpi")             \
    X(7,  MPI_GATHER,           "gather",               "mpi")             \
    X(8,  MPI_GATHERV,          "gatherv",              "mpi")             \
    X(9,  MPI_ALLTOALL,         "alltoall",             "mpi")             \
    X(10, MPI_ALLTOALLV,        "alltoallv",            "mpi")             \
    X(11, MPI_REDUCE_SCATTER,   "reduce_scatter",       "mpi")             \
    X(12, MPI_REDUCE_SCATTER_BLOCK, "reduce_scatter_block", "mpi")         \
    X(13, MPI_BARRIER,          "barrier",              "mpi")             \
    X(14, MPI_INIT,             "init",                 "mpi")             \
    X(15, MPI_FINALIZE,         "finalize",             "mpi")             \
    X(16, MPI_SEND,             "send",                 "mpi")             \
    X(17, MPI_RECV,             "recv",                 "mpi")             \
    X(18, MPI_ISEND,            "isend",                "mpi")             \
    X(19, MPI_IRECV,            "irecv",                "mpi")             \
    X(20, MPI_SENDRECV,         "sendrecv",             "mpi")             \
    X(21, MPI_SENDRECV_RECV,    "sendrecv_recv",        "mpi")             \
    X(22, MPI_PROBE,            "probe",                "mpi")             \
    X(23, MPI_IPROBE,           "iprobe",               "mpi")             \
    X(32, APP_STEP,             "step",                 "app")             \
    X(33, APP_MARK,             "mark",                 "app")             \
    X(34, APP_SYNC,             "sync",                 "app")             \
    X(35, APP_TENSOR,           "tensor",               "app")             \
    X(36, APP_CPU,              "cpu",                  "app")             \
    X(37, APP_JOIN,             "join",                 "app")             \
    X(64, NCCL_ALLREDUCE,       "nccl_allreduce",       "nccl")            \
    X(65, NCCL_REDUCESCATTER,   "nccl_reducescatter",   "nccl")            \
    X(66, NCCL_ALLGATHER,       "nccl_allgather",       "nccl")            \
    X(67, NCCL_BROADCAST,       "nccl_broadcast",       "nccl")            \
    X(68, NCCL_BCAST,           "nccl_bcast",           "nccl")            \
    X(69, NCCL_REDUCE,          "nccl_reduce",          "nccl")            \
    X(70, NCCL_SEND,            "nccl_send",            "nccl")            \
    X(71, NCCL_RECV,            "nccl_recv",            "nccl")            \
    X(72, NCCL_GROUP,           "nccl_group",           "nccl")            \
    X(73, NCCL_NET,             "nccl_net",             "nccl")            \
    X(80, GLOO_ALLREDUCE,       "gloo_allreduce",       "gloo")            \
    X(81, GLOO_ALLGATHER,       "gloo_allgather",       "gloo")            \
    X(82, GLOO_BROADCAST,       "gloo_broadcast",       "gloo")            \
    X(83, GLOO_ALLTOALL,        "gloo_alltoall",        "gloo")            \
    X(84, GLOO_REDUCESCATTER,   "gloo_reducescatter",   "gloo")            \
    X(88, GLOO_BITAND,          "gloo_bitand",          "gloo")            \
    X(89, GLOO_BITOR,           "gloo_bitor",           "gloo")            \
    X(90, GLOO_CTL_BCAST,       "gloo_ctl_bcast",       "gloo")            \
    X(91, GLOO_BARRIER,         "gloo_barrier",         "gloo")            \
    X(92, GLOO_SPLITS,          "gloo_splits",          "gloo")            \
    X(93, GLOO_ALLGATHER_INTS,  "gloo_allgather_ints",  "gloo")            \
    X(94, GLOO_READY,           "gloo_ready",           "gloo")            \
    X(95, GLOO_FINAL,           "gloo_final",           "gloo")

enum hvprof_op {
#define HVPROF_X(v, N, s, b) HVPROF_OP_##N = v,
    HVPROF_OPS(HVPROF_X)
#undef HVPROF_X
};

/* ---------------------------------------------------------------------------
 * Datatypes.  X(value, NAME, "name")  -- MPI predefined types and NCCL types.
 * Bytes always come from MPI_Type_size / the NCCL type size, stored per record
 * (dtype_size), never from this table.  DERIVED: a user-defined MPI type
 * (Horovod's float16 is one).  Gloo records use the NCCL codes (bool as
 * ncclUint8, as tensor records do) and INT16/UINT16, which NCCL lacks.
 * ------------------------------------------------------------------------- */
#define HVPROF_DTYPES(X)                                                   \
    X(0,  UNKNOWN,            "unknown")                                   \
    X(1,  DERIVED,            "derived")                                   \
    X(2,  MPI_BYTE,           "MPI_BYTE")                                  \
    X(3,  MPI_CHAR,           "MPI_CHAR")                                  \
    X(4,  MPI_SIGNED_CHAR,    "MPI_SIGNED_CHAR")                           \
    X(5,  MPI_UNSIGNED_CHAR,  "MPI_UNSIGNED_CHAR")                         \
    X(6,  MPI_SHORT,          "MPI_SHORT")                                 \
    X(7,  MPI_UNSIGNED_SHORT, "MPI_UNSIGNED_SHORT")                        \
    X(8,  MPI_INT,            "MPI_INT")                                   \
    X(9,  MPI_UNSIGNED,       "MPI_UNSIGNED")                              \
    X(10, MPI_LONG,           "MPI_LONG")                                  \
    X(11, MPI_UNSIGNED_LONG,  "MPI_UNSIGNED_LONG")                         \
    X(12, MPI_LONG_LONG_INT,  "MPI_LONG_LONG_INT")                         \
    X(13, MPI_UNSIGNED_LONG_LONG, "MPI_UNSIGNED_LONG_LONG")                \
    X(14, MPI_FLOAT,          "MPI_FLOAT")                                 \
    X(15, MPI_DOUBLE,         "MPI_DOUBLE")                                \
    X(16, MPI_LONG_DOUBLE,    "MPI_LONG_DOUBLE")                           \
    X(17, MPI_C_BOOL,         "MPI_C_BOOL")                                \
    X(18, MPI_INT8_T,         "MPI_INT8_T")                                \
    X(19, MPI_INT16_T,        "MPI_INT16_T")                               \
    X(20, MPI_INT32_T,        "MPI_INT32_T")                               \
    X(21, MPI_INT64_T,        "MPI_INT64_T")                               \
    X(22, MPI_UINT8_T,        "MPI_UINT8_T")                               \
    X(23, MPI_UINT16_T,       "MPI_UINT16_T")                              \
    X(24, MPI_UINT32_T,       "MPI_UINT32_T")                              \
    X(25, MPI_UINT64_T,       "MPI_UINT64_T")                              \
    X(26, MPI_C_FLOAT_COMPLEX,  "MPI_C_FLOAT_COMPLEX")                     \
    X(27, MPI_C_DOUBLE_COMPLEX, "MPI_C_DOUBLE_COMPLEX")                    \
    X(28, MPI_FLOAT_INT,      "MPI_FLOAT_INT")                             \
    X(29, MPI_DOUBLE_INT,     "MPI_DOUBLE_INT")                            \
    X(30, MPI_LONG_INT,       "MPI_LONG_INT")                              \
    X(31, MPI_2INT,           "MPI_2INT")                                  \
    X(32, MPI_WCHAR,          "MPI_WCHAR")                                 \
    X(33, MPI_PACKED,         "MPI_PACKED")                                \
    X(64, NCCL_INT8,          "ncclInt8")                                  \
    X(65, NCCL_UINT8,         "ncclUint8")                                 \
    X(66, NCCL_INT32,         "ncclInt32")                                 \
    X(67, NCCL_UINT32,        "ncclUint32")                                \
    X(68, NCCL_INT64,         "ncclInt64")                                 \
    X(69, NCCL_UINT64,        "ncclUint64")                                \
    X(70, NCCL_FLOAT16,       "ncclFloat16")                               \
    X(71, NCCL_FLOAT32,       "ncclFloat32")                               \
    X(72, NCCL_FLOAT64,       "ncclFloat64")                               \
    X(73, NCCL_BFLOAT16,      "ncclBfloat16")                              \
    X(74, NCCL_FLOAT8E4M3,    "ncclFloat8e4m3")                            \
    X(75, NCCL_FLOAT8E5M2,    "ncclFloat8e5m2")                            \
    X(76, INT16,              "int16")                                     \
    X(77, UINT16,             "uint16")

enum hvprof_dtype {
#define HVPROF_X(v, N, s) HVPROF_DT_##N = v,
    HVPROF_DTYPES(HVPROF_X)
#undef HVPROF_X
};

/* Reduction operators.  X(value, NAME, "name"). USER: a user-defined op
 * (Horovod's float16 sum is one). */
#define HVPROF_REDOPS(X)                                                   \
    X(0,  NONE,      "none")                                               \
    X(1,  SUM,       "sum")                                                \
    X(2,  PROD,      "prod")                                               \
    X(3,  MIN,       "min")                                                \
    X(4,  MAX,       "max")                                                \
    X(5,  LAND,      "land")                                               \
    X(6,  BAND,      "band")                                               \
    X(7,  LOR,       "lor")                                                \
    X(8,  BOR,       "bor")                                                \
    X(9,  LXOR,      "lxor")                                               \
    X(10, BXOR,      "bxor")                                               \
    X(11, MINLOC,    "minloc")                                             \
    X(12, MAXLOC,    "maxloc")                                             \
    X(13, REPLACE,   "replace")                                            \
    X(14, NO_OP,     "no_op")                                              \
    X(15, AVG,       "avg")                                                \
    X(16, PREMULSUM, "premulsum")                                          \
    X(255, USER,     "user")

enum hvprof_redop {
#define HVPROF_X(v, N, s) HVPROF_REDOP_##N = v,
    HVPROF_REDOPS(HVPROF_X)
#undef HVPROF_X
};

/* Record flags.  X(bit value, NAME, "name") */
#define HVPROF_FLAGS(X)                                                    \
    X(0x0001, IN_PLACE,      "in_place")     /* MPI_IN_PLACE send buffer */  \
    X(0x0002, ERROR,         "error")        /* rc != success */             \
    X(0x0004, NONBLOCKING,   "nonblocking")  /* t_end = completion seen */   \
    X(0x0008, DEVICE,        "device")       /* interval on a device stream*/\
    X(0x0010, GROUPED,       "grouped")      /* issued inside ncclGroup */   \
    X(0x0020, DERIVED_TYPE,  "derived_type") /* non-predefined datatype */   \
    X(0x0040, NO_COMPLETION, "no_completion")/* request never completed */   \
    X(0x0080, DEVICE_PENDING,"device_pending")/* device time not collected */\
    X(0x0100, FROM_STATUS,   "from_status")  /* p2p: from the MPI_Status */

enum hvprof_flag {
#define HVPROF_X(v, N, s) HVPROF_FLAG_##N = v,
    HVPROF_FLAGS(HVPROF_X)
#undef HVPROF_X
};

/* APP_TENSOR flags bits 12-15: the operation of a tensor whose name does not
 * say it (profiler.formats.record.TENSOR_OPS mirrors these). */
#define HVPROF_TENSOR_OP_SHIFT 12
#define HVPROF_TENSOR_OP_ALLREDUCE 1
#define HVPROF_TENSOR_OP_ALLGATHER 2
#define HVPROF_TENSOR_OP_BROADCAST 3
#define HVPROF_TENSOR_OP_ALLTOALL 4
#define HVPROF_TENSOR_OP_REDUCESCATTER 5

/* ---------------------------------------------------------------------------
 * One call = one record, 64 bytes.  Times are raw clock ticks of this rank
 * (see hvprof_file_header.clock_*): the reader converts them to nanoseconds
 * and applies the rank's offset so that all ranks share rank 0's time axis.
 * ------------------------------------------------------------------------- */
typedef struct hvprof_record {
    uint64_t t_start;    /*  0 ticks at entry (DEVICE: event before the op)  */
    uint64_t t_end;      /*  8 ticks at return / completion / device end     */
    uint64_t bytes;      /* 16 payload bytes this rank sends: count*type size;
                                v-variants: sum of counts * type size;
                                in-place: the same bytes as the buffer       */
    uint64_t count;      /* 24 elements (v-variants: sum of counts)          */
    uint32_t seq;        /* 32 per-communicator call number, from 0; equal on
                                every rank for the same collective call      */
    uint32_t comm;       /* 36 index into this file's communicator table     */
    uint32_t track;      /* 40 index into this file's track table (thread or
                                device stream)                               */
    int32_t  root;       /* 44 root rank in comm (NCCL send/recv: peer), -1  */
    uint16_t op;         /* 48 enum hvprof_op                                */
    uint8_t  dtype;      /* 50 enum hvprof_dtype                             */
    uint8_t  redop;      /* 51 enum hvprof_redop                             */
    uint16_t flags;      /* 52 enum hvprof_flag bits                         */
    int16_t  rc;         /* 54 return code, saturated to int16               */
    uint32_t dtype_size; /* 56 bytes per element (MPI_Type_size)             */
    uint32_t aux;        /* 60 MPI: the receive buffer's address as passed
                                (Bcast: the buffer), folded to 32 bits by
                                hvprof_fold_ptr; NCCL: group number (0 =
                                none); DEVICE records: track of the host
                                thread that issued it; Gloo: the buffer
                                folded (allgather, alltoall: the output;
                                controller records: 0), root = broadcast
                                root, else -1; comm = the process set's
                                Gloo context (data) or its controller.
                                APP_STEP: count = images in the step, seq =
                                step number; APP_MARK: seq = user mark id;
                                APP_SYNC: the time in hvd.DistributedOptimizer
                                .synchronize in that step (.step without
                                it: the whole .step; seq = step number);
                                bytes = the thread's ns on a CPU in it,
                                count = its ns waiting on a run queue
                                (schedstat; both 0 when not read).
                                APP_TENSOR (a tensor handed to Horovod, from
                                its Python entry point): t_start/t_end around
                                the enqueue, bytes and count of the tensor,
                                seq = the tensor's name id in the rank's
                                names file (rank-R.tensors), root = broadcast
                                root or -1, dtype (NCCL codes), dtype_size,
                                redop (Horovod's op), rc = process set id,
                                aux = hvprof_fold_ptr(the buffer of the call
                                that carries it alone: the output's, or
                                for TensorFlow's kernels, recorded where the
                                kernel reads its input, a broadcast root's
                                input; 0 when not known), flags bits 12-15 = the
                                operation (HVPROF_TENSOR_OP_*) when the
                                name does not start with it (TensorFlow's
                                node names), else 0.
                                APP_JOIN: the time in hvd.join (Horovod's
                                uneven-data barrier: a rank whose data ran
                                out waits there, its Horovod thread adding
                                zeros to the others' collectives):
                                t_start/t_end = entering and leaving it,
                                count = the rank it returned (the last rank
                                to join), seq = the step records this rank
                                had written when it entered (its last
                                step's number + 1).
                                APP_CPU (not a call: one thread's CPU
                                accounting over one step, cpu.c): written
                                right after each APP_STEP record, one per
                                thread track still alive, from the kernel's
                                /proc/self/task/<tid>/schedstat; t_start =
                                ticks of that thread's previous read (the
                                track's creation, a step's opening,
                                hvprof_cpu_baseline, or the previous step
                                record), t_end = ticks of this read; bytes =
                                ns the thread ran on a CPU in the interval,
                                count = ns it waited on a run queue for a
                                CPU, dtype_size = timeslices (times it was
                                scheduled onto a CPU), seq = the step number
                                of the APP_STEP record just written, track =
                                the MEASURED thread's track (the record sits
                                in the stepping thread's chunk), comm =
                                UINT32_MAX, root = -1, dtype/redop/flags/rc/
                                aux = 0.  The kernel's figures are those it
                                last accounted: a running thread's CPU time
                                up to one scheduler tick old, a wait still in
                                progress counted when it ends.
                                NCCL_NET (auxiliary, not a call: the network
                                activity of the NCCL call with the same comm
                                and seq, summed from NCCL's ProxyOp/ProxyStep
                                events by the plugin path): t_start/t_end =
                                first proxy event's start .. last one's stop
                                (host ticks), bytes = bytes sent, count =
                                bytes received, root = proxy steps,
                                dtype_size = proxy ops, aux = network-plugin
                                events.  Readers fold it into the call's row
                                (net_* columns) and drop it.
                                MPI point-to-point (ops 16..23): root = the
                                peer, as a rank of `comm` (the destination of
                                a send, the source of a receive or probe; of
                                the remote group on an intercommunicator),
                                or HVPROF_PEER_PROC_NULL, or
                                HVPROF_PEER_ANY_SOURCE (a receive whose
                                source is unknown: never completed);
                                seq = the tag (int32 bits; HVPROF_TAG_ANY
                                for MPI_ANY_TAG not resolved, or the tag of a
                                receive from MPI_PROC_NULL): the collective
                                sequence is not advanced; bytes/count: a
                                send's count x type size (0 to
                                MPI_PROC_NULL); a receive/probe with
                                FROM_STATUS: what arrived (MPI_Get_count of
                                its status, in bytes; count = bytes / type
                                size) and root/seq the status's source and
                                tag; without FROM_STATUS (a receive never
                                completed): the posted count x type size and
                                source/tag as posted.  Nonblocking (ISEND,
                                IRECV: NONBLOCKING): t_start at the post,
                                t_end at the completion seen (MPI_Wait...,
                                MPI_Test...), NO_COMPLETION when never seen.
                                aux = hvprof_fold_ptr(buffer).               */
} hvprof_record;

/* Peers of point-to-point records (hvprof_record.root): MPI's own values
 * differ between implementations (Open MPI: MPI_PROC_NULL -2, MPI_ANY_SOURCE
 * -1; MPICH: -1 and -2), the format's do not. */
#define HVPROF_PEER_PROC_NULL (-2)
#define HVPROF_PEER_ANY_SOURCE (-3)
#define HVPROF_TAG_ANY (-1)

/* First 64 bytes of every chunk. */
typedef struct hvprof_chunk_header {
    uint32_t magic;      /*  0 HVPROF_CHUNK_MAGIC                            */
    uint32_t track;      /*  4 track (thread) that owns this chunk           */
    uint64_t nrec;       /*  8 records published (release-stored per record) */
    uint64_t index;      /* 16 chunk number in the file (0, 1, ...)          */
    uint64_t reserved[5];/* 24 zero                                          */
} hvprof_chunk_header;

/* Communicator table entry: written once when a communicator is first seen
 * (creation wrappers or first use); valid when `valid` is 1. */
typedef struct hvprof_comm_entry {
    uint64_t handle;     /*  0 the handle value in this process (for debug)  */
    uint64_t id;         /*  8 stable id: equal on every member rank         */
    int32_t  size;       /* 16 number of ranks                               */
    int32_t  rank;       /* 20 this process's rank in it                     */
    int32_t  world_rank0;/* 24 world rank of the comm's rank 0               */
    uint16_t backend;    /* 28 0 = MPI, 1 = NCCL, 2 = Gloo                   */
    uint16_t valid;      /* 30 1 once the entry is complete                  */
    char     name[32];   /* 32 MPI_Comm_get_name or "nccl", NUL-terminated   */
} hvprof_comm_entry;

/* Track table entry: one per thread that recorded, or per device stream. */
typedef struct hvprof_track_entry {
    uint64_t handle;     /*  0 pthread_self() or cudaStream_t                */
    int32_t  tid;        /*  8 OS thread id (gettid), -1 for a stream        */
    uint16_t kind;       /* 12 1 = thread, 2 = device stream                 */
    uint16_t valid;      /* 14 1 once complete                               */
    int32_t  is_main;    /* 16 1 if tid == pid                               */
    int32_t  device;     /* 20 CUDA device for a stream, -1 otherwise        */
    char     name[16];   /* 24 thread name (/proc comm) at first record      */
    char     caller[24]; /* 40 basename of the shared object whose code made
                                this thread's first call (e.g. "mpi_lib...") */
} hvprof_track_entry;

/* The flight recorder: each thread's collective while it is in progress,
 * stored in the mmapped header before the call and cleared after it, so that
 * the raw file of a rank that hangs, or was killed with SIGKILL, shows what it
 * is blocked in.  Entry i belongs to track i; tracks beyond the capacity are
 * not covered.  The communicator is its handle (the comm table's `handle`),
 * the sequence number is the reader's: the thread's last completed call on
 * that communicator, plus one. */
#define HVPROF_INFLIGHT_OFFSET 2048u
#define HVPROF_INFLIGHT_CAPACITY 32u
typedef struct hvprof_inflight_entry {
    uint32_t state;      /*  0 1 while the call is in progress, 0 otherwise  */
    uint16_t op;         /*  4 HVPROF_OP_*                                   */
    uint16_t pad0;       /*  6 zero                                          */
    uint64_t comm;       /*  8 communicator handle                           */
    uint64_t t_start;    /* 16 ticks at entry                                */
    int32_t  peer;       /* 24 point-to-point ops: the peer and the tag as
                                posted (hvprof_record's root and seq); other
                                ops: whatever the thread's last p2p call left */
    int32_t  tag;        /* 28                                               */
    char     reserved[32]; /* 32 zero                                        */
} hvprof_inflight_entry;

/* The file header: the first 4096 bytes.  Fields written at open are
 * final; fields marked (live) are updated while the job runs. */
typedef struct hvprof_file_header {
    char     magic[8];             /*    0 HVPROF_MAGIC                      */
    uint32_t version;              /*    8 HVPROF_FORMAT_VERSION             */
    uint32_t header_bytes;         /*   12 4096                              */
    uint32_t record_bytes;         /*   16 64                                */
    uint32_t chunk_bytes;          /*   20 bytes per chunk (header incl.)    */
    uint32_t comm_table_offset;    /*   24                                   */
    uint32_t comm_table_capacity;  /*   28                                   */
    uint32_t track_table_offset;   /*   32                                   */
    uint32_t track_table_capacity; /*   36                                   */
    uint64_t first_chunk_offset;   /*   40                                   */
    int32_t  rank;                 /*   48 world rank                        */
    int32_t  world_size;           /*   52                                   */
    int32_t  local_rank;           /*   56 -1 if unknown                     */
    int32_t  pid;                  /*   60                                   */
    uint32_t state;                /*   64 (live) HVPROF_STATE_* bits        */
    uint32_t n_comms;              /*   68 (live) comm entries used          */
    uint32_t n_tracks;             /*   72 (live) track entries used         */
    int32_t  thread_level;         /*   76 MPI thread level provided, -1     */
    uint64_t n_chunks;             /*   80 (live) chunks allocated           */
    uint64_t dropped_records;      /*   88 (live) records lost (no chunk)    */
    uint32_t clock_kind;           /*   96 1 = TSC ticks, 2 = CLOCK_MONOTONIC
                                           nanoseconds (ticks == ns)         */
    uint32_t offset_method;        /*  100 0: one host, one clock (offset 0);
                                           1: each host's leader ping-pongs rank
                                           0, its ranks share the result      */
    double   ticks_per_ns;         /*  104 start-up calibration              */
    int64_t  cal0_ticks;           /*  112 calibration pair at start         */
    int64_t  cal0_mono_ns;         /*  120 CLOCK_MONOTONIC at cal0_ticks     */
    int64_t  cal1_ticks;           /*  128 (live) latest calibration pair    */
    int64_t  cal1_mono_ns;         /*  136 (live)                            */
    int64_t  cal0_realtime_ns;     /*  144 CLOCK_REALTIME at cal0 (wall time)*/
    int64_t  offset_ns;            /*  152 this rank's CLOCK_MONOTONIC minus
                                           rank 0's at the same instant      */
    int64_t  offset_err_ns;        /*  160 bound on |error| (half best RTT)  */
    int64_t  init_start_ticks;     /*  168 MPI_Init entry                    */
    int64_t  init_end_ticks;       /*  176 MPI_Init return                   */
    int64_t  finalize_ticks;       /*  184 (live) MPI_Finalize entry, 0      */
    uint64_t job_id;               /*  192 same on every rank of one job     */
    char     hostname[64];         /*  200                                   */
    char     mpi_version[256];     /*  264 MPI_Get_library_version, cut      */
    int64_t  job_t0_ns;            /*  520 rank 0's CLOCK_MONOTONIC when its
                                           MPI_Init returned (rank 0's axis):
                                           time zero of the job              */
    uint32_t mode;                 /*  528 HVPROF_MODE_*                     */
    uint32_t sampling;             /*  532 (live) 1 recording, 0 paused by
                                           sampling (HOROVOD_PROFILE_WINDOW,
                                           hvprof_set_sampling)              */
    uint64_t unsampled_calls;      /*  536 (live) calls seen while paused:
                                           neither recorded nor lost         */
    uint64_t aggregated_calls;     /*  544 (live) calls folded into the
                                           summary-mode aggregates           */
    int64_t  offset_at_ns;         /*  552 this rank's CLOCK_MONOTONIC when
                                           offset_ns was measured (0: unknown)*/
    int64_t  offset_end_ns;        /*  560 the offset measured again at
                                           MPI_Finalize (several hosts): the
                                           reader interpolates between them  */
    int64_t  offset_end_err_ns;    /*  568 its error bound                   */
    int64_t  offset_end_at_ns;     /*  576 this rank's CLOCK_MONOTONIC then
                                           (0: not measured again)           */
    uint32_t inflight_offset;      /*  584 the in-flight table inside this
                                           header (0: a file without one)    */
    uint32_t inflight_capacity;    /*  588 entries (threads by track index) */
    double   call_cost_ns;         /*  592 the profiler's own cost per
                                           recorded call on the calling
                                           thread, calibrated at MPI_Init
                                           (mpi.c: calibrate_call_cost); the
                                           helper thread's work is not in it
                                           (helper_cpu_ns).  0: not
                                           calibrated (no MPI_Init, a clock
                                           other than the TSC)              */
    int64_t  helper_cpu_ns;        /*  600 (live) CPU time of the helper
                                           (flush) thread so far, from
                                           CLOCK_THREAD_CPUTIME_ID at each of
                                           its wake-ups and at close.  0: no
                                           helper thread                     */
    uint32_t self_converts;        /*  608 1: the rank converts this file
                                           itself at exit (a Python runtime,
                                           hvprof_set_python): the exit merge
                                           waits for its dataset.  0: the
                                           exit merge converts it once closed */
    char     reserved[HVPROF_INFLIGHT_OFFSET - 612]; /* 612 zero            */
    /* 2048: the in-flight table (hvprof_inflight_entry x capacity)          */
    char     inflight[HVPROF_HEADER_BYTES - HVPROF_INFLIGHT_OFFSET];
} hvprof_file_header;

#define HVPROF_MODE_FULL    0u  /* one record per call                     */
#define HVPROF_MODE_SUMMARY 1u  /* HOROVOD_PROFILE=summary: per-(op, comm,
                                   size, ...) aggregates in rank-R.agg;
                                   app records (steps) still per call      */

/* ---------------------------------------------------------------------------
 * Summary mode: <profile dir>/raw/rank-<RRRRR>.agg, rewritten whole (a
 * snapshot) about once a second and at exit: an hvprof_agg_header, then
 * n_entries hvprof_agg_entry.  One entry per (thread, op, communicator,
 * message bytes, datatype, reduction op).  Latency histogram: bucket b
 * counts durations d (ticks) with HVPROF_AGG_BUCKET(d) == b: 4 buckets per
 * power of two, i.e. for d >= 4, b = 4 * (floor(log2 d) - 1) + the two bits
 * after the leading one; d < 4 goes to bucket d.
 * ------------------------------------------------------------------------- */
#define HVPROF_AGG_MAGIC "HVPAGG\0\0"
#define HVPROF_AGG_BUCKETS 160u

typedef struct hvprof_agg_header {
    char     magic[8];       /*  0 HVPROF_AGG_MAGIC                          */
    uint32_t version;        /*  8 HVPROF_FORMAT_VERSION                     */
    uint32_t entry_bytes;    /* 12 sizeof(hvprof_agg_entry)                  */
    uint64_t n_entries;      /* 16                                           */
    int32_t  rank;           /* 24                                           */
    uint32_t buckets;        /* 28 HVPROF_AGG_BUCKETS                        */
    uint64_t snapshot_ticks; /* 32 when this snapshot was taken              */
    uint64_t overflow_calls; /* 40 calls with no free table entry (counted
                                   only here)                               */
    uint64_t reserved[2];    /* 48                                           */
} hvprof_agg_header;

typedef struct hvprof_agg_entry {
    uint64_t bytes;          /*  0 message bytes (as in hvprof_record)       */
    uint64_t calls;          /*  8                                           */
    uint64_t sum_ticks;      /* 16 total duration                            */
    uint64_t min_ticks;      /* 24                                           */
    uint64_t max_ticks;      /* 32                                           */
    uint64_t first_ticks;    /* 40 start of the first call                   */
    uint32_t comm;           /* 48 comm table index                          */
    uint32_t track;          /* 52 track table index                         */
    uint16_t op;             /* 56                                           */
    uint8_t  dtype;          /* 58                                           */
    uint8_t  redop;          /* 59                                           */
    uint16_t flags_or;       /* 60 OR of the calls' flags                    */
    uint16_t errors;         /* 62 calls with rc != 0 (saturating)           */
    uint32_t hist[HVPROF_AGG_BUCKETS]; /* 64 duration histogram (ticks)      */
} hvprof_agg_entry;

/* A buffer address in 32 bits (low half XOR high half): MPI records keep
 * the receive buffer this way, APP_TENSOR records the tensor's output, so
 * that a call can be matched to the tensor whose memory it used. */
static inline uint32_t hvprof_fold_ptr(const void *p)
{
    uint64_t v = (uint64_t)(uintptr_t)p;
    return (uint32_t)(v ^ (v >> 32));
}

static inline uint32_t hvprof_agg_bucket(uint64_t d)
{
    if (d < 4) return (uint32_t)d;
    uint32_t lg = 63u - (uint32_t)__builtin_clzll(d); /* >= 2 */
    uint32_t b = 4u * (lg - 1u) + (uint32_t)((d >> (lg - 2u)) & 3u);
    return b < HVPROF_AGG_BUCKETS ? b : HVPROF_AGG_BUCKETS - 1u;
}

#define HVPROF_STATE_OPEN       0x1u  /* file created, header written        */
#define HVPROF_STATE_MPI_INIT   0x2u  /* MPI_Init done, rank fields final     */
#define HVPROF_STATE_FINALIZED  0x4u  /* MPI_Finalize reached, all flushed    */
#define HVPROF_STATE_CLOSED     0x8u  /* process exited cleanly               */
#define HVPROF_STATE_TRUNCATED  0x10u /* drops happened (disk full / error)   */

#ifdef __cplusplus
#define HVPROF_STATIC_ASSERT static_assert
#else
#define HVPROF_STATIC_ASSERT _Static_assert
#endif
HVPROF_STATIC_ASSERT(sizeof(hvprof_record) == HVPROF_RECORD_BYTES, "record size");
HVPROF_STATIC_ASSERT(sizeof(hvprof_chunk_header) == HVPROF_RECORD_BYTES, "chunk header");
HVPROF_STATIC_ASSERT(sizeof(hvprof_comm_entry) == 64, "comm entry");
HVPROF_STATIC_ASSERT(sizeof(hvprof_track_entry) == 64, "track entry");
HVPROF_STATIC_ASSERT(sizeof(hvprof_file_header) == HVPROF_HEADER_BYTES, "header");
HVPROF_STATIC_ASSERT(sizeof(hvprof_inflight_entry) == 64, "in-flight entry");
HVPROF_STATIC_ASSERT(HVPROF_INFLIGHT_OFFSET + 64 * HVPROF_INFLIGHT_CAPACITY == HVPROF_HEADER_BYTES,
                     "in-flight table fills the header's end");
HVPROF_STATIC_ASSERT(sizeof(hvprof_agg_header) == 64, "agg header");
HVPROF_STATIC_ASSERT(sizeof(hvprof_agg_entry) == 64 + 4 * HVPROF_AGG_BUCKETS, "agg entry");

#endif /* HVPROF_FORMAT_H */
