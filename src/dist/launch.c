// Launcher variables and the TCP rendezvous (launch.h).
//
// The rendezvous protocol, all integers little-endian u32/u64:
//   rank r > 0 -> rank 0:  magic, rank, world, bytes (u64), its block
//   rank 0 -> each rank:   magic, the world blocks in rank order
// Rank 0 checks that every joiner agrees on world and bytes and that no rank
// joins twice; every wait is bounded by the caller's timeout.
#include "dist/launch.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/check.h"
#include "util/clock.h"

#define LAUNCH_MAGIC 0x43454f4du // "MOEC"

const char *launch_kind_name(LaunchKind k) {
    switch (k) {
    case LAUNCH_MPI: return "mpirun";
    case LAUNCH_TORCHRUN: return "torchrun";
    case LAUNCH_SLURM: return "srun";
    default: return "single process";
    }
}

// A variable holding a non-negative integer: 1 when set (into *out), 0 when
// unset, -1 with a message when set to something else.
static int env_int(const char *name, int *out, char *err, size_t errlen) {
    const char *s = getenv(name);
    if (!s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < 0 || v > 1 << 30)
        return errorf(err, errlen, "%s='%s': expected a non-negative integer", name, s);
    *out = (int)v;
    return 1;
}

int launch_first_host(const char *nodelist, char *host, size_t hostlen) {
    size_t n = 0;
    const char *p = nodelist;
    if (!p || !*p) return -1;
    while (*p && *p != ',') {
        if (*p == '[') {
            // the first number of the bracket's first range, zero padding kept
            if (!n) return -1; // a host name starts with its prefix
            p++;
            if (*p < '0' || *p > '9') return -1;
            while (*p >= '0' && *p <= '9') {
                if (n + 1 >= hostlen) return -1;
                host[n++] = *p++;
            }
            while (*p && *p != ']') p++;
            if (*p != ']') return -1;
            p++;
            continue;
        }
        if (*p == ']') return -1;
        if (n + 1 >= hostlen) return -1;
        host[n++] = *p++;
    }
    host[n] = 0;
    return n ? 0 : -1;
}

int launch_detect(LaunchInfo *li, char *err, size_t errlen) {
    memset(li, 0, sizeof *li);
    li->world = 1;
    int rank = 0, world = 1, local = 0, r;
    if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE")) {
        int ompi = getenv("OMPI_COMM_WORLD_SIZE") != NULL;
        if (env_int(ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE", &world, err, errlen) < 0 ||
            env_int(ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK", &rank, err, errlen) < 0 ||
            env_int(ompi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID", &local, err, errlen) < 0)
            return -1;
        li->kind = LAUNCH_MPI;
    } else if (getenv("RANK") || getenv("WORLD_SIZE")) {
        if ((r = env_int("RANK", &rank, err, errlen)) < 0) return -1;
        if (!r) return errorf(err, errlen, "WORLD_SIZE is set but RANK is not (torchrun sets both)");
        if ((r = env_int("WORLD_SIZE", &world, err, errlen)) < 0) return -1;
        if (!r) return errorf(err, errlen, "RANK is set but WORLD_SIZE is not (torchrun sets both)");
        if (env_int("LOCAL_RANK", &local, err, errlen) < 0) return -1;
        li->kind = LAUNCH_TORCHRUN;
    } else if (getenv("SLURM_PROCID") && getenv("SLURM_NTASKS")) {
        if (env_int("SLURM_PROCID", &rank, err, errlen) < 0 || env_int("SLURM_NTASKS", &world, err, errlen) < 0 ||
            env_int("SLURM_LOCALID", &local, err, errlen) < 0)
            return -1;
        li->kind = LAUNCH_SLURM;
    } else {
        return 0;
    }
    if (world < 1) return errorf(err, errlen, "%s: the world size is %d", launch_kind_name(li->kind), world);
    if (rank >= world)
        return errorf(err, errlen, "%s: rank %d is outside a world of %d", launch_kind_name(li->kind), rank, world);
    li->rank = rank;
    li->world = world;
    li->local_rank = local;
    if (li->kind == LAUNCH_MPI || world == 1) return 0;
    // the rendezvous address
    const char *addr = getenv("MASTER_ADDR");
    if (addr && *addr) {
        if (strlen(addr) >= sizeof li->master_addr) return errorf(err, errlen, "MASTER_ADDR is too long");
        snprintf(li->master_addr, sizeof li->master_addr, "%s", addr);
    } else if (li->kind == LAUNCH_SLURM) {
        const char *nl = getenv("SLURM_JOB_NODELIST") ? getenv("SLURM_JOB_NODELIST") : getenv("SLURM_NODELIST");
        if (!nl) return errorf(err, errlen, "srun: neither MASTER_ADDR nor SLURM_JOB_NODELIST is set");
        if (launch_first_host(nl, li->master_addr, sizeof li->master_addr))
            return errorf(err, errlen, "SLURM_JOB_NODELIST='%s': cannot find its first host (set MASTER_ADDR)", nl);
    } else {
        return errorf(err, errlen, "torchrun-style launch (RANK=%d, WORLD_SIZE=%d) without MASTER_ADDR: set it to rank "
                      "0's host", rank, world);
    }
    int port = 0;
    if ((r = env_int("MASTER_PORT", &port, err, errlen)) < 0) return -1;
    if (!r) {
        int job = 0;
        if (li->kind != LAUNCH_SLURM)
            return errorf(err, errlen, "torchrun-style launch without MASTER_PORT: set it to a free port on %s",
                          li->master_addr);
        if (env_int("SLURM_JOB_ID", &job, err, errlen) < 0) return -1;
        port = 29500 + job % 1000;
    }
    if (port < 1 || port > 65535) return errorf(err, errlen, "MASTER_PORT=%d: expected a port in 1..65535", port);
    li->master_port = port;
    return 0;
}

// ---- TCP ---------------------------------------------------------------------------------------


// Waits until fd is ready for events or the deadline passes: 1 ready, 0 timeout, -1 error.
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - clock_now_s();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r > 0) return 1;
        if (r == 0) return 0;
        if (errno != EINTR) return -1;
    }
}

