/*
 * hotpath.c -- cases for the wrappers' fast path (tests/test_hot_path.py).
 *
 *   hotpath loop N      N MPI_Allreduce of 8 bytes (MPI_FLOAT, MPI_SUM)
 *   hotpath types N     N rounds: a contiguous derived type of k bytes (k
 *                       cycling 2, 6, 4), committed, used by MPI_Bcast (count
 *                       3), then freed: a freed handle comes back for a type
 *                       of another size; then N such rounds with MPI_Allreduce
 *                       and a user-defined op.  Rank 0 prints "reused R"
 *                       (rounds whose handle equals the previous round's).
 *   hotpath nested N    N MPI_Allreduce with a user-defined op that calls
 *                       MPI_Barrier(MPI_COMM_SELF) each time it runs: a call
 *                       made inside a call.  Each rank prints "op_calls R C".
 *   hotpath abandon N   one MPI_Allreduce as in loop (the thread's cache now
 *                       holds its handles), one with count -1 whose error
 *                       handler longjmps out of the call (it never returns),
 *                       then N more as in loop.
 */
#include <mpi.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int op_calls;

static void sum_bytes(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    int size = 0;
    MPI_Type_size(*dt, &size);
    for (int i = 0; i < *len * size; i++) ((unsigned char *)inout)[i] += ((unsigned char *)in)[i];
}

static void sum_floats_nested(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    op_calls++;
    MPI_Barrier(MPI_COMM_SELF);
    for (int i = 0; i < *len; i++) ((float *)inout)[i] += ((float *)in)[i];
}

static jmp_buf escape;

static void longjmp_out(MPI_Comm *comm, int *err, ...)
{
    (void)comm;
    (void)err;
    longjmp(escape, 1);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char *mode = argc > 1 ? argv[1] : "loop";
    int n = argc > 2 ? atoi(argv[2]) : 1000;
    float s[2] = {1, 2}, r[2];
    if (strcmp(mode, "loop") == 0) {
        for (int i = 0; i < n; i++) MPI_Allreduce(s, r, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (strcmp(mode, "types") == 0) {
        static const int sizes[3] = {2, 6, 4};
        unsigned char a[3 * 6], b[3 * 6];
        memset(a, 1, sizeof a);
        MPI_Op op;
        MPI_Op_create(sum_bytes, 1, &op);
        MPI_Datatype prev = MPI_DATATYPE_NULL;
        int reused = 0;
        /* one collective per phase: consecutive calls have the same
         * (communicator, datatype handle, op) when the handle comes back */
        for (int phase = 0; phase < 2; phase++) {
            for (int i = 0; i < n; i++) {
                MPI_Datatype t;
                MPI_Type_contiguous(sizes[i % 3], MPI_BYTE, &t);
                MPI_Type_commit(&t);
                if (i > 0 && t == prev) reused++;
                prev = t;
                if (phase == 0) MPI_Bcast(a, 3, t, 0, MPI_COMM_WORLD);
                else MPI_Allreduce(a, b, 3, t, op, MPI_COMM_WORLD);
                MPI_Type_free(&t);
            }
        }
        MPI_Op_free(&op);
        if (rank == 0) printf("reused %d\n", reused);
    } else if (strcmp(mode, "nested") == 0) {
        MPI_Op op;
        MPI_Op_create(sum_floats_nested, 1, &op);
        for (int i = 0; i < n; i++) MPI_Allreduce(s, r, 2, MPI_FLOAT, op, MPI_COMM_WORLD);
        MPI_Op_free(&op);
        printf("op_calls %d %d\n", rank, op_calls);
    } else if (strcmp(mode, "abandon") == 0) {
        MPI_Errhandler eh;
        MPI_Comm_create_errhandler(longjmp_out, &eh);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, eh);
        MPI_Allreduce(s, r, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (setjmp(escape) == 0) MPI_Allreduce(s, r, -1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
        MPI_Errhandler_free(&eh);
        for (int i = 0; i < n; i++) MPI_Allreduce(s, r, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return 0;
}
