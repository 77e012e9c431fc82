/*
 * p2p.c -- point-to-point calls the profiler wraps, a known number of times
 * with known sizes, peers and tags, around a ring (right = rank + 1, left =
 * rank - 1; the size must be even).  tests/test_p2p.py holds the expected
 * records (P2P_PLAN there mirrors the steps below).  Usage: p2p N.  Prints
 * "RESULT OK" when every message arrived intact and every status the
 * program asked for says what MPI should, so the test also sees that the
 * profiler changed nothing the application sees.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                        \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "check failed line %d: %s\n", __LINE__, #c); \
            bad = 1;                                                    \
        }                                                               \
    } while (0)

/* MPI_STATUSES_IGNORE through a call: with MPICH's ((MPI_Status *)1) GCC's
 * -Wstringop-overflow sees a zero-sized array in the call itself. */
static __attribute__((noinline)) MPI_Status *statuses_ignore(void) { return MPI_STATUSES_IGNORE; }

/* A blocking send (MPI_Send or another mode) to `dest` and a receive from
 * `src`: even ranks send first, odd ranks receive first, so the ring of
 * blocking sends never waits on itself. */
typedef int (*send_fn)(const void *, int, MPI_Datatype, int, int, MPI_Comm);
static void exchange(int even, send_fn send, const void *sb, int scount, MPI_Datatype sdt,
                     int dest, int stag, void *rb, int rcount, MPI_Datatype rdt, int src,
                     int rtag, MPI_Comm w, MPI_Status *st)
{
    if (even) send(sb, scount, sdt, dest, stag, w);
    MPI_Recv(rb, rcount, rdt, src, rtag, w, st);
    if (!even) send(sb, scount, sdt, dest, stag, w);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int n = argc > 1 ? atoi(argv[1]) : 3;
    int rank, size, bad = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size % 2) {
        fprintf(stderr, "p2p: needs an even number of ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    const int even = rank % 2 == 0;
    MPI_Comm w = MPI_COMM_WORLD;
    int sb[256], rb[256];
    double ds[16], dr[16];
    MPI_Status st;
    MPI_Request rq[8], big[100];
    static char bsend_buf[MPI_BSEND_OVERHEAD + 64]; /* step 12's Bsend */
    MPI_Buffer_attach(bsend_buf, (int)sizeof bsend_buf);

    for (int it = 0; it < n; it++) {
        /* 1. Send 100 ints (400 B, tag 1); Recv posted for 200 (800 B): 400 arrive. */
        for (int i = 0; i < 100; i++) sb[i] = rank * 1000 + i;
        memset(rb, 0, sizeof rb);
        exchange(even, MPI_Send, sb, 100, MPI_INT, right, 1, rb, 200, MPI_INT, left, 1, w, &st);
        int got = -1;
        MPI_Get_count(&st, MPI_INT, &got);
        CHECK(got == 100 && st.MPI_SOURCE == left && st.MPI_TAG == 1);
        CHECK(rb[99] == left * 1000 + 99);

        /* 2. 10 doubles (80 B), tag 7 + sender; received with MPI_ANY_SOURCE,
         * MPI_ANY_TAG and MPI_STATUS_IGNORE. */
        for (int i = 0; i < 10; i++) ds[i] = rank + 0.5;
        exchange(even, MPI_Send, ds, 10, MPI_DOUBLE, right, 7 + rank, dr, 10, MPI_DOUBLE,
                 MPI_ANY_SOURCE, MPI_ANY_TAG, w, MPI_STATUS_IGNORE);
        CHECK(dr[9] == left + 0.5);

        /* 3. MPI_PROC_NULL: nothing moves; the status says so. */
        MPI_Send(sb, 5, MPI_INT, MPI_PROC_NULL, 3, w);
        MPI_Recv(rb, 5, MPI_INT, MPI_PROC_NULL, 3, w, &st);
        MPI_Get_count(&st, MPI_INT, &got);
        CHECK(st.MPI_SOURCE == MPI_PROC_NULL && st.MPI_TAG == MPI_ANY_TAG && got == 0);

        /* 4. Three Irecv + three Isend (32, 64, 128 B; tags 20..22), one Waitall
         * with MPI_STATUSES_IGNORE. */
        for (int k = 0; k < 3; k++) {
            MPI_Irecv(rb + 64 * k, 8 << k, MPI_INT, left, 20 + k, w, &rq[k]);
            for (int i = 0; i < (8 << k); i++) sb[64 * k + i] = rank + k;
        }
        for (int k = 0; k < 3; k++) MPI_Isend(sb + 64 * k, 8 << k, MPI_INT, right, 20 + k, w, &rq[3 + k]);
        MPI_Waitall(6, rq, statuses_ignore());
        CHECK(rb[0] == left && rb[128 + 31] == left + 2);

        /* 5. Testsome loop: two Irecv (64 B each; tag 30, MPI_ANY_TAG for the
         * second, sent with 31) and two Isend, statuses of the caller's. */
        {
            unsigned char *cs = (unsigned char *)sb, *cr = (unsigned char *)rb;
            memset(cs, rank + 1, 128);
            MPI_Irecv(cr, 64, MPI_BYTE, left, 30, w, &rq[0]);
            MPI_Irecv(cr + 64, 64, MPI_BYTE, left, MPI_ANY_TAG, w, &rq[1]);
            MPI_Isend(cs, 64, MPI_BYTE, right, 30, w, &rq[2]);
            MPI_Isend(cs + 64, 64, MPI_BYTE, right, 31, w, &rq[3]);
            int done = 0, outc = 0, idx[4];
            MPI_Status sts[4];
            while (done < 4) {
                MPI_Testsome(4, rq, &outc, idx, sts);
                if (outc == MPI_UNDEFINED) break;
                for (int i = 0; i < outc; i++)
                    if (idx[i] == 1) CHECK(sts[i].MPI_TAG == 31);
                done += outc;
            }
            CHECK(done == 4 && cr[127] == left + 1);
        }

        /* 6. Sendrecv: 4 ints to the right, 4 from the left, tag 40. */
        sb[0] = rank;
        MPI_Sendrecv(sb, 4, MPI_INT, right, 40, rb, 4, MPI_INT, left, 40, w, MPI_STATUS_IGNORE);
        CHECK(rb[0] == left);

        /* 7. Probe (MPI_ANY_SOURCE, tag 50) then Recv of what it found: 12 B. */
        if (even) {
            MPI_Send(sb, 12, MPI_BYTE, right, 50, w);
            MPI_Probe(MPI_ANY_SOURCE, 50, w, &st);
            MPI_Get_count(&st, MPI_BYTE, &got);
            MPI_Recv(rb, got, MPI_BYTE, st.MPI_SOURCE, 50, w, MPI_STATUS_IGNORE);
        } else {
            MPI_Probe(MPI_ANY_SOURCE, 50, w, &st);
            MPI_Get_count(&st, MPI_BYTE, &got);
            MPI_Recv(rb, got, MPI_BYTE, st.MPI_SOURCE, 50, w, MPI_STATUS_IGNORE);
            MPI_Send(sb, 12, MPI_BYTE, right, 50, w);
        }
        CHECK(got == 12 && st.MPI_SOURCE == left);

        /* 8. Iprobe until the message (6 B, tag 60) is there, then Recv; the
         * Isend completes with MPI_Wait. */
        MPI_Isend(sb, 6, MPI_BYTE, right, 60, w, &rq[0]);
        int flag = 0;
        while (!flag) MPI_Iprobe(left, 60, w, &flag, MPI_STATUS_IGNORE);
        MPI_Recv(rb, 6, MPI_BYTE, left, 60, w, MPI_STATUS_IGNORE);
        MPI_Wait(&rq[0], MPI_STATUS_IGNORE);

        /* 9. MPI_Test loop on an Irecv (8 B, tag 70, MPI_STATUS_IGNORE). */
        MPI_Irecv(rb, 2, MPI_INT, left, 70, w, &rq[0]);
        MPI_Isend(sb, 2, MPI_INT, right, 70, w, &rq[1]);
        flag = 0;
        while (!flag) MPI_Test(&rq[0], &flag, MPI_STATUS_IGNORE);
        MPI_Wait(&rq[1], &st);

        /* 10. Waitany over two Irecv (8 B, tags 80, 81); Testall for the sends. */
        MPI_Irecv(rb, 2, MPI_INT, left, 80, w, &rq[0]);
        MPI_Irecv(rb + 2, 2, MPI_INT, left, 81, w, &rq[1]);
        MPI_Isend(sb, 2, MPI_INT, right, 80, w, &rq[2]);
        MPI_Isend(sb, 2, MPI_INT, right, 81, w, &rq[3]);
        for (int k = 0; k < 2; k++) {
            int which = -1;
            MPI_Waitany(2, rq, &which, &st);
            CHECK(which == 0 || which == 1);
            CHECK(st.MPI_TAG == 80 + which && st.MPI_SOURCE == left);
        }
        flag = 0;
        while (!flag) MPI_Testall(2, rq + 2, &flag, statuses_ignore());

        /* 11. One Waitall over 100 requests (50 Irecv + 50 Isend of one int,
         * tag 90): more than the 64 the profiler once followed per call. */
        for (int k = 0; k < 50; k++) {
            MPI_Irecv(rb + k, 1, MPI_INT, left, 90, w, &big[k]);
            sb[100 + k] = rank * 100 + k;
        }
        for (int k = 0; k < 50; k++) MPI_Isend(sb + 100 + k, 1, MPI_INT, right, 90, w, &big[50 + k]);
        MPI_Waitall(100, big, statuses_ignore());
        CHECK(rb[0] == left * 100 && rb[49] == left * 100 + 49); /* in order: non-overtaking */

        /* 12. The other send modes (recorded as MPI_Send / MPI_Isend):
         * Ssend of 3 ints (tag 100) in the order of step 1; Rsend of 2 ints
         * (tag 101) to a receive posted before a 0-byte Sendrecv told that
         * the right neighbour has posted it (tag 102); Bsend of 4 ints
         * (tag 103) from the attached buffer; Issend of 2 ints (tag 104). */
        exchange(even, MPI_Ssend, sb, 3, MPI_INT, right, 100, rb, 3, MPI_INT, left, 100, w, &st);
        MPI_Irecv(rb, 2, MPI_INT, left, 101, w, &rq[0]);
        MPI_Sendrecv(NULL, 0, MPI_INT, left, 102, NULL, 0, MPI_INT, right, 102, w,
                     MPI_STATUS_IGNORE);
        MPI_Rsend(sb, 2, MPI_INT, right, 101, w);
        MPI_Wait(&rq[0], MPI_STATUS_IGNORE);
        MPI_Bsend(sb, 4, MPI_INT, right, 103, w);
        MPI_Recv(rb, 4, MPI_INT, left, 103, w, MPI_STATUS_IGNORE);
        MPI_Irecv(rb, 2, MPI_INT, left, 104, w, &rq[0]);
        MPI_Issend(sb, 2, MPI_INT, right, 104, w, &rq[1]);
        MPI_Waitall(2, rq, statuses_ignore());
    }

    /* A receive never completed: 4 ints from the left, tag 99, cancelled
     * and freed (the profiler records it with no_completion). */
    MPI_Irecv(rb, 4, MPI_INT, left, 99, w, &rq[0]);
    MPI_Cancel(&rq[0]);
    MPI_Request_free(&rq[0]);
    MPI_Barrier(w);

    void *detached;
    int detached_size;
    MPI_Buffer_detach(&detached, &detached_size); /* waits for the Bsends to leave */

    int all_bad = 0;
    MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_MAX, w);
    if (rank == 0) printf(all_bad ? "RESULT BAD\n" : "RESULT OK\n");
    MPI_Finalize();
    return 0;
}