// All of buf, or -1 (err set) on timeout, a closed peer or an error.
static int send_all(int fd, const void *buf, size_t n, double deadline, const char *who, char *err, size_t errlen) {
    const char *p = buf;
    while (n) {
        int w = wait_fd(fd, POLLOUT, deadline);
        if (w <= 0) return errorf(err, errlen, "%s: %s", who, w ? strerror(errno) : "timed out sending");
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return errorf(err, errlen, "%s: send: %s", who, k ? strerror(errno) : "connection closed");
        p += k;
        n -= (size_t)k;
    }
    return 0;
}
static int recv_all(int fd, void *buf, size_t n, double deadline, const char *who, char *err, size_t errlen) {
    char *p = buf;
    while (n) {
        int w = wait_fd(fd, POLLIN, deadline);
        if (w <= 0) return errorf(err, errlen, "%s: %s", who, w ? strerror(errno) : "timed out waiting for data");
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return errorf(err, errlen, "%s: recv: %s", who, k ? strerror(errno) : "connection closed");
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

typedef struct {
    uint32_t magic, rank, world, pad;
    uint64_t bytes;
} Hello;

static int serve(const LaunchInfo *li, const void *mine, void *all, size_t bytes, double deadline, double timeout_s,
                 char *err, size_t errlen) {
    int W = li->world, rc = -1, ls = socket(AF_INET6, SOCK_STREAM, 0), v6 = 1;
    if (ls < 0) { ls = socket(AF_INET, SOCK_STREAM, 0); v6 = 0; }
    if (ls < 0) return errorf(err, errlen, "rank 0: socket: %s", strerror(errno));
    int *fds = mallocCheck(W * sizeof(int));
    for (int r = 0; r < W; r++) fds[r] = -1;
    int one = 1, zero = 0, joined = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    socklen_t salen;
    if (v6) {
        setsockopt(ls, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); // IPv4 too
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&sa;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons((uint16_t)li->master_port);
        salen = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&sa;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        a->sin_port = htons((uint16_t)li->master_port);
        salen = sizeof *a;
    }
    if (bind(ls, (struct sockaddr *)&sa, salen) || listen(ls, W)) {
        errorf(err, errlen, "rank 0: cannot listen on port %d (MASTER_PORT): %s", li->master_port, strerror(errno));
        goto done;
    }
    memcpy(all, mine, bytes);
    while (joined < W) {
        int w = wait_fd(ls, POLLIN, deadline);
        if (w <= 0) {
            int n = snprintf(err, errlen, "rank 0: only %d of %d ranks joined at port %d within %.0f s; missing:",
                             joined, W, li->master_port, timeout_s);
            for (int r = 1, shown = 0; r < W && n > 0 && (size_t)n < errlen; r++)
                if (fds[r] < 0 && shown++ < 16) n += snprintf(err + n, errlen - n, " %d", r);
            goto done;
        }
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            errorf(err, errlen, "rank 0: accept: %s", strerror(errno));
            goto done;
        }
        Hello h;
        if (recv_all(fd, &h, sizeof h, deadline, "rank 0", err, errlen)) { close(fd); goto done; }
        if (h.magic != LAUNCH_MAGIC) {
            close(fd); // not one of ours: someone else on the port
            continue;
        }
        if (h.world != (uint32_t)W || h.bytes != bytes || h.rank == 0 || h.rank >= (uint32_t)W || fds[h.rank] >= 0) {
            errorf(err, errlen, "rank 0: a process claiming rank %u of %u (%llu bytes) joined a world of %d (%zu "
                   "bytes)%s: two jobs on one MASTER_PORT, or inconsistent launcher variables?", h.rank, h.world,
                   (unsigned long long)h.bytes, W, bytes, h.rank < (uint32_t)W && h.rank && fds[h.rank] >= 0 ?
                   ", twice" : "");
            close(fd);
            goto done;
        }
        if (recv_all(fd, (char *)all + (size_t)h.rank * bytes, bytes, deadline, "rank 0", err, errlen)) {
            close(fd);
            goto done;
        }
        fds[h.rank] = fd;
        joined++;
    }
    uint32_t magic = LAUNCH_MAGIC;
    for (int r = 1; r < W; r++) {
        char who[32];
        snprintf(who, sizeof who, "rank 0 -> rank %d", r);
        if (send_all(fds[r], &magic, sizeof magic, deadline, who, err, errlen) ||
            send_all(fds[r], all, (size_t)W * bytes, deadline, who, err, errlen))
            goto done;
    }
    rc = 0;
done:
    for (int r = 1; r < W; r++)
        if (fds[r] >= 0) close(fds[r]);
    free(fds);
    close(ls);
    return rc;
}

static int join(const LaunchInfo *li, const void *mine, void *all, size_t bytes, double deadline, double timeout_s,
                char *err, size_t errlen) {
    char port[16], who[64], last[200] = "no attempt";
    snprintf(port, sizeof port, "%d", li->master_port);
    snprintf(who, sizeof who, "rank %d", li->rank);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(li->master_addr, port, &hints, &res);
    if (g) return errorf(err, errlen, "rank %d: MASTER_ADDR %s: %s", li->rank, li->master_addr, gai_strerror(g));
    int fd = -1;
    // rank 0 may not listen yet: retry until the deadline
    while (fd < 0 && clock_now_s() < deadline) {
        for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
            int s = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (s < 0) continue;
            if (connect(s, a->ai_addr, a->ai_addrlen) == 0) fd = s;
            else { snprintf(last, sizeof last, "%s", strerror(errno)); close(s); }
        }
        if (fd < 0) usleep(100 * 1000);
    }
    freeaddrinfo(res);
    if (fd < 0)
        return errorf(err, errlen, "rank %d: cannot reach rank 0 at %s:%d (MASTER_ADDR:MASTER_PORT) within %.0f s: %s",
                      li->rank, li->master_addr, li->master_port, timeout_s, last);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Hello h = {LAUNCH_MAGIC, (uint32_t)li->rank, (uint32_t)li->world, 0, bytes};
    uint32_t magic = 0;
    int rc = send_all(fd, &h, sizeof h, deadline, who, err, errlen) ||
             send_all(fd, mine, bytes, deadline, who, err, errlen) ||
             recv_all(fd, &magic, sizeof magic, deadline, who, err, errlen);
    if (!rc && magic != LAUNCH_MAGIC) rc = errorf(err, errlen, "rank %d: %s:%d answered, but not as a moecore rank 0",
                                                  li->rank, li->master_addr, li->master_port) != 0;
    if (!rc) rc = recv_all(fd, all, (size_t)li->world * bytes, deadline, who, err, errlen) != 0;
    close(fd);
    if (rc && strstr(err, "timed out"))
        snprintf(err + strlen(err), errlen - strlen(err), " (rank 0 at %s:%d waits for all %d ranks; %.0f s)",
                 li->master_addr, li->master_port, li->world, timeout_s);
    return rc ? -1 : 0;
}

int launch_allgather(const LaunchInfo *li, const void *mine, void *all, size_t bytes, double timeout_s, char *err,
                     size_t errlen) {
    if (li->world == 1) {
        memcpy(all, mine, bytes);
        return 0;
    }
    double deadline = clock_now_s() + timeout_s;
    return li->rank == 0 ? serve(li, mine, all, bytes, deadline, timeout_s, err, errlen)
                         : join(li, mine, all, bytes, deadline, timeout_s, err, errlen);
}
